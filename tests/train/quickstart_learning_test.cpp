// The quickstart config, shortened, must learn: held-out exact-match accuracy
// of greedy answers on eval prompts the model never saw.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace anvil::train {
namespace {

TEST(QuickstartLearning, ShortenedQuickstartReachesHeldOutAccuracy) {
  anvil::testing::TempDir dir;
  std::string out;
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                   " --config configs/quickstart.yaml output_dir=" + dir.path().string() +
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
