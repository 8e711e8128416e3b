// Hugging Face Hub ids read from the local cache (core/hub_cache.h): the
// cache folder's environment variables, refs and snapshots as huggingface_hub
// lays them out, messages for what is missing, and the trainer and the CLI
// taking an id wherever they take a model folder.
#include "core/hub_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace anvil::hub {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::TempDir;

/// Sets an environment variable for a scope (unset when `value` is null).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// A cache holding Org/Tiny with refs main and v1 pointing at two snapshots.
stdfs::path make_cache(const stdfs::path& root) {
  const auto repo = root / "models--Org--Tiny";
  for (const char* h : {"1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222"})
    stdfs::create_directories(repo / "snapshots" / h);
  stdfs::create_directories(repo / "refs");
  anvil::testing::write_text(repo / "refs" / "main", "1111111111111111111111111111111111111111");
  anvil::testing::write_text(repo / "refs" / "v1", "2222222222222222222222222222222222222222\n");
  return repo;
}

TEST(HubCache, TheCacheFolderFollowsHuggingFaceHubsVariables) {
  ScopedEnv a("HF_HUB_CACHE", nullptr), b("HUGGINGFACE_HUB_CACHE", nullptr), c("HF_HOME", nullptr),
      d("XDG_CACHE_HOME", nullptr), e("HOME", "/home/u");
  EXPECT_EQ(cache_dir(), "/home/u/.cache/huggingface/hub");
  ScopedEnv x("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(cache_dir(), "/xdg/huggingface/hub");
  ScopedEnv h("HF_HOME", "/hf");
  EXPECT_EQ(cache_dir(), "/hf/hub");
  ScopedEnv l("HUGGINGFACE_HUB_CACHE", "/legacy");
  EXPECT_EQ(cache_dir(), "/legacy");
  ScopedEnv n("HF_HUB_CACHE", "/new");
  EXPECT_EQ(cache_dir(), "/new");
}

TEST(HubCache, IdsResolveToTheirSnapshotsAndFoldersToThemselves) {
  TempDir dir;
  const auto repo = make_cache(dir / "hub");
  ScopedEnv env("HF_HUB_CACHE", (dir / "hub").c_str());
  EXPECT_TRUE(is_repo_id("Qwen/Qwen2.5-0.5B-Instruct"));
  EXPECT_TRUE(is_repo_id("Org/Tiny@v1"));
  for (const char* not_id : {"Tiny", "a/b/c", "/abs/path", "./x/y", "Org/.hidden", "Org/a--b", "Org/x@"})
    EXPECT_FALSE(is_repo_id(not_id)) << not_id;
  EXPECT_EQ(resolve("Org/Tiny"), repo / "snapshots" / "1111111111111111111111111111111111111111");
  EXPECT_EQ(resolve("Org/Tiny@v1"), repo / "snapshots" / "2222222222222222222222222222222222222222");
  EXPECT_EQ(resolve("Org/Tiny@2222222222222222222222222222222222222222"),
            repo / "snapshots" / "2222222222222222222222222222222222222222");
  EXPECT_FALSE(resolve("Org/Tiny@v2").has_value());
  EXPECT_FALSE(resolve("Org/Other").has_value());
  // A folder that exists is itself, even when it looks like an id.
  stdfs::create_directories(dir / "Org" / "Tiny");
  EXPECT_EQ(resolve((dir / "Org" / "Tiny").string()), dir / "Org" / "Tiny");
  EXPECT_EQ(local_path("no/where"), "no/where");

  const auto missing = explain_missing("Org/Other");
  EXPECT_NE(missing.find("no " + (dir / "hub" / "models--Org--Other").string()), std::string::npos) << missing;
  EXPECT_NE(missing.find("`huggingface-cli download Org/Other`"), std::string::npos) << missing;
  const auto no_rev = explain_missing("Org/Tiny@v2");
  EXPECT_NE(no_rev.find("has no snapshot for revision \"v2\""), std::string::npos) << no_rev;
  EXPECT_NE(no_rev.find("main"), std::string::npos) << no_rev;
  EXPECT_NE(no_rev.find("`huggingface-cli download Org/Tiny --revision v2`"), std::string::npos) << no_rev;
}

// A model trained here and placed in a cache as huggingface-cli would place
// it: the trainer starts from `model.from: Org/Tiny` (its tokenizer too),
// LoRA records the id as PEFT does, the CLI takes the id for --model, and a
// missing id stops the run before anything starts, naming the download command.
TEST(HubCache, TrainerAndCliTakeAnIdWhereTheyTakeAFolder) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  const auto base = "cd " + src + " && " + anvil::testing::trainer_bin() +
                    " --config configs/quickstart.yaml --config configs/models/llama-debug.yaml train.threads=1 "
                    "eval.generate_samples=0 logging.level=warn schedule.warmup_steps=0 ";
  ASSERT_EQ(anvil::testing::run(base + "train.max_steps=1 output_dir=" + (dir / "run").string() + " 2>&1", &out), 0)
      << out;
  const auto snapshot = dir / "hub" / "models--Org--Tiny" / "snapshots" / "abc123";
  stdfs::create_directories(snapshot.parent_path());
  stdfs::copy(dir / "run" / "checkpoint-1", snapshot, stdfs::copy_options::recursive);
  stdfs::create_directories(dir / "hub" / "models--Org--Tiny" / "refs");
  anvil::testing::write_text(dir / "hub" / "models--Org--Tiny" / "refs" / "main", "abc123");
  const auto env = "HF_HUB_CACHE=" + (dir / "hub").string() + " ";

  // Keys that name a shape may not be set beside model.from: start from the SFT recipe without a model section.
  anvil::testing::write_text(dir / "from.yaml", R"(
algorithm: sft
tokenizer: {path: ""}
model: {from: Org/Tiny}
data: {train: [{path: data/sft_add_train.jsonl}], max_length: 32}
train: {max_steps: 1, micro_batch_size: 4, global_batch_size: 4, threads: 1}
lora: {r: 2, alpha: 4}
logging: {level: warn}
)");
  ASSERT_EQ(anvil::testing::run("cd " + src + " && " + env + anvil::testing::trainer_bin() + " --config " +
                                    (dir / "from.yaml").string() + " output_dir=" + (dir / "lora").string() + " 2>&1",
                                &out),
            0)
      << out;
  const auto adapter =
      nlohmann::json::parse(anvil::testing::read_text(dir / "lora" / "checkpoint-1" / "adapter_config.json"));
  EXPECT_EQ(adapter["base_model_name_or_path"], "Org/Tiny");
  // The adapter's base resolves through the cache when it is loaded again.
  anvil::testing::write_text(dir / "ids.json", "[[5, 6, 7]]");
  ASSERT_EQ(
      anvil::testing::run(env + anvil::testing::cli_bin() + " logits --model " +
                              (dir / "lora" / "checkpoint-1").string() + " --input " + (dir / "ids.json").string() +
                              " --output " + (dir / "a.safetensors").string() + " 2>&1",
                          &out),
      0)
      << out;
  ASSERT_EQ(
      anvil::testing::run(env + anvil::testing::cli_bin() + " logits --model Org/Tiny --input " +
                              (dir / "ids.json").string() + " --output " + (dir / "b.safetensors").string() + " 2>&1",
                          &out),
      0)
      << out;

  EXPECT_NE(anvil::testing::run("cd " + src + " && " + env + anvil::testing::trainer_bin() + " --config " +
                                    (dir / "from.yaml").string() +
                                    " model.from=Org/Missing output_dir=" + (dir / "missing").string() + " 2>&1",
                                &out),
            0);
  EXPECT_NE(out.find("model.from: expected an existing model folder, got \"Org/Missing\""), std::string::npos) << out;
  EXPECT_NE(out.find("nor a Hugging Face model id in the local cache"), std::string::npos) << out;
  EXPECT_NE(out.find("huggingface-cli download Org/Missing"), std::string::npos) << out;
  EXPECT_FALSE(stdfs::exists(dir / "missing" / "checkpoint-1"));
  EXPECT_NE(anvil::testing::run(env + anvil::testing::cli_bin() + " logits --model Org/Missing --input " +
                                    (dir / "ids.json").string() + " --output x.safetensors 2>&1",
                                &out),
            0);
  EXPECT_NE(out.find("huggingface-cli download Org/Missing"), std::string::npos) << out;
}

}  // namespace
}  // namespace anvil::hub
