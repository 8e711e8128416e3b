// The non-finite guard: a step whose loss or gradient norm is NaN/inf is never
// applied. `stop` exits non-zero naming the step and the quantity and leaves
// the last checkpoint as it was; `skip` drops the step, counts it and goes on,
// up to train.max_nonfinite_in_a_row. Faults come from the trainer's testing
// hook ANVIL_TEST_NONFINITE (docs/reliability.md). The 2-rank sharded cases
// are in tests/distributed/sharding_test.cpp (DistRuns).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

struct Run {
  int rc;
  std::string log;
};

Run train(const TempDir& dir, const std::string& faults, const std::string& extra = "") {
  Run r;
  r.rc = anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(6, 2), extra, &r.log,
                                  "ANVIL_TEST_NONFINITE=" + faults + " ");
  return r;
}

std::vector<nlohmann::json> metrics(const stdfs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(NonFinite, StopNamesTheStepAndKeepsTheLastCheckpoint) {
  TempDir dir;
  const auto r = train(dir, "loss@5");
  EXPECT_NE(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("step 5: the loss is inf (not finite); the step was not applied and nothing was saved "
                       "from it; the last checkpoint, " +
                       (dir / "out" / "checkpoint-4").string() + ", is as it was"),
            std::string::npos)
      << r.log;
  EXPECT_TRUE(stdfs::exists(dir / "out" / "checkpoint-4" / "trainer_state.json"));
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-5"));
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-6"));
  EXPECT_EQ(metrics(dir / "out" / "metrics.jsonl").back()["step"].get<int64_t>(), 4);
  // The kept checkpoint resumes: without the fault the run finishes.
  const auto again = train(dir, "");
  EXPECT_EQ(again.rc, 0) << again.log;
  EXPECT_NE(again.log.find("resumed from"), std::string::npos) << again.log;
  EXPECT_TRUE(stdfs::exists(dir / "out" / "checkpoint-6"));
}

TEST(NonFinite, StopOnANonFiniteGradientNorm) {
  TempDir dir;
  const auto r = train(dir, "grad@1");
  EXPECT_NE(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("step 1: the gradient norm is nan (not finite)"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("no checkpoint was written"), std::string::npos) << r.log;
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-2"));
}

TEST(NonFinite, SkipDropsTheStepAndCountsIt) {
  TempDir dir;
  const auto r = train(dir, "loss@3,grad@4", "train.on_nonfinite=skip train.save_every=1");
  ASSERT_EQ(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("step 3: the loss is inf; step skipped (1 so far)"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("step 4: the gradient norm is nan; step skipped (2 so far)"), std::string::npos) << r.log;
  const auto m = metrics(dir / "out" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 6u);
  const std::vector<int64_t> counts = {0, 0, 1, 2, 2, 2};
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["nonfinite_steps"].get<int64_t>(), counts[i]) << m[i];
  // Never applied: the weights after steps 3 and 4 are those after step 2; step 5 trains again.
  std::string out;
  const auto model = [&](int step) {
    return (dir / "out" / ("checkpoint-" + std::to_string(step)) / "model.safetensors").string();
  };
  EXPECT_EQ(run("cmp " + model(2) + " " + model(3), &out), 0) << out;
  EXPECT_EQ(run("cmp " + model(2) + " " + model(4), &out), 0) << out;
  EXPECT_NE(run("cmp -s " + model(4) + " " + model(5), &out), 0);
  // The count is part of the trainer state, so a resumed run continues it.
  const auto state =
      nlohmann::json::parse(anvil::testing::read_text(dir / "out" / "checkpoint-6" / "trainer_state.json"));
  EXPECT_EQ(state["nonfinite_steps"].get<int64_t>(), 2);
}

TEST(NonFinite, SkipStopsAfterTooManyInARow) {
  TempDir dir;
  const auto r = train(dir, "grad@3,grad@4", "train.on_nonfinite=skip train.max_nonfinite_in_a_row=2");
  EXPECT_NE(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("step 4: 2 non-finite steps in a row (the gradient norm is nan; "
                       "train.max_nonfinite_in_a_row is 2); stopping without saving; the last checkpoint, " +
                       (dir / "out" / "checkpoint-2").string() + ", is as it was"),
            std::string::npos)
      << r.log;
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-4"));
}

}  // namespace
}  // namespace anvil::train
