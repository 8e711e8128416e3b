// train.profile_steps: a tiny run on the CPU writes output_dir/profile/ (a
// Chrome trace and its summary); the summary's arithmetic on a made-up GPU
// trace (kernel time, busy fraction, launches and syncs per step); the key's
// checks. The GPU path runs in bench/gpu/run.sh's `profile` section.
#include "train/step_profiler.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::read_text;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

TEST(StepProfiler, ATinyCpuRunWritesTheTraceAndItsSummary) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(4, 0), "'train.profile_steps=[2,3]'", &log), 0)
      << log;
  const auto prof = dir / "out" / "profile";
  EXPECT_NE(log.find("profile of steps 2-3: " + prof.string()), std::string::npos) << log;
  const auto trace = nlohmann::json::parse(read_text(prof / "trace.json"));
  ASSERT_TRUE(trace.contains("traceEvents")) << trace.dump().substr(0, 500);
  EXPECT_FALSE(trace["traceEvents"].empty());

  const auto s = nlohmann::json::parse(read_text(prof / "summary.json"));
  EXPECT_EQ(s["steps"], 2) << s.dump(2);
  EXPECT_EQ(s["first_step"], 2);
  EXPECT_EQ(s["last_step"], 3);
  EXPECT_EQ(s["ranked_by"], "self_cpu_time");
  EXPECT_TRUE(s["gpu_busy_fraction"].is_null());
  EXPECT_EQ(s["kernel_launches_per_step"], 0.0);
  ASSERT_FALSE(s["top"].empty()) << s.dump(2);
  EXPECT_LE(s["top"].size(), 15u);
  EXPECT_GT(s["top"][0]["total_ms"].get<double>(), 0.0) << s.dump(2);
  EXPECT_GT(s["top"][0]["calls"].get<int64_t>(), 0);
  EXPECT_EQ(s["step_ms"].size(), 2u);
  EXPECT_GT(s["wall_ms_per_step"].get<double>(), 0.0);
  // A matmul of the forward or backward is among the ops.
  bool mm = false;
  for (const auto& op : s["top"]) mm = mm || op["name"].get<std::string>().find("mm") != std::string::npos;
  EXPECT_TRUE(mm) << s.dump(2);
  EXPECT_NE(read_text(prof / "summary.txt").find("ops by self CPU time"), std::string::npos);
  // Profiling observes the run: the losses are those of a run without it.
  TempDir plain;
  ASSERT_EQ(anvil::testing::train_in(plain, anvil::testing::tiny_sft_run(4, 0), "", &log), 0) << log;
  EXPECT_EQ(anvil::testing::read_losses(dir / "out" / "metrics.jsonl"),
            anvil::testing::read_losses(plain / "out" / "metrics.jsonl"));
}

TEST(StepProfiler, ARangePastTheRunsEndProfilesWhatRan) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(2, 0), "'train.profile_steps=[2,5]'", &log), 0)
      << log;
  EXPECT_NE(log.find("the run ended after step 2, before step 5"), std::string::npos) << log;
  const auto s = nlohmann::json::parse(read_text(dir / "out" / "profile" / "summary.json"));
  EXPECT_EQ(s["steps"], 1);
}

