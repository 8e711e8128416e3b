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

// train.overlap_step_reads (the default on one process): a step is queued
// whole, skipped on the device when it is not finite, and read once the next
// step is queued. Its lines, counts and checkpoints (weights, AdamW moments
// and step counts) are those of reading each step at once, skipped steps
// included: the first (no AdamW state yet), one read while the next step runs
// (3 and 7) and one read at a save (4).
// Both engines: the plain one, and the sharded one on one rank with the
// decoupled weight decay it applies itself.
class OverlappedSteps : public ::testing::TestWithParam<std::string> {};

TEST_P(OverlappedSteps, EqualReadingEachStepAtOnceWithSkippedSteps) {
  const std::string faults = "ANVIL_TEST_NONFINITE=grad@1,loss@3,grad@4,loss@7 ";
  const std::string extra = "train.on_nonfinite=skip train.log_every=1 " + GetParam();
  TempDir late, now;
  train::Run a, b;
  a.rc = anvil::testing::train_in(late, anvil::testing::tiny_sft_run(8, 4), extra, &a.log, faults);
  b.rc = anvil::testing::train_in(now, anvil::testing::tiny_sft_run(8, 4), extra + " train.overlap_step_reads=false",
                                  &b.log, faults);
  ASSERT_EQ(a.rc, 0) << a.log;
  ASSERT_EQ(b.rc, 0) << b.log;
  EXPECT_NE(a.log.find("each step read while the next runs"), std::string::npos) << a.log;
  EXPECT_EQ(b.log.find("each step read while the next runs"), std::string::npos) << b.log;
  for (const auto* warning :
       {"step 1: the gradient norm is nan; step skipped (1 so far)", "step 3: the loss is inf; step skipped (2 so far)",
        "step 4: the gradient norm is nan; step skipped (3 so far)",
        "step 7: the loss is inf; step skipped (4 so far)"}) {
    EXPECT_NE(a.log.find(warning), std::string::npos) << warning << "\n" << a.log;
    EXPECT_NE(b.log.find(warning), std::string::npos) << warning << "\n" << b.log;
  }
  const auto ma = metrics(late / "out" / "metrics.jsonl"), mb = metrics(now / "out" / "metrics.jsonl");
  ASSERT_EQ(ma.size(), 8u);
  ASSERT_EQ(mb.size(), 8u);
  for (size_t i = 0; i < ma.size(); ++i) {
    EXPECT_EQ(ma[i]["step"], mb[i]["step"]);
    for (const auto* key : {"loss", "grad_norm", "lr", "num_targets", "nonfinite_steps"})
      EXPECT_EQ(ma[i][key].dump(), mb[i][key].dump()) << "step " << i + 1 << " " << key;
    std::vector<std::string> ka, kb;  // time/...: a background write's time joins whichever line follows it
    for (const auto& [k, v] : ma[i].items())
      if (k.rfind("time/", 0) != 0) ka.push_back(k);
    for (const auto& [k, v] : mb[i].items())
      if (k.rfind("time/", 0) != 0) kb.push_back(k);
    EXPECT_EQ(ka, kb) << "step " << i + 1;
  }
  // Steps 5, 6 and 8 trained: the runs did not stand still.
  EXPECT_NE(ma[4]["loss"].dump(), ma[5]["loss"].dump());
  std::string out;
  for (const auto* step : {"checkpoint-4", "checkpoint-8"}) {
    for (const auto* file : {"model.safetensors", "optimizer.safetensors", "optimizer.json"})
      EXPECT_EQ(run("cmp " + (late / "out" / step / file).string() + " " + (now / "out" / step / file).string(), &out),
                0)
          << step << "/" << file << ": " << out;
    const auto sa = nlohmann::json::parse(anvil::testing::read_text(late / "out" / step / "trainer_state.json"));
    const auto sb = nlohmann::json::parse(anvil::testing::read_text(now / "out" / step / "trainer_state.json"));
    EXPECT_EQ(sa["nonfinite_steps"], sb["nonfinite_steps"]) << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, OverlappedSteps,
                         ::testing::Values("", "dist.sharding=full_shard optimizer.weight_decay=0.1"),
                         [](const auto& info) { return info.param.empty() ? "plain" : "sharded_one_rank"; });

// train.cuda_graphs on the CPU, through ANVIL_TEST_CUDA_GRAPHS=emulate (the
// recorded step's function is called at each "replay"): the graph's input
// buffers, its device scalars (loss scale, learning rate), gradients zeroed in
// place and the host's count of each replayed AdamW step give the eager run's
// lines and checkpoint bytes. Packed rows have one shape, so every step after
// the warm-up replays one graph; rows padded to a multiple of 8 record one
// graph per length and replay them in turn, sharing one set of gradients.
// Step 6's injected fault runs it eagerly (zeroing the graphs' gradients in
// place) and skipped. bf16 parameters (dist.param_dtype) train through the
// sharded engine on one process, with its own decoupled weight decay. The learning rate is a power of 2, which the
// graph's float32 copy holds exactly.
class GraphedSteps : public ::testing::TestWithParam<std::string> {};

TEST_P(GraphedSteps, EmulatedReplaysEqualEagerSteps) {
  const std::string faults = "ANVIL_TEST_NONFINITE=grad@6 ";
  const std::string extra =
      "train.on_nonfinite=skip train.log_every=1 optimizer.lr=0.015625 schedule.decay=constant " + GetParam();
  TempDir graphed, eager;
  train::Run a, b;
  a.rc = anvil::testing::train_in(graphed, anvil::testing::tiny_sft_run(8, 4), extra + " train.cuda_graphs=on", &a.log,
                                  faults + "ANVIL_TEST_CUDA_GRAPHS=emulate ");
  b.rc = anvil::testing::train_in(eager, anvil::testing::tiny_sft_run(8, 4), extra + " train.cuda_graphs=off", &b.log,
                                  faults);
  ASSERT_EQ(a.rc, 0) << a.log;
  ASSERT_EQ(b.rc, 0) << b.log;
  EXPECT_NE(a.log.find("train.cuda_graphs: step 3 recorded as CUDA graph 1;"), std::string::npos) << a.log;
  // Packed rows have one shape; rows padded to a multiple of 8 (a sample is at most 32 tokens) several.
  const bool packed = GetParam().find("packing") != std::string::npos;
  EXPECT_EQ(a.log.find("recorded as CUDA graph 2;") != std::string::npos, !packed) << a.log;
  EXPECT_EQ(b.log.find("recorded as CUDA graph"), std::string::npos) << b.log;
  const auto ma = metrics(graphed / "out" / "metrics.jsonl"), mb = metrics(eager / "out" / "metrics.jsonl");
  ASSERT_EQ(ma.size(), 8u);
  ASSERT_EQ(mb.size(), 8u);
  for (size_t i = 0; i < ma.size(); ++i)
    for (const auto* key : {"loss", "grad_norm", "lr", "num_targets", "nonfinite_steps"})
      EXPECT_EQ(ma[i][key].dump(), mb[i][key].dump()) << "step " << i + 1 << " " << key;
  EXPECT_EQ(ma[5]["nonfinite_steps"].get<double>(), 1.0);
  std::string out;
  for (const auto* step : {"checkpoint-4", "checkpoint-8"})
    for (const auto* file : {"model.safetensors", "optimizer.safetensors", "optimizer.json"})
      EXPECT_EQ(
          run("cmp " + (graphed / "out" / step / file).string() + " " + (eager / "out" / step / file).string(), &out),
          0)
          << step << "/" << file << ": " << out;
}

INSTANTIATE_TEST_SUITE_P(Rows, GraphedSteps,
                         ::testing::Values("data.packing=true data.max_length=32", "data.pad_to_multiple_of=8",
                                           "data.packing=true data.max_length=32 dist.param_dtype=bfloat16 "
                                           "optimizer.weight_decay=0.1"),
                         [](const auto& info) {
                           if (info.param.find("bfloat16") != std::string::npos) return "packed_bf16_params";
                           return info.param.find("packing") != std::string::npos ? "packed" : "padded";
                         });

// train.cuda_graphs: on where no graph can be recorded is a configuration
// error naming why (on the CPU; under ANVIL_TEST_CUDA_GRAPHS=emulate, the
// sharded engine, steps read at once, activation checkpointing); auto there
// trains eagerly without a word on the CPU.
TEST(GraphedStepsRefused, OnNamesWhyAutoTrainsEagerly) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "the device is cpu"},
      {"dist.sharding=full_shard", "dist.sharding is full_shard: its gathers free and refill parameter storage"},
      {"train.overlap_step_reads=false", "each step is read before the next is queued"},
      {"train.activation_checkpointing=true", "train.activation_checkpointing is on"}};
  for (const auto& [extra, why] : cases) {
    TempDir dir;
    std::string log;
    const std::string env = *extra ? "ANVIL_TEST_CUDA_GRAPHS=emulate " : "";
    EXPECT_NE(anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(2, 0),
                                       std::string("train.cuda_graphs=on ") + extra, &log, env),
              0)
        << extra;
    EXPECT_NE(log.find(std::string("train.cuda_graphs: on, but ") + why), std::string::npos) << extra << "\n" << log;
  }
  TempDir automatic;
  std::string log;
  EXPECT_EQ(anvil::testing::train_in(automatic, anvil::testing::tiny_sft_run(2, 0), "train.cuda_graphs=auto", &log), 0)
      << log;
  EXPECT_EQ(log.find("cuda_graphs"), std::string::npos) << log;
}

// Overlapped, a non-finite step under on_nonfinite: stop is found while the
// next step runs: the run stops naming it, and nothing after the last
// checkpoint is saved or logged.
TEST(OverlappedStepsStop, NamesTheStepFoundWhileTheNextRuns) {
  TempDir dir;
  std::string log;
  const int rc = anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(8, 4), "train.log_every=1", &log,
                                          "ANVIL_TEST_NONFINITE=grad@6 ");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("each step read while the next runs"), std::string::npos) << log;
  EXPECT_NE(log.find("step 6: the gradient norm is nan (not finite); the step was not applied and nothing was saved "
                     "from it; the last checkpoint, " +
                     (dir / "out" / "checkpoint-4").string() + ", is as it was"),
            std::string::npos)
      << log;
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-8"));
  EXPECT_EQ(metrics(dir / "out" / "metrics.jsonl").back()["step"].get<int64_t>(), 5);
}

}  // namespace
}  // namespace anvil::train
