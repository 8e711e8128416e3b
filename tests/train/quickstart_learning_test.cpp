// The quickstart config, shortened, must learn: held-out exact-match accuracy
// of greedy answers on eval prompts the model never saw. Its checkpoint is the
// ctest fixture the preference-learning tests start from.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace anvil::train {
namespace {

TEST(QuickstartLearning, ShortenedQuickstartReachesHeldOutAccuracy) {
  // Kept in the build tree: the preference-learning tests start from this checkpoint.
  const auto dir = std::filesystem::path(ANVIL_FIXTURE_DIR) / "quickstart-sft";
  std::filesystem::remove_all(dir);
  std::string out;
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                   " --config configs/quickstart.yaml output_dir=" + dir.string() +
                   " train.max_steps=1000 train.eval_every=0 train.save_every=0 eval.generate_samples=200";
  ASSERT_EQ(anvil::testing::run(cmd, &out), 0) << out;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const auto m = nlohmann::json::parse(last);
  ASSERT_TRUE(m.contains("eval/exact_match")) << last;
  EXPECT_GE(m["eval/exact_match"].get<double>(), 0.45) << out;
  EXPECT_LT(m["eval/loss"].get<double>(), 0.35) << last;
}

}  // namespace
}  // namespace anvil::train
