// The quickstart, exactly as scripts/quickstart.sh runs it, must learn:
// held-out exact-match accuracy of greedy answers on eval prompts the model
// never saw. Its checkpoint is the ctest fixture the preference-learning tests
// start from (its checkpoint-1000, as configs/rm_tiny.yaml and dpo_tiny.yaml
// name). It runs on one thread, so that beside the rest of the suite
// (ctest -j 2) it has a core of its own. The trained run is cached by content:
// it is kept in the build tree beside a key made of the command, the config,
// the data, the tokenizer and the binaries that trained it, and trained again
// only when one of them changed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "anvil/config/config.h"
#include "test_util.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::run;

std::string content_key(const std::string& cmd) {
  const auto bin = stdfs::path(anvil::testing::trainer_bin());
  std::string out;
  const auto sums = "cd " + anvil::testing::source_dir() +
                    " && sha256sum configs/quickstart.yaml data/sft_train.jsonl data/sft_eval.jsonl "
                    "data/tokenizer.model " +
                    bin.string() + " " + (bin.parent_path().parent_path() / "lib").string() + "/libanvil.so*";
  EXPECT_EQ(run(sums, &out), 0) << out;
  return cmd + "\n" + out;
}

TEST(QuickstartLearning, QuickstartReachesHeldOutAccuracy) {
  const auto dir = anvil::testing::fixture_dir() / "quickstart-sft";
  const auto key_file = anvil::testing::fixture_dir() / "quickstart-sft.key";
  const auto cfg = anvil::config::load_config({anvil::testing::source_dir() + "/configs/quickstart.yaml"}, {});
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                   " --config configs/quickstart.yaml output_dir=" + dir.string() + " train.threads=1";
  const auto key = content_key(cmd);
  std::string out;
  if (!stdfs::exists(key_file) || anvil::testing::read_text(key_file) != key) {
    stdfs::remove(key_file);
    stdfs::remove_all(dir);
    ASSERT_EQ(run(cmd, &out), 0) << out;
    anvil::testing::write_text(key_file, key);
  } else {
    std::cout << "[quickstart] cached run in " << dir << " (same config, data and binaries)\n";
  }
  ASSERT_TRUE(stdfs::exists(dir / ("checkpoint-" + std::to_string(cfg.train.max_steps))));
  std::ifstream in(dir / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const auto m = nlohmann::json::parse(last);
  ASSERT_TRUE(m.contains("eval/exact_match")) << last;
  EXPECT_EQ(m["step"].get<int64_t>(), cfg.train.max_steps) << last;
  std::cout << "[quickstart] held-out exact match " << m["eval/exact_match"].get<double>() << ", eval loss "
            << m["eval/loss"].get<double>() << "\n";
  // 400 held-out prompts, a quarter of them additions: 0.85 needs addition.
  anvil::testing::record_figure("held-out exact match", m["eval/exact_match"].get<double>(), 0.0, 0.85);
  EXPECT_GE(m["eval/exact_match"].get<double>(), 0.85) << out;
}

}  // namespace
}  // namespace anvil::train
