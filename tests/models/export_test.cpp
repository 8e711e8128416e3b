// Export round trip per family: train a few steps, `anvil export`, load the
// folder in transformers (tests/parity/logits_in_transformers.py) and compare
// its logits with `anvil logits`.
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "test_util.h"

namespace anvil::checkpoint {
namespace {
using io::SafetensorsFile;

using anvil::testing::run;

TEST(Export, TrainedModelsOfEveryFamilyLoadInTransformersWithTheSameLogits) {
  anvil::testing::TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out, exports;
  for (const auto& flavor : anvil::testing::debug_flavors()) {
    SCOPED_TRACE(flavor);
    const auto run_dir = dir / ("run-" + flavor);
    const auto train = "cd " + src + " && " + anvil::testing::trainer_bin() +
                       " --config configs/quickstart.yaml --config configs/models/" + flavor +
                       ".yaml output_dir=" + run_dir.string() +
                       " train.max_steps=3 schedule.warmup_steps=1 eval.generate_samples=0 train.threads=1 "
                       "logging.level=warn";
    ASSERT_EQ(run(train, &out), 0) << out;
    const auto exported = dir / ("export-" + flavor);
    ASSERT_EQ(run(anvil::testing::cli_bin() + " export --checkpoint " + (run_dir / "checkpoint-3").string() +
                      " --output " + exported.string(),
                  &out),
              0)
        << out;
    // A standalone folder: model, config, generation config and tokenizer, no trainer state.
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.model"})
      EXPECT_TRUE(std::filesystem::exists(exported / f)) << f;
    EXPECT_FALSE(std::filesystem::exists(exported / "optimizer.safetensors"));
    EXPECT_FALSE(std::filesystem::exists(exported / "optimizer.json"));
    exports += " " + exported.string();
  }
  const auto cmd = anvil::testing::python_bin() + " " + src + "/tests/parity/logits_in_transformers.py " +
                   anvil::testing::cli_bin() + " " + dir.path().string() + exports;
  ASSERT_EQ(run(cmd, &out), 0) << out;
  EXPECT_NE(out.find("transformers parity OK"), std::string::npos) << out;
}

TEST(Export, Bfloat16ExportAndRefusalToOverwrite) {
  anvil::testing::TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  const auto train = "cd " + src + " && " + anvil::testing::trainer_bin() +
                     " --config configs/quickstart.yaml --config configs/models/llama-debug.yaml output_dir=" +
                     (dir / "run").string() +
                     " train.max_steps=1 schedule.warmup_steps=0 eval.generate_samples=0 train.threads=1 "
                     "logging.level=warn";
  ASSERT_EQ(run(train, &out), 0) << out;
  const auto ckpt = (dir / "run" / "checkpoint-1").string();
  const auto bf16 = dir / "bf16";
  ASSERT_EQ(run(anvil::testing::cli_bin() + " export --checkpoint " + ckpt + " --output " + bf16.string() +
                    " --dtype bfloat16",
                &out),
            0)
      << out;
  SafetensorsFile f(bf16 / "model.safetensors");
  EXPECT_EQ(f.get("model.norm.weight").scalar_type(), at::kBFloat16);
  EXPECT_NE(anvil::testing::read_text(bf16 / "config.json").find("\"bfloat16\""), std::string::npos);
  // bf16 weights load back (converted to the model's float32).
  anvil::testing::write_text(dir / "ids.json", "[[1, 2, 3]]");
  ASSERT_EQ(run(anvil::testing::cli_bin() + " logits --model " + bf16.string() + " --input " +
                    (dir / "ids.json").string() + " --output " + (dir / "l.safetensors").string(),
                &out),
            0)
      << out;
  EXPECT_EQ(SafetensorsFile(dir / "l.safetensors").get("logits").sizes(), at::IntArrayRef({1, 3, 326}));

  // An existing non-empty folder is never overwritten; nothing half-written is left.
  EXPECT_EQ(run(anvil::testing::cli_bin() + " export --checkpoint " + ckpt + " --output " + bf16.string(), &out), 2);
  EXPECT_NE(out.find("already exists and is not an empty folder"), std::string::npos) << out;
  EXPECT_EQ(run(anvil::testing::cli_bin() + " export --checkpoint " + ckpt + " --output " + (dir / "x").string() +
                    " --dtype int8",
                &out),
            2);
  EXPECT_NE(out.find("--dtype: expected float32, bfloat16 or float16, got \"int8\""), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
}

}  // namespace
}  // namespace anvil::checkpoint
