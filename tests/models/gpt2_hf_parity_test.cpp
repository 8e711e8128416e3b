// Runs tests/parity/gpt2_hf_parity.py: transformers is the reference.
#include <gtest/gtest.h>

#include "test_util.h"

namespace anvil::models {
namespace {

TEST(GPT2HfParity, LogitsMatchTransformersAndCheckpointsLoadInTransformers) {
  anvil::testing::TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  // A short training run gives a real Anvil checkpoint to hand to transformers.
  const auto train = "cd " + src + " && " + anvil::testing::trainer_bin() +
                     " --config configs/quickstart.yaml output_dir=" + (dir / "run").string() +
                     " train.max_steps=3 schedule.warmup_steps=1 eval.generate_samples=0 train.threads=1 logging.level=warn";
  ASSERT_EQ(anvil::testing::run(train, &out), 0) << out;
  const auto cmd = "cd " + src + " && " + anvil::testing::python_bin() + " tests/parity/gpt2_hf_parity.py " +
                   anvil::testing::cli_bin() + " " + dir.path().string() + " " + (dir / "run" / "checkpoint-3").string();
  ASSERT_EQ(anvil::testing::run(cmd, &out), 0) << out;
  EXPECT_NE(out.find("parity OK"), std::string::npos) << out;
}

}  // namespace
}  // namespace anvil::models