// Two steps of 10 ms; kernels 0-4 and 3-6 ms (busy 6 ms, overlapping) and
// one of 2 ms that ends after the last step (the window stretches to it).
TEST(StepProfiler, SummaryOfAGpuTrace) {
  const int64_t ms = 1000000;
  std::vector<TraceEvent> ev = {
      {"ProfilerStep#4", false, 0, 10 * ms, 1},
      {"ProfilerStep#5", false, 10 * ms, 10 * ms, 1},
      {"aten::mm", false, 1 * ms, 2 * ms, 1},
      {"cudaLaunchKernel", false, 1 * ms, 1000, 1},
      {"cudaLaunchKernelExC_v11060", false, 2 * ms, 1000, 1},
      {"cuLaunchKernelEx", false, 11 * ms, 1000, 1},
      {"cudaStreamSynchronize", false, 12 * ms, 1000, 1},
      {"cudaMemcpyAsync", false, 12 * ms, 1000, 1},
      {"cudaDeviceSynchronize", false, 21 * ms, 1000, 1},  // the profiler's own, after the last step
      {"gemm", true, 0, 4 * ms, 7},
      {"gemm", true, 3 * ms, 3 * ms, 7},
      {"softmax", true, 19 * ms, 5 * ms, 7},
  };
  const auto s = profile_summary(ev, /*gpu=*/true, "test");
  EXPECT_EQ(s["steps"], 2);
  EXPECT_EQ(s["first_step"], 4);
  EXPECT_EQ(s["last_step"], 5);
  EXPECT_DOUBLE_EQ(s["window_ms"].get<double>(), 24.0);
  EXPECT_DOUBLE_EQ(s["wall_ms_per_step"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(s["gpu_busy_fraction"].get<double>(), 11.0 / 24.0);
  EXPECT_DOUBLE_EQ(s["kernel_launches_per_step"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(s["host_syncs_per_step"].get<double>(), 0.5);
  ASSERT_EQ(s["top"].size(), 2u);
  EXPECT_EQ(s["top"][0]["name"], "gemm");
  EXPECT_DOUBLE_EQ(s["top"][0]["total_ms"].get<double>(), 7.0);
  EXPECT_EQ(s["top"][0]["calls"], 2);
  EXPECT_DOUBLE_EQ(s["top"][0]["percent"].get<double>(), 100.0 * 7 / 12);
  EXPECT_EQ(profile_summary_text(s),
            "profile (test): steps 4-5 (2) on cuda\n"
            "wall time per step: 12.00 ms (window 24.00 ms; steps on the host: 10.00, 10.00 ms)\n"
            "GPU busy: 45.8% of the window\n"
            "kernel launches per step: 1.5\n"
            "host syncs per step: 0.5\n"
            "top 2 kernels by GPU time:\n"
            "  total ms    calls       %  name\n"
            "     7.000        2   58.3%  gemm\n"
            "     5.000        1   41.7%  softmax\n");
}

// Self time: a parent's time less its children's, per thread.
TEST(StepProfiler, SummaryOfACpuTraceRanksBySelfTime) {
  const int64_t ms = 1000000;
  std::vector<TraceEvent> ev = {
      {"ProfilerStep#1", false, 0, 10 * ms, 1}, {"aten::linear", false, 0, 8 * ms, 1},
      {"aten::mm", false, 1 * ms, 6 * ms, 1},   {"aten::add", false, 8 * ms, 1 * ms, 1},
      {"aten::mm", false, 0, 3 * ms, 2},  // another thread: not nested in aten::linear
  };
  const auto s = profile_summary(ev, /*gpu=*/false, "test");
  ASSERT_EQ(s["top"].size(), 3u);
  EXPECT_EQ(s["top"][0]["name"], "aten::mm");
  EXPECT_DOUBLE_EQ(s["top"][0]["total_ms"].get<double>(), 9.0);
  EXPECT_EQ(s["top"][0]["calls"], 2);
  EXPECT_EQ(s["top"][1]["name"], "aten::linear");
  EXPECT_DOUBLE_EQ(s["top"][1]["total_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(s["top"][2]["percent"].get<double>(), 100.0 / 12);
  EXPECT_TRUE(s["gpu_busy_fraction"].is_null());
}

TEST(StepProfiler, ConfigRejectsABackwardRange) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  const auto base = (dir / "base.yaml").string();
  anvil::testing::write_text(base, "output_dir: /tmp/x\ntokenizer:\n  path: " + src +
                                       "/data/tokenizer.model\ndata:\n  train:\n    - path: " + src +
                                       "/data/sft_train.jsonl\ntrain:\n  max_steps: 10\n");
  const auto error = [&](const std::string& ov) {
    try {
      config::load_config({base}, {ov});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(error("train.profile_steps=[3, 2]"),
            "command line (train.profile_steps=[3, 2]): train.profile_steps: expected [first, last] with first <= "
            "last, got [3, 2]");
  EXPECT_EQ(error("train.profile_steps=[0, 2]"),
            "command line (train.profile_steps=[0, 2]): train.profile_steps: expected a list [first, last] of steps "
            ">= 1, got a list");
  EXPECT_NE(error("train.profile_steps=[2]").find("train.profile_steps: expected [first, last]"), std::string::npos);
  EXPECT_EQ(config::load_config({base}, {"train.profile_steps=[2, 4]"}).train.profile_steps,
            (std::vector<int64_t>{2, 4}));
  // Printed and read back as integers.
  const auto yaml = config::to_yaml(config::load_config({base}, {"train.profile_steps=[2, 4]"}));
  EXPECT_NE(yaml.find("profile_steps: [2, 4]"), std::string::npos) << yaml;
}

}  // namespace
}  // namespace anvil::train
