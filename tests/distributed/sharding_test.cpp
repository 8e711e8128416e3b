// Multi-process training on CPU: real ranks started by OpenMPI's mpirun,
// collectives through MPI. Every strategy on 2 and 3 ranks must train like
// one process on the same global batch; full_shard must hold about 1/N of the
// state per rank; sharded checkpoints resume bit-identically on the same
// world size and closely on another; a dead or hung rank must end the run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "distributed/sharding.h"
#include "models/activation_checkpointing.h"
#include "io/safetensors.h"
#include "anvil/models/registry.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/sft.h"
#include "train/objectives/lm_data.h"
#include "distributed/dist_runs.h"
#include "test_util.h"

namespace anvil::distributed {
namespace {

using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

double state_bytes(const nlohmann::json& m) {
  return m["memory/parameter_bytes"].get<double>() + m["memory/gradient_bytes"].get<double>() +
         m["memory/optimizer_bytes"].get<double>();
}

/// Runs shared by the tests below, trained once per test binary run.
class DistRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    anvil::testing::write_text(*dir_ / "run.yaml", kRun);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static stdfs::path cfg() { return *dir_ / "run.yaml"; }
  /// The output folder of `name`, trained on first use.
  static stdfs::path run(const std::string& name, int ranks, const std::string& extra = "") {
    const auto out = *dir_ / name;
    if (!stdfs::exists(out / "checkpoint-20")) train(cfg(), out, ranks, extra);
    return out;
  }
  static stdfs::path plain() { return run("plain", 0); }
  static stdfs::path exported(const stdfs::path& out) {
    const auto dst = out.string() + "-export";
    if (!stdfs::exists(dst)) {
      std::string o;
      EXPECT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " export --checkpoint " +
                                        (out / "checkpoint-20").string() + " --output " + dst,
                                    &o),
                0)
          << o;
    }
    return dst;
  }
  static TempDir* dir_;
};
TempDir* DistRuns::dir_ = nullptr;

TEST_F(DistRuns, EveryStrategyOnTwoAndThreeRanksTrainsLikeOneProcess) {
  const auto base = read_metrics(plain() / "metrics.jsonl");
  ASSERT_EQ(base.size(), 20u);
  for (const int ranks : {2, 3})
    for (const char* strategy : {"no_shard", "shard_grad_op", "full_shard"}) {
      const auto name = std::string(strategy) + "-" + std::to_string(ranks);
      const auto out = run(name, ranks, std::string("dist.sharding=") + strategy);
      const auto got = read_metrics(out / "metrics.jsonl");
      ASSERT_EQ(got.size(), 20u) << name;
      expect_close_losses(base, got, 1, 20, 1e-5, name);
      // Sharded checkpoints consolidate (anvil export) into the same weights.
      ASSERT_TRUE(stdfs::exists(out / "checkpoint-20" / "sharding.json")) << name;
      EXPECT_LE(max_param_diff(plain() / "checkpoint-20" / "model.safetensors", exported(out) / "model.safetensors"),
                1e-5)
          << name;
      // ... and the checkpoint's own HF folder (a file per unit, each written by the rank that owns it) holds them.
      EXPECT_EQ(max_param_diff(out / "checkpoint-20", exported(out) / "model.safetensors"), 0.0) << name;
      EXPECT_FALSE(stdfs::exists(out / "checkpoint-20" / "model.safetensors")) << name;
      // GPT-2's 4 blocks and the root unit, each its own file.
      EXPECT_TRUE(stdfs::exists(out / "checkpoint-20" / "model-00005-of-00005.safetensors")) << name;
    }
}

// Every family of the registry (its debug flavor; the run above is GPT-2's):
// 2 full_shard ranks log the losses of one process and save the same weights.
TEST_F(DistRuns, EveryFamilyOnTwoFullShardRanksTrainsLikeOneProcess) {
  for (const auto& flavor : anvil::testing::debug_flavors()) {
    if (flavor == "gpt2-debug") continue;
    SCOPED_TRACE(flavor);
    const auto one = *dir_ / (flavor + "-one"), two = *dir_ / (flavor + "-two");
    const auto extra = "--config configs/models/" + flavor + ".yaml train.max_steps=4 train.save_every=4 " +
                       "train.eval_every=4 train.global_batch_size=4 eval.generate_samples=0";
    ASSERT_EQ(train(cfg(), one, 0, extra), 0);
    // Randomly initialised: each rank draws its shards of the weights one process draws (models/init.h).
    std::string log;
    ASSERT_EQ(train(cfg(), two, 2, extra + " dist.sharding=full_shard logging.level=info", &log), 0);
    EXPECT_NE(log.find("randomly initialised (each rank draws its shards of the weights)"), std::string::npos) << log;
    const auto a = read_metrics(one / "metrics.jsonl"), b = read_metrics(two / "metrics.jsonl");
    ASSERT_EQ(a.size(), 4u);
    expect_close_losses(a, b, 1, 4, 1e-5, flavor);
    EXPECT_LE(max_param_diff(one / "checkpoint-4" / "model.safetensors", two / "checkpoint-4"), 1e-5);
  }
}

// Untied input embeddings (the LLaMA debug model's) are a unit of their own: gathered for a forward's start
// and freed when the first block runs, while the root (final norm, LM head) is gathered after the last block.
// The most parameter bytes whole at once is then the larger of the embeddings plus a block and the root plus
// two blocks, never all of them, and --plan-memory says so.
TEST_F(DistRuns, UntiedEmbeddingsAreTheirOwnUnit) {
  const auto out = *dir_ / "llama-untied";
  const std::string extra =
      "--config configs/models/llama-debug.yaml train.max_steps=4 train.save_every=4 "
      "train.eval_every=2 train.global_batch_size=4 eval.generate_samples=0";
  ASSERT_EQ(train(cfg(), out, 2, extra + " dist.sharding=full_shard"), 0);
  const auto meta = nlohmann::json::parse(anvil::testing::read_text(out / "checkpoint-4" / "sharding.json"));
  std::vector<std::string> names;
  double embed = 0, root = 0, block = 0;  // bytes of each unit's whole float32 buffer (padded to 2 ranks)
  for (const auto& u : meta["units"]) {
    names.push_back(u["name"].get<std::string>());
    const double bytes = 4.0 * static_cast<double>((u["numel"].get<int64_t>() + 1) / 2 * 2);
    (names.back() == "embed"  ? embed
     : names.back() == "root" ? root
                              : block) = std::max(bytes, names.back() == "embed"  ? embed
                                                         : names.back() == "root" ? root
                                                                                  : block);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"model.layers.0", "model.layers.1", "embed", "root"}));
  const auto m = read_metrics(out / "metrics.jsonl");
  const double peak = std::max(embed + block, root + 2 * block);
  EXPECT_EQ(m.at(4)["memory/peak_gathered_parameter_bytes"].get<double>(), peak);
  EXPECT_LT(peak, embed + root + 2 * block);
  // An evaluation holds less (no backward): the embeddings and a block, two blocks, or the root and a block.
  const double eval_peak = m.at(4)["memory/eval_peak_gathered_parameter_bytes"].get<double>();
  EXPECT_GE(eval_peak, root);
  EXPECT_LE(eval_peak, std::max({embed + block, 2 * block, root + block})) << embed << " " << root << " " << block;
  std::string plan;
  ASSERT_EQ(
      anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() + " --config " +
                              cfg().string() + " " + extra + " output_dir=" + (*dir_ / "unused").string() +
                              " dist.sharding=full_shard --plan-memory --world-size 2",
                          &plan),
      0)
      << plan;
  const auto at = plan.find("whole parameters held at once in a step: ");
  ASSERT_NE(at, std::string::npos) << plan;
  EXPECT_NEAR(std::stod(plan.substr(at + 41)) * 1e3, peak, 0.01 * peak) << plan;
  // And it trains as one process does (EveryFamilyOnTwoFullShardRanksTrainsLikeOneProcess covers the weights).
  const auto one = *dir_ / "llama-untied-one";
  ASSERT_EQ(train(cfg(), one, 0, extra), 0);
  expect_close_losses(read_metrics(one / "metrics.jsonl"), m, 1, 4, 1e-5, "untied LLaMA");
}

TEST_F(DistRuns, FullShardHoldsAboutOneNthOfTheStatePerRank) {
  const double whole = state_bytes(read_metrics(plain() / "metrics.jsonl").at(20));
  for (const int ranks : {2, 3}) {
    const auto m =
        read_metrics(run("full_shard-" + std::to_string(ranks), ranks, "dist.sharding=full_shard") / "metrics.jsonl")
            .at(20);
    const double ratio = state_bytes(m) / whole;
    // Exactly 1/N but for padding each unit to a multiple of N elements.
    EXPECT_GE(ratio, 1.0 / ranks) << ranks;
    EXPECT_LE(ratio, 1.0 / ranks + 0.01) << ranks << " ranks: " << state_bytes(m) << " of " << whole << " bytes";
  }
  // Between uses only the root unit (embeddings) stays whole; at most two of
  // the four blocks are whole at once (the one running, the one prefetched).
  const auto m2 = read_metrics(run("full_shard-2", 2, "dist.sharding=full_shard") / "metrics.jsonl").at(20);
  const double params = read_metrics(plain() / "metrics.jsonl").at(20)["memory/parameter_bytes"].get<double>();
  const double peak = m2["memory/peak_gathered_parameter_bytes"].get<double>();
  const double block =
      4.0 * (2 * 2 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32);  // GPT-2 block
  EXPECT_NEAR(peak, params - 2 * block, 4 * 2 * 64) << "peak whole bytes " << peak << " of " << params;
  // An evaluation runs through the shards too: the held-out loss holds the root and two blocks at most, like a
  // step, and equals one process's; generation (this run's samples) gathers the whole model for its decoding.
  const auto nogen_dir = run("full_shard-2-nogen", 2, "dist.sharding=full_shard eval.generate_samples=0");
  const auto nogen = read_metrics(nogen_dir / "metrics.jsonl");
  const auto plain_lines = read_metrics(plain() / "metrics.jsonl");
  auto most = [](const std::map<int64_t, nlohmann::json>& lines, const char* key) {
    double m = 0;
    for (const auto& [step, line] : lines) m = std::max(m, line.value(key, 0.0));
    return m;
  };
  const double eval_peak = most(nogen, "memory/eval_peak_gathered_parameter_bytes");
  EXPECT_GT(eval_peak, 0);
  EXPECT_NEAR(eval_peak, params - 2 * block, 4 * 2 * 64) << "evaluation held " << eval_peak << " of " << params;
  for (const int64_t step : {10, 20})
    EXPECT_NEAR(nogen.at(step)["eval/loss"].get<double>(), plain_lines.at(step)["eval/loss"].get<double>(),
                1e-5 * plain_lines.at(step)["eval/loss"].get<double>())
        << "step " << step;
  const auto with_samples = read_metrics(run("full_shard-2", 2, "dist.sharding=full_shard") / "metrics.jsonl");
  EXPECT_NEAR(most(with_samples, "memory/eval_peak_gathered_parameter_bytes"), params, 4 * 2 * 64);
  // Each block's gradient reduction is folded into its master gradient once the next one is issued (FSDP2):
  // at most two units' flat gradients are alive during a backward, not every unit's.
  EXPECT_EQ(m2["memory/peak_reductions_in_flight"].get<double>(), 2);
  // shard_grad_op keeps whole parameters (its float32 masters are slices of
  // them) and shards gradients and moments: (1 + 3 / N) / 4 of the state.
  const auto sgo = read_metrics(run("shard_grad_op-2", 2, "dist.sharding=shard_grad_op") / "metrics.jsonl").at(20);
  EXPECT_NEAR(state_bytes(sgo) / whole, 0.625, 0.01);
}

// trainer --plan-memory gives, from the model's shapes alone, what the runs
// above hold per rank (their memory/ metrics count the tensors): the state
// by kind and the whole parameters a step gathers at once, within 10 %.
TEST_F(DistRuns, PlanMemoryMatchesWhatTheRunsHold) {
  for (const int ranks : {2, 3}) {
    std::string plan;
    ASSERT_EQ(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                                      " --config " + cfg().string() + " output_dir=" + (*dir_ / "unused").string() +
                                      " dist.sharding=full_shard --plan-memory --world-size " + std::to_string(ranks),
                                  &plan),
              0)
        << plan;
    const auto m =
        read_metrics(run("full_shard-" + std::to_string(ranks), ranks, "dist.sharding=full_shard") / "metrics.jsonl")
            .at(20);
    expect_plan_holds(plan, m, std::to_string(ranks) + " ranks");
  }
}

// The plan's figure for a step (--plan-memory's "at a step": the state, the
// gathered units, the reductions and the activation estimate) against the
// most bytes CPU tensors held at once in a step (memory/cpu_peak_bytes, the
// counting CPU allocator of core/host_memory.h), within 10 %, on runs whose
// activations are most of the step: GPT-2 and a grouped-query LLaMA on one
// process, with activation checkpointing, under full_shard on 2 ranks, and on
// 2 ranks of tensor parallelism (with and without sequence parallelism) and of
// context parallelism (all-gather and ring).
TEST(MemoryPlan, TheStepFigureMatchesTheCountedPeakOfCpuTensors) {
  TempDir dir;
  anvil::testing::write_text(dir / "run.yaml", R"(
model: {family: gpt2, max_position_embeddings: 256, hidden_size: 256, num_hidden_layers: 4, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], max_length: 256, packing: true}
optimizer: {lr: 1.0e-4}
train: {max_steps: 3, micro_batch_size: 8, global_batch_size: 8, save_every: 0, log_every: 1, threads: 1}
eval: {generate_samples: 0}
logging: {level: warn}
)");
  const std::string llama =
      "model.family=llama model.num_key_value_heads=2 model.intermediate_size=704 model.num_hidden_layers=6";
  const std::vector<std::pair<int, std::string>> runs = {
      {0, ""},
      {0, "model.num_hidden_layers=6 train.activation_checkpointing=true"},
      {0, llama},
      {0, llama + " train.activation_checkpointing=true"},
      {2, llama + " dist.sharding=full_shard train.global_batch_size=16"},
      // A mesh on 2 ranks: tensor parallelism (with sequence parallelism), context parallelism (all-gather, ring).
      {2, llama + " dist.tensor_parallel=2"},
      {2, llama + " dist.tensor_parallel=2 dist.sequence_parallel=true"},
      {2, llama + " dist.context_parallel=2"},
      {2, llama + " dist.context_parallel=2 dist.context_parallel_mode=ring"}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& [ranks, extra] = runs[i];
    SCOPED_TRACE(extra + " on " + std::to_string(std::max(ranks, 1)) + " rank(s)");
    const auto out = dir / concat("run-", i);
    std::string plan;
    ASSERT_EQ(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                                      " --config " + (dir / "run.yaml").string() + " output_dir=" + out.string() + " " +
                                      extra + " --plan-memory --world-size " + std::to_string(std::max(ranks, 1)),
                                  &plan),
              0)
        << plan;
    const auto at = plan.find(" at a step");
    ASSERT_NE(at, std::string::npos) << plan;
    const auto colon = plan.rfind(": ", at);
    std::istringstream figure(plan.substr(colon + 2, at - colon - 2));
    double planned = 0;
    std::string unit;
    figure >> planned >> unit;
    planned *= unit == "GB" ? 1e9 : unit == "MB" ? 1e6 : 1e3;
    ASSERT_EQ(train(dir / "run.yaml", out, ranks, extra), 0);
    double counted = 0;
    for (const auto& [step, m] : read_metrics(out / "metrics.jsonl"))
      counted = std::max(counted, m.at("memory/cpu_peak_bytes").get<double>());
    std::cout << "[memory plan] " << extra << " on " << std::max(ranks, 1) << " rank(s): planned " << planned / 1e6
              << " MB, counted " << counted / 1e6 << " MB\n";
    EXPECT_NEAR(planned, counted, 0.1 * counted) << plan;
  }
}

/// Each rank's host-memory peaks by phase (output_dir/host_memory/rank-N.json, core/host_memory.h).
std::vector<nlohmann::json> host_phases(const stdfs::path& out, int ranks) {
  std::vector<nlohmann::json> v;
  for (int r = 0; r < std::max(ranks, 1); ++r) {
    const auto j = nlohmann::json::parse(anvil::testing::read_text(out / "host_memory" / concat("rank-", r, ".json")));
    EXPECT_TRUE(j["resets"].get<bool>()) << "the kernel refused to reset the high-water mark";
    v.push_back(j["phases"]);
  }
  return v;
}

// Measured, not computed: each process's high-water mark (VmHWM) over the
// resume and over the training steps, for a GPT-2 whose float32 state (16
// bytes per parameter: master, gradient, two moments) is about 0.5 GB, so
// that it dominates the process's fixed memory (libtorch, data). Under
// full_shard a rank's peak in both phases falls by about (1 - 1/W) of the
// state from 1 to 2 to 4 ranks: the resume streams each rank's slices of the
// shard files (written by another world size) and the backward holds two
// units' reductions at most. A fresh run from the model's HF folder loads
// falling by about (1 - 1/W) of the float32 weights: each rank reads only its
// ranges, and so does a randomly initialised one (each rank draws its
// shards). A save's peak falls as well: each rank gathers the HF folder's
// units one at a time and keeps the ones it writes (1/W of the model).
// Counted in CPU tensors' bytes (core/host_memory.h), without the allocator's
// slack, every phase's peak is one process's over W plus two units at most.
TEST(ShardedMemory, ResumeAndStepPeaksFallAsOneOverTheRanks) {
  TempDir dir;
  anvil::testing::write_text(dir / "big.yaml", R"(
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 512, num_hidden_layers: 8, num_attention_heads: 8, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], max_length: 32}
optimizer: {lr: 1.0e-4}
train: {max_steps: 2, micro_batch_size: 1, global_batch_size: 4, save_every: 2, keep_checkpoints: 0, log_every: 1,
        threads: 1}
eval: {generate_samples: 0}
dist: {sharding: full_shard}
logging: {level: warn}
)");
  // The state, from the parameters the run reports (float32, 4 copies).
  const auto source = dir / "from-4";
  ASSERT_EQ(train(dir / "big.yaml", source, 4), 0);
  double numel = 0;  // the model's parameters, from the checkpoint's units
  const auto meta = nlohmann::json::parse(anvil::testing::read_text(source / "checkpoint-2" / "sharding.json"));
  for (const auto& u : meta["units"]) numel += u["numel"].get<double>();
  ASSERT_GT(numel, 1e7);
  std::map<int, std::vector<nlohmann::json>> phases;
  for (const int ranks : {1, 2, 4, -4}) {  // -4: 4 ranks as 2 replica groups of 2 (dist.replicate)
    const auto out = dir / concat("resume-", ranks);
    stdfs::create_directories(out);
    stdfs::copy(source / "checkpoint-2", out / "checkpoint-2", stdfs::copy_options::recursive);
    const int n = std::abs(ranks);
    ASSERT_EQ(train(dir / "big.yaml", out, n == 1 ? 0 : n,
                    std::string("train.max_steps=3 train.save_every=0") + (ranks < 0 ? " dist.replicate=2" : "")),
              0);
    phases[ranks] = host_phases(out, n);
  }
  const double state = 16.0 * numel;
  for (const char* phase : {"load", "resume", "train", "save"}) {
    auto most = [&](int ranks) {
      double m = 0;
      for (const auto& p : phases.at(ranks)) m = std::max(m, p.at(phase).at("peak_bytes").get<double>());
      return m;
    };
    const double one = most(1), two = most(2), four = most(4), hybrid = most(-4);
    std::cout << "[memory] " << phase << ": peak per rank " << one / 1e6 << " MB (1 rank), " << two / 1e6 << " MB (2), "
              << four / 1e6 << " MB (4), " << hybrid / 1e6 << " MB (4 as 2 x 2, hybrid); float32 state " << state / 1e6
              << " MB\n";
    // The same phases counted in CPU tensors' bytes (no allocator slack, no LibTorch).
    auto tensors = [&](int ranks) {
      double m = 0;
      for (const auto& p : phases.at(ranks)) m = std::max(m, p.at(phase).at("tensor_peak_bytes").get<double>());
      return m;
    };
    std::cout << "[memory] " << phase << ": CPU tensors' peak per rank " << tensors(1) / 1e6 << " MB (1 rank), "
              << tensors(2) / 1e6 << " MB (2), " << tensors(4) / 1e6 << " MB (4), " << tensors(-4) / 1e6
              << " MB (4 as 2 x 2)\n";
    // Counted exactly, a rank's tensors in every phase are one process's over W, plus two units in flight.
    double unit = 0;  // the largest unit, float32 bytes
    for (const auto& u : meta["units"]) unit = std::max(unit, 4.0 * u["numel"].get<double>());
    for (const int ranks : {2, 4}) EXPECT_LE(tensors(ranks), tensors(1) / ranks + 2 * unit) << phase << ", " << ranks;
    EXPECT_LE(tensors(-4), tensors(1) / 2 + 2 * unit) << phase << ", 2 x 2";
    // Load: asserted below against the load of a tiny model.
    if (std::string(phase) == "load") continue;
    // Ideal: each rank drops (1 - 1/W) of the state; allow a fifth of that to other memory. A sharded save
    // also keeps the float32 HF units it writes, 1/W of the model (a quarter of the state), which one process
    // writes from its parameters.
    const auto drop = [&](int w) {
      return (1.0 - 1.0 / w) * state - (std::string(phase) == "save" ? state / 4 / w : 0.0);
    };
    EXPECT_GE(one - two, 0.8 * drop(2)) << phase;
    EXPECT_GE(one - four, 0.8 * drop(4)) << phase;
    EXPECT_GE(one - hybrid, 0.8 * drop(2)) << phase << ": a hybrid rank shards over its group of 2";
  }

  // A fresh run from the model's HF folder: one process loads it whole; under full_shard each rank builds the
  // model without storage and reads only its ranges of the folder's weights into its shards. The fixed
  // overhead of a rank (LibTorch, MPI, the data) is what the same load of a tiny model's folder (hidden 32,
  // one block) peaks at on as many ranks; beyond it a rank may hold its 1/W of the state and two units.
  std::string yaml = anvil::testing::read_text(dir / "big.yaml");
  const auto at = yaml.find("model: {");
  const auto model_line = yaml.substr(at, yaml.find('\n', at) - at);
  auto with_model = [&](const std::string& line) {
    auto y = yaml;
    y.replace(at, model_line.size(), line);
    return y;
  };
  anvil::testing::write_text(dir / "tiny.yaml",
                             with_model("model: {family: gpt2, max_position_embeddings: 32, "
                                        "hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4}"));
  ASSERT_EQ(train(dir / "tiny.yaml", dir / "tiny", 0, "train.max_steps=1 train.save_every=1"), 0);
  const auto hf = dir / "hf";
  std::string exported;
  ASSERT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " export --checkpoint " +
                                    (source / "checkpoint-2").string() + " --output " + hf.string(),
                                &exported),
            0)
      << exported;
  double largest_unit = 0;  // float32 bytes
  for (const auto& u : meta["units"]) largest_unit = std::max(largest_unit, 4.0 * u["numel"].get<double>());
  auto load_peak = [&](const stdfs::path& folder, int ranks) {
    const auto name = concat(folder.filename().string(), "-from-", ranks);
    anvil::testing::write_text(dir / (name + ".yaml"), with_model("model: {from: " + folder.string() + "}"));
    std::string log;
    EXPECT_EQ(train(dir / (name + ".yaml"), dir / name, ranks == 1 ? 0 : ranks,
                    "train.max_steps=1 train.save_every=0 logging.level=info", &log),
              0);
    if (ranks > 1) EXPECT_NE(log.find("each rank reads its shards of the weights"), std::string::npos) << log;
    double peak = 0;
    for (const auto& p : host_phases(dir / name, ranks))
      peak = std::max(peak, p.at("load").at("peak_bytes").get<double>());
    return peak;
  };
  std::map<int, double> load, overheads;
  for (const int ranks : {1, 2, 4}) {
    const double overhead = overheads[ranks] = load_peak(dir / "tiny" / "checkpoint-1", ranks);
    load[ranks] = load_peak(hf, ranks);
    const double allowed = overhead + state / ranks + 2 * largest_unit;
    std::cout << "[memory] load from an HF folder on " << ranks << " rank(s): peak " << load[ranks] / 1e6
              << " MB per rank; fixed overhead (a tiny model's) " << overhead / 1e6 << " MB, 1/" << ranks
              << " of the state " << state / ranks / 1e6 << " MB, two units " << 2 * largest_unit / 1e6
              << " MB: allowed " << allowed / 1e6 << " MB\n";
    EXPECT_LE(load[ranks], allowed) << ranks << " ranks";
  }
  EXPECT_GE(load[1] - load[4], 0.8 * state / 4 * 3 / 4) << "each rank reads less of the weights";
  // Randomly initialised (the resumed runs' loads, before their checkpoint is read): under full_shard each rank
  // builds the model without storage too and draws its shards one parameter at a time
  // (models::build_deferred_random), within the same bound.
  for (const int ranks : {2, 4}) {
    double peak = 0;
    for (const auto& p : phases.at(ranks)) peak = std::max(peak, p.at("load").at("peak_bytes").get<double>());
    const double allowed = overheads[ranks] + state / ranks + 2 * largest_unit;
    std::cout << "[memory] random initialisation on " << ranks << " ranks: load peak " << peak / 1e6
              << " MB per rank; allowed " << allowed / 1e6 << " MB\n";
    EXPECT_LE(peak, allowed) << ranks << " ranks";
  }
}

TEST_F(DistRuns, ResumesBitIdenticallyOnTwoRanksAndWithinToleranceOnOneOrThree) {
  const auto straight_dir = run("full_shard-2", 2, "dist.sharding=full_shard");
  const auto straight = read_metrics(straight_dir / "metrics.jsonl");
  auto resume = [&](const std::string& name, int ranks, const std::string& extra = "dist.sharding=full_shard") {
    const auto out = *dir_ / name;
    stdfs::create_directories(out);
    stdfs::copy(straight_dir / "checkpoint-10", out / "checkpoint-10", stdfs::copy_options::recursive);
    train(cfg(), out, ranks, extra);
    return read_metrics(out / "metrics.jsonl");
  };
  const auto same = resume("resume-2to2", 2);
  ASSERT_EQ(same.size(), 10u);
  for (int64_t s = 11; s <= 20; ++s) {
    EXPECT_EQ(same.at(s)["loss"].get<double>(), straight.at(s)["loss"].get<double>()) << "step " << s;
    EXPECT_EQ(same.at(s)["grad_norm"].get<double>(), straight.at(s)["grad_norm"].get<double>()) << "step " << s;
  }
  EXPECT_EQ(same.at(20)["eval/loss"].get<double>(), straight.at(20)["eval/loss"].get<double>());
  expect_close_losses(straight, resume("resume-2to1", 1), 11, 20, 1e-5, "2 -> 1 rank");
  // A plain single-process checkpoint continues on 2 sharded ranks too.
  {
    const auto plain_run = read_metrics(plain() / "metrics.jsonl");
    const auto out = *dir_ / "plain-to-2";
    stdfs::create_directories(out);
    stdfs::copy(plain() / "checkpoint-10", out / "checkpoint-10", stdfs::copy_options::recursive);
    train(cfg(), out, 2, "dist.sharding=full_shard");
    expect_close_losses(plain_run, read_metrics(out / "metrics.jsonl"), 11, 20, 1e-5, "plain process -> 2 ranks");
  }
  // A plain single process (no mpirun, no dist keys) resumes it too.
  expect_close_losses(straight, resume("resume-2to-plain", 0, ""), 11, 20, 1e-5, "2 ranks -> plain process");
  expect_close_losses(straight, resume("resume-2to3", 3), 11, 20, 1e-5, "2 -> 3 ranks");
}

// Hybrid sharding (dist.replicate): 4 ranks as 2 replica groups of 2 full_shard ranks train as one process
// does, each rank holding what a rank of a 2-rank full_shard run holds (its group shards over 2); the first
// group writes the shards; a resume on the same layout repeats the run bit for bit, and 2 plain full_shard
// ranks continue it.
TEST_F(DistRuns, HybridShardingOnTwoByTwoRanksTrainsLikeOneProcess) {
  const auto base = read_metrics(plain() / "metrics.jsonl");
  // Micro-batches of 1: 12 samples a step divide among 4 ranks (the loss is the same: padding changes nothing).
  const std::string hybrid = "dist.sharding=full_shard dist.replicate=2 train.micro_batch_size=1";
  const auto out = *dir_ / "hsdp-2x2";
  std::string log;
  train(cfg(), out, 4, hybrid, &log);
  EXPECT_NE(log.find("full_shard, hybrid: 2 replicas of 2 ranks"), std::string::npos) << log;
  const auto got = read_metrics(out / "metrics.jsonl");
  ASSERT_EQ(got.size(), 20u);
  expect_close_losses(base, got, 1, 20, 1e-5, "hybrid 2 x 2");
  const auto two = read_metrics(run("full_shard-2", 2, "dist.sharding=full_shard") / "metrics.jsonl");
  EXPECT_EQ(state_bytes(got.at(20)), state_bytes(two.at(20)));
  const auto shards = out / "checkpoint-20" / "shards";
  EXPECT_TRUE(stdfs::exists(shards / "shard-00001-of-00002.safetensors"));
  EXPECT_FALSE(stdfs::exists(shards / "shard-00002-of-00004.safetensors"));
  EXPECT_LE(max_param_diff(plain() / "checkpoint-20" / "model.safetensors", out / "checkpoint-20"), 1e-5);
  const auto resume = [&](const std::string& name, int ranks, const std::string& extra) {
    const auto dir = *dir_ / name;
    stdfs::create_directories(dir);
    stdfs::copy(out / "checkpoint-10", dir / "checkpoint-10", stdfs::copy_options::recursive);
    train(cfg(), dir, ranks, extra);
    return read_metrics(dir / "metrics.jsonl");
  };
  const auto again = resume("hsdp-2x2-resumed", 4, hybrid);
  ASSERT_EQ(again.size(), 10u);
  for (int64_t s = 11; s <= 20; ++s) {
    EXPECT_EQ(again.at(s)["loss"].get<double>(), got.at(s)["loss"].get<double>()) << "step " << s;
    EXPECT_EQ(again.at(s)["grad_norm"].get<double>(), got.at(s)["grad_norm"].get<double>()) << "step " << s;
  }
  expect_close_losses(got, resume("hsdp-to-2", 2, "dist.sharding=full_shard train.micro_batch_size=1"), 11, 20, 1e-5,
                      "hybrid 2 x 2 -> 2");
  // shard_grad_op within the groups too.
  const auto sgo = run("hsdp-sgo", 4, "dist.sharding=shard_grad_op dist.replicate=2 train.micro_batch_size=1");
  expect_close_losses(base, read_metrics(sgo / "metrics.jsonl"), 1, 20, 1e-5, "hybrid 2 x 2, shard_grad_op");
}

TEST_F(DistRuns, MixedPrecisionTrainsCloseToFloat32) {
  const auto base = read_metrics(plain() / "metrics.jsonl");
  const auto out = run("bf16-2", 2, "dist.sharding=full_shard dist.param_dtype=bfloat16");
  const auto got = read_metrics(out / "metrics.jsonl");
  ASSERT_EQ(got.size(), 20u);
  for (int64_t s = 1; s <= 20; ++s)
    EXPECT_NEAR(got.at(s)["loss"].get<double>(), base.at(s)["loss"].get<double>(), 0.03) << "step " << s;
  // Master weights stay float32 in the checkpoint.
  io::SafetensorsFile shard(out / "checkpoint-20" / "shards" / "shard-00000-of-00002.safetensors");
  EXPECT_EQ(shard.get("root.param").scalar_type(), at::kFloat);
}

TEST_F(DistRuns, ActivationCheckpointingGivesTheSameLossesAndGradients) {
  const auto base = read_metrics(run("full_shard-2", 2, "dist.sharding=full_shard") / "metrics.jsonl");
  const auto ac = read_metrics(
      run("full_shard-2-ac", 2, "dist.sharding=full_shard train.activation_checkpointing=true") / "metrics.jsonl");
  expect_close_losses(base, ac, 1, 20, 1e-6, "full_shard + activation checkpointing");
  // One plain process with dropout: the recomputed blocks draw the same
  // masks, so the runs are bit-identical.
  const auto plain_drop = read_metrics(run("plain-dropout", 0, "model.dropout=0.1") / "metrics.jsonl");
  const auto plain_drop_ac = read_metrics(
      run("plain-dropout-ac", 0, "model.dropout=0.1 train.activation_checkpointing=true") / "metrics.jsonl");
  for (int64_t s = 1; s <= 20; ++s)
    EXPECT_EQ(plain_drop.at(s)["loss"].get<double>(), plain_drop_ac.at(s)["loss"].get<double>()) << "step " << s;
}

TEST_F(DistRuns, BadLaunchesFailWithAMessage) {
  std::string log;
  const auto out = *dir_ / "bad";
  // 12 samples = 6 micro-batches of 2 do not split among 4 ranks.
  const auto cmd =
      mpirun(4) + anvil::testing::trainer_bin() + " --config " + cfg().string() + " output_dir=" + out.string();
  EXPECT_NE(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + cmd, &log), 0);
  EXPECT_NE(log.find("train.global_batch_size: a step of 6 micro-batches of 2 samples does not divide among 4 ranks"),
            std::string::npos)
      << log;
  // torchrun on CPU: the MPI backend needs mpirun.
  const auto torchrun = stdfs::path(anvil::testing::python_bin()).parent_path() / "torchrun";
  const auto cmd2 = torchrun.string() + " --no-python --nproc-per-node 2 " + anvil::testing::trainer_bin() +
                    " --config " + cfg().string() + " output_dir=" + out.string();
  EXPECT_NE(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + cmd2, &log), 0);
  EXPECT_NE(log.find("dist.backend: mpi needs the ranks started by mpirun (this one came from torchrun)"),
            std::string::npos)
      << log;
}

// The non-finite guard on 2 full_shard ranks: the fault hits rank 0's loss
// only (ANVIL_TEST_NONFINITE), yet both ranks take the same decision through
// the reduced loss; gradients go through the global norm (tests/train/nonfinite_test.cpp
// for one process).
TEST_F(DistRuns, NonFiniteStepsAreDecidedAlikeOnEveryRank) {
  const auto mpi = [&](const std::string& name, const std::string& faults, const std::string& extra, std::string* log) {
    const auto cmd = "cd " + anvil::testing::source_dir() + " && ANVIL_TEST_NONFINITE=" + faults + " timeout 300 " +
                     mpirun(2) + anvil::testing::trainer_bin() + " --config " + cfg().string() +
                     " output_dir=" + (*dir_ / name).string() +
                     " dist.sharding=full_shard train.max_steps=6 train.save_every=2 " + "train.eval_every=0 " + extra;
    return anvil::testing::run(cmd, log);
  };
  std::string log;
  ASSERT_EQ(mpi("nf-skip", "loss@3,grad@4", "train.on_nonfinite=skip", &log), 0) << log;
  const auto m = read_metrics(*dir_ / "nf-skip" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m.at(2)["nonfinite_steps"].get<int64_t>(), 0);
  EXPECT_EQ(m.at(3)["nonfinite_steps"].get<int64_t>(), 1);
  EXPECT_EQ(m.at(6)["nonfinite_steps"].get<int64_t>(), 2);
  // Both ranks skipped steps 3 and 4: the model gathered from their shards is step 2's.
  std::string o;
  const auto model = [&](int step) { return *dir_ / "nf-skip" / ("checkpoint-" + std::to_string(step)); };
  EXPECT_EQ(max_param_diff(model(2), model(4)), 0.0);
  EXPECT_GT(max_param_diff(model(4), model(6)), 0.0);
  // The decision was taken on the device (train.overlap_step_reads, the loss and stop flag all-reduced with
  // the step and read while the next ran): the lines and every checkpoint file equal reading each step at once.
  EXPECT_NE(log.find("each step read while the next runs"), std::string::npos) << log;
  std::string at_once;
  ASSERT_EQ(mpi("nf-skip-at-once", "loss@3,grad@4", "train.on_nonfinite=skip train.overlap_step_reads=false", &at_once),
            0)
      << at_once;
  EXPECT_EQ(at_once.find("each step read while the next runs"), std::string::npos) << at_once;
  const auto m1 = read_metrics(*dir_ / "nf-skip-at-once" / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  for (int64_t step = 1; step <= 6; ++step)
    for (const auto* key : {"loss", "grad_norm", "nonfinite_steps"})
      EXPECT_EQ(m.at(step)[key].dump(), m1.at(step)[key].dump()) << "step " << step << " " << key;
  for (const auto* file :
       {"model.safetensors.index.json", "model-00001-of-00005.safetensors", "model-00005-of-00005.safetensors",
        "shards/shard-00000-of-00002.safetensors", "shards/shard-00001-of-00002.safetensors", "sharding.json"})
    EXPECT_EQ(anvil::testing::run("cmp " + (*dir_ / "nf-skip" / "checkpoint-6" / file).string() + " " +
                                      (*dir_ / "nf-skip-at-once" / "checkpoint-6" / file).string(),
                                  &o),
              0)
        << file << ": " << o;
  EXPECT_NE(mpi("nf-stop", "loss@3", "", &log), 0);
  EXPECT_NE(log.find("step 3: the loss is inf (not finite)"), std::string::npos) << log;
  EXPECT_TRUE(stdfs::exists(*dir_ / "nf-stop" / "checkpoint-2" / "trainer_state.json"));
  EXPECT_FALSE(stdfs::exists(*dir_ / "nf-stop" / "checkpoint-3"));
  EXPECT_FALSE(stdfs::exists(*dir_ / "nf-stop" / "checkpoint-4"));
}

TEST_F(DistRuns, ShardedCheckpointsExplainWhatCannotReadThem) {
  const auto src = run("full_shard-2", 2, "dist.sharding=full_shard") / "checkpoint-20";
  std::string log;
  // A consolidated sharded checkpoint is a model folder too.
  EXPECT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " generate --model " + src.string() + " --prompt hi", &log),
            0)
      << log;
  // ... and transformers loads it as is (its files by the index), with the weights and logits of the model
  // anvil export consolidates from the shards.
  EXPECT_TRUE(stdfs::exists(src / "model.safetensors.index.json"));
  EXPECT_EQ(anvil::testing::run(anvil::testing::python_bin() +
                                    " -c 'import sys, torch, transformers\n"
                                    "a = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
                                    "b = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[2])\n"
                                    "ids = torch.tensor([[1, 5, 9, 13, 2]])\n"
                                    "d = (a(ids).logits - b(ids).logits).abs().max().item()\n"
                                    "print(\"loaded\", type(a).__name__, \"logits differ by\", d)' " +
                                    src.string() + " " + exported(src.parent_path()).string(),
                                &log),
            0)
      << log;
  EXPECT_NE(log.find("loaded GPT2LMHeadModel logits differ by 0.0"), std::string::npos) << log;
  // Without the consolidated model, generation says to export first.
  const auto shards_only =
      run("full_shard-2-shards-only", 2, "dist.sharding=full_shard dist.consolidated_checkpoints=false") /
      "checkpoint-20";
  EXPECT_FALSE(stdfs::exists(shards_only / "model.safetensors"));
  EXPECT_NE(anvil::testing::run(
                anvil::testing::cli_bin() + " generate --model " + shards_only.string() + " --prompt hi", &log),
            0);
  EXPECT_NE(log.find("a sharded checkpoint (written by a multi-process or sharded run); consolidate it first with: "
                     "anvil export --checkpoint"),
            std::string::npos)
      << log;
  auto resume_from = [&](const std::string& name, int ranks, const std::string& extra) {
    const auto out = *dir_ / name;
    stdfs::create_directories(out);
    stdfs::copy(src, out / "checkpoint-20", stdfs::copy_options::recursive);
    const auto cmd = mpirun(ranks) + anvil::testing::trainer_bin() + " --config " + cfg().string() +
                     " output_dir=" + out.string() + " train.max_steps=22 " + extra;
    EXPECT_NE(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + cmd, &log), 0) << name;
    return log;
  };
  // A different model shape: the resume's config check names the key first;
  // allowed anyway, the sharded loader names the unit.
  log = resume_from("wider-from-sharded", 2, "dist.sharding=full_shard model.hidden_size=64");
  EXPECT_NE(log.find("in keys that change training:\n  model.hidden_size: 32 -> 64\n"), std::string::npos) << log;
  log = resume_from("wider-allowed", 2, "dist.sharding=full_shard model.hidden_size=64 train.allow_config_change=true");
  EXPECT_NE(log.find("sharding.json: unit 0 is \"transformer.h.0\" of 12704 elements, this model's is "
                     "\"transformer.h.0\" of"),
            std::string::npos)
      << log;
}

// An error on one rank alone (here: a bad data line only rank 1 reads, via
// mpirun's MPMD form) ends the whole run at once, not after dist.timeout_s:
// the failing rank leaves without MPI_Finalize, which would wait for peers
// blocked in a collective.
TEST_F(DistRuns, AnErrorOnOneRankEndsTheRunAtOnce) {
  anvil::testing::write_text(*dir_ / "bad.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\nnot json\n");
  auto text = anvil::testing::read_text(cfg());
  text.replace(text.find("data/sft_train.jsonl"), std::string("data/sft_train.jsonl").size(),
               (*dir_ / "bad.jsonl").string());
  anvil::testing::write_text(*dir_ / "bad.yaml", text);
  const auto out = (*dir_ / "mpmd").string();
  const auto cmd = "cd " + anvil::testing::source_dir() +
                   " && timeout 120 mpirun --allow-run-as-root --oversubscribe " + "--bind-to none -np 1 " +
                   anvil::testing::trainer_bin() + " --config " + cfg().string() + " output_dir=" + out + " : -np 1 " +
                   anvil::testing::trainer_bin() + " --config " + (*dir_ / "bad.yaml").string() + " output_dir=" + out;
  std::string log;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = anvil::testing::run(cmd, &log);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(rc, 0);
  EXPECT_LT(seconds, 30) << log;  // dist.timeout_s is 600
  EXPECT_NE(log.find("bad.jsonl:2: not valid JSON"), std::string::npos) << log;
}

/// Pid of the trainer process with OMPI_COMM_WORLD_RANK=`rank` writing to `out`.
pid_t find_rank(int rank, const stdfs::path& out) {
  for (const auto& e : stdfs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline"), env(e.path() / "environ");
    std::string c((std::istreambuf_iterator<char>(cmd)), {}), v((std::istreambuf_iterator<char>(env)), {});
    if (c.find("output_dir=" + out.string()) == std::string::npos || c.find("mpirun") == 0) continue;
    if (v.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

struct Outcome {
  int rc = 0;
  double seconds = 0;
  std::string log;
};

/// Starts a long 2-rank run, does `to_rank1(pid)` once it trains, and times
/// how long mpirun takes to end.
Outcome fail_rank_one(const stdfs::path& cfg, const stdfs::path& out, int sig, const std::string& extra = "") {
  const auto log = out.string() + ".log";
  const auto cmd = "cd " + anvil::testing::source_dir() + " && exec " + mpirun(2) + anvil::testing::trainer_bin() +
                   " --config " + cfg.string() + " output_dir=" + out.string() +
                   " train.max_steps=100000 train.save_every=0 train.eval_every=0 dist.timeout_s=4 " + extra + " > " +
                   log + " 2>&1";
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait until both ranks train (a few steps in metrics.jsonl).
  pid_t victim = -1;
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (read_metrics(out / "metrics.jsonl").size() >= 3 && (victim = find_rank(1, out)) > 0) break;
  }
  Outcome o;
  EXPECT_GT(victim, 0) << "rank 1 never started training";
  if (victim <= 0) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    return o;
  }
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(victim, sig);
  int status = 0;
  // Give up after 60 s (the survivors' timeout is 4 s).
  for (int i = 0; i < 600 && ::waitpid(launcher, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (::waitpid(launcher, &status, WNOHANG) == 0) {
    ADD_FAILURE() << "the run still hangs 60 s after rank 1 stopped";
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &status, 0);
  }
  ::kill(victim, SIGKILL);  // a stopped rank that mpirun could not end
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.log = anvil::testing::read_text(log);
  return o;
}

TEST_F(DistRuns, AHungRankMakesTheOthersExitWithAClearErrorWithinTheTimeout) {
  const auto o = fail_rank_one(cfg(), *dir_ / "hung", SIGSTOP);
  EXPECT_NE(o.rc, 0);
  EXPECT_LT(o.seconds, 4 + 15) << o.log;
  EXPECT_NE(o.log.find("rank 0 of 2: mpi "), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("did not complete within 4 s (dist.timeout_s): another rank died, hangs"), std::string::npos)
      << o.log;
}

// Under tensor parallelism the survivor waits in its group's collective (nearly every collective of a step is
// one: the layers' all-reduces and the gradient norm's), and the watchdog names that group.
TEST_F(DistRuns, AHungRankOfATensorParallelGroupIsNamedByTheWatchdog) {
  const auto o = fail_rank_one(cfg(), *dir_ / "hung-tp", SIGSTOP, "dist.tensor_parallel=2");
  EXPECT_NE(o.rc, 0);
  EXPECT_LT(o.seconds, 4 + 15) << o.log;
  EXPECT_NE(o.log.find("rank 0 of 2: mpi (tensor parallel) all_reduce (tensor parallel"), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("did not complete within 4 s (dist.timeout_s): another rank died, hangs"), std::string::npos)
      << o.log;
}

TEST_F(DistRuns, AKilledRankEndsTheRun) {
  const auto o = fail_rank_one(cfg(), *dir_ / "killed", SIGKILL);
  EXPECT_NE(o.rc, 0);
  EXPECT_LT(o.seconds, 4 + 15) << o.log;
  // mpirun names the rank that died and ends the others.
  EXPECT_NE(o.log.find("process rank 1"), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("exited on signal 9"), std::string::npos) << o.log;
}

TEST_F(DistRuns, SigtermOnOneRankStopsEveryRankAtOneSavedStep) {
  const auto out = *dir_ / "term";
  const auto o = fail_rank_one(cfg(), out, SIGTERM, "dist.sharding=full_shard");
  EXPECT_EQ(o.rc, 0) << o.log;
  const auto metrics = read_metrics(out / "metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  const auto ckpt = out / ("checkpoint-" + std::to_string(metrics.rbegin()->first));
  EXPECT_TRUE(stdfs::exists(ckpt / "trainer_state.json")) << o.log;
  EXPECT_TRUE(stdfs::exists(ckpt / "shards" / "shard-00000-of-00002.safetensors"));
  EXPECT_TRUE(stdfs::exists(ckpt / "shards" / "shard-00001-of-00002.safetensors"));
}

// The reward and DPO objectives' statistics (accuracies, margins, rewards)
// are summed over ranks like the loss; DPO's reference is held sharded.
TEST_F(DistRuns, RewardAndDpoOnTwoRanksMatchOneProcess) {
  for (const char* algorithm : {"reward", "dpo"}) {
    const auto cfg_path = *dir_ / (std::string(algorithm) + ".yaml");
    anvil::testing::write_text(cfg_path, std::string("algorithm: ") + algorithm + R"(
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/pref_train.jsonl}], eval: [{path: data/pref_eval.jsonl}]}
optimizer: {lr: 3.0e-3}
train: {max_steps: 6, micro_batch_size: 2, global_batch_size: 8, eval_every: 3, log_every: 1000, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 0}
)");
    const auto one = *dir_ / (std::string(algorithm) + "-1"), two = *dir_ / (std::string(algorithm) + "-2");
    train(cfg_path, one, 0);
    std::string log;
    train(cfg_path, two, 2, "dist.sharding=full_shard", &log);
    // DPO as 2 x 2 hybrid ranks too: the frozen reference shards within the replica groups like the policy.
    const auto hybrid = *dir_ / (std::string(algorithm) + "-2x2");
    if (std::string(algorithm) == "dpo") train(cfg_path, hybrid, 4, "dist.sharding=full_shard dist.replicate=2");
    // DPO's frozen reference is sharded like the policy, not a whole copy per rank.
    if (std::string(algorithm) == "dpo")
      EXPECT_NE(log.find("parameter bytes on this rank: full_shard over 2 ranks"), std::string::npos) << log;
    const auto a = read_metrics(one / "metrics.jsonl");
    ASSERT_EQ(a.size(), 6u) << algorithm;
    for (const auto& other : {two, hybrid}) {
      if (!stdfs::exists(other)) continue;
      const auto b = read_metrics(other / "metrics.jsonl");
      ASSERT_EQ(b.size(), 6u) << other;
      for (const auto& [step, m] : a)
        for (const auto& [key, v] : m.items()) {
          if (!v.is_number() || key == "tokens_per_s" || key.rfind("memory/", 0) == 0) continue;
          ASSERT_TRUE(b.at(step).contains(key)) << other << " step " << step << " lacks " << key;
          const double x = v.get<double>(), y = b.at(step)[key].get<double>();
          EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(x) + 1e-6) << other << " step " << step << " " << key;
        }
    }
  }
}

// A run from a model folder under full_shard builds the model without storage
// and reads each rank's ranges of the folder's weights into its shards: the
// policy, and DPO's reference, a copy of the policy's initial weights read
// from the same files. It trains as one process does from the same folder.
// dpo.precompute_reference on several ranks: each rank scores every world-th batch and the caches are summed, so
// every rank writes the cache one process writes, bit for bit, and trains the same (an uneven tail, which every
// rank runs since the sharded reference's forwards are collectives: 3 held-out batches on 2 ranks, 16 training
// batches on 3).
TEST_F(DistRuns, ReferenceCachesAreSplitAmongRanksAndEqualOneProcess) {
  // The first 62 training pairs (16 batches of 4) and 10 held-out ones (3 batches): the caches score them all.
  const auto head = [&](const std::string& from, size_t lines) {
    std::istringstream in(anvil::testing::read_text(anvil::testing::source_dir() + "/" + from));
    std::string text, line;
    for (size_t i = 0; i < lines && std::getline(in, line); ++i) text += line + "\n";
    const auto path = *dir_ / stdfs::path(from).filename();
    anvil::testing::write_text(path, text);
    return path.string();
  };
  const auto cfg_path = *dir_ / "dpo-cached.yaml";
  anvil::testing::write_text(
      cfg_path, concat(R"(algorithm: dpo
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: )",
                       head("data/pref_train.jsonl", 62), "}], eval: [{path: ", head("data/pref_eval.jsonl", 10),
                       R"(}]}
optimizer: {lr: 3.0e-3}
dpo: {precompute_reference: true}
train: {max_steps: 4, micro_batch_size: 2, global_batch_size: 12, eval_every: 4, log_every: 1000, threads: 1}
eval: {batch_size: 4, max_batches: 2, generate_samples: 0}
)"));
  const auto one = *dir_ / "dpo-cached-1";
  train(cfg_path, one, 0);
  const auto want = io::load_safetensors(one / "reference_logps.safetensors");
  ASSERT_FALSE(want.empty());
  const auto a = read_metrics(one / "metrics.jsonl");
  for (const int ranks : {2, 3}) {
    const auto out = *dir_ / ("dpo-cached-" + std::to_string(ranks));
    std::string log;
    train(cfg_path, out, ranks, "dist.sharding=full_shard", &log);
    EXPECT_NE(log.find("(split over " + std::to_string(ranks) + " ranks)"), std::string::npos) << log;
    const auto got = io::load_safetensors(out / "reference_logps.safetensors");
    ASSERT_EQ(got.size(), want.size()) << ranks;
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << ranks << " " << name;
      EXPECT_TRUE(at::equal(got.at(name), t)) << ranks << " ranks: " << name;
    }
    expect_close_losses(a, read_metrics(out / "metrics.jsonl"), 1, 4, 1e-5, concat("dpo cached, ", ranks, " ranks"));
  }
}

TEST_F(DistRuns, FromAFolderEachRankReadsItsShardsAndTrainsLikeOneProcess) {
  const auto cfg_path = *dir_ / "dpo-from.yaml";
  anvil::testing::write_text(cfg_path, "algorithm: dpo\nmodel: {from: " + (plain() / "checkpoint-20").string() + R"(}
data: {train: [{path: data/pref_train.jsonl}], eval: [{path: data/pref_eval.jsonl}]}
optimizer: {lr: 3.0e-3}
train: {max_steps: 4, micro_batch_size: 2, global_batch_size: 8, eval_every: 2, log_every: 1000, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 0}
)");
  const auto one = *dir_ / "dpo-from-1", two = *dir_ / "dpo-from-2";
  ASSERT_EQ(train(cfg_path, one, 0), 0);
  std::string log;
  ASSERT_EQ(train(cfg_path, two, 2, "dist.sharding=full_shard", &log), 0);
  EXPECT_NE(log.find("each rank reads its shards of the weights"), std::string::npos) << log;
  const auto a = read_metrics(one / "metrics.jsonl"), b = read_metrics(two / "metrics.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  int compared = 0;
  for (const auto& [step, m] : a)
    for (const auto& [key, v] : m.items()) {
      if (!v.is_number() || key == "tokens_per_s" || key.rfind("memory/", 0) == 0 || key.rfind("time/", 0) == 0)
        continue;
      ASSERT_TRUE(b.at(step).contains(key)) << "step " << step << " lacks " << key;
      const double x = v.get<double>(), y = b.at(step)[key].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(x) + 1e-6) << "step " << step << " " << key;
      ++compared;
    }
  EXPECT_GT(compared, 20);
}

// LoRA adapters on the plain run's checkpoint: full_shard on 2 ranks trains
// like one process, writes the same PEFT adapter, and resumes bit-identically.
TEST_F(DistRuns, LoraFullShardOnTwoRanksMatchesOneProcessAndResumes) {
  const auto cfg_path = *dir_ / "lora.yaml";
  anvil::testing::write_text(cfg_path, "model: {from: " + (plain() / "checkpoint-20").string() + R"(}
lora: {r: 4, alpha: 8, dropout: 0.0, target_modules: [c_attn, c_fc]}
data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}]}
optimizer: {lr: 1.0e-2, weight_decay: 0.01}
schedule: {warmup_steps: 2}
train: {max_steps: 20, micro_batch_size: 2, global_batch_size: 12, save_every: 10, eval_every: 10,
        keep_checkpoints: 0, log_every: 1000, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 2, max_new_tokens: 6, table_rows: 0}
)");
  const auto one = *dir_ / "lora-1", two = *dir_ / "lora-2", resumed = *dir_ / "lora-2-resumed";
  train(cfg_path, one, 0);
  train(cfg_path, two, 2, "dist.sharding=full_shard");
  const auto a = read_metrics(one / "metrics.jsonl"), b = read_metrics(two / "metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  expect_close_losses(a, b, 1, 20, 1e-5, "LoRA: 1 process vs 2 full_shard ranks");
  double b_norm = 0;  // B starts at zero: a trained adapter has moved it
  for (const auto& [name, t] : io::load_safetensors(one / "checkpoint-20" / "adapter_model.safetensors"))
    if (name.find("lora_B") != std::string::npos) b_norm += t.abs().sum().item<double>();
  EXPECT_GT(b_norm, 0.0) << "the adapters train";
  // Both checkpoints are adapter folders with the same adapter.
  for (const auto& d : {one, two}) {
    EXPECT_TRUE(stdfs::exists(d / "checkpoint-20" / "adapter_config.json")) << d;
    EXPECT_FALSE(stdfs::exists(d / "checkpoint-20" / "model.safetensors")) << d;
  }
  // 20 AdamW steps at lr 1e-2 carry the reductions' round-off into the adapters: the largest difference over
  // 9 seeds was 1.28e-5 (this seed; the others 2e-7 to 1.5e-6, Intel Xeon, 2026-12-05).
  EXPECT_LE(max_param_diff(one / "checkpoint-20" / "adapter_model.safetensors",
                           two / "checkpoint-20" / "adapter_model.safetensors"),
            5e-5);
  // The frozen base is in units of its own ("<block>.frozen", "root.frozen"): each rank holds its shard of it in
  // dist.param_dtype and nothing else (no master, gradient or moments); the adapters' units hold the rest.
  const auto meta = nlohmann::json::parse(anvil::testing::read_text(two / "checkpoint-20" / "sharding.json"));
  int64_t trained = 0, frozen = 0, frozen_units = 0;  // elements per rank (2 ranks: half of each unit, rounded up)
  for (const auto& u : meta["units"]) {
    const int64_t half = (u["numel"].get<int64_t>() + 1) / 2;
    if (u.value("frozen", false))
      frozen += half, ++frozen_units;
    else
      trained += half;
  }
  EXPECT_EQ(frozen_units, 5) << "the 4 blocks' base and the root (embeddings, norm, head)";
  EXPECT_GT(frozen, 10 * trained) << "LoRA trains a small part";
  const auto mem = b.at(20);
  EXPECT_EQ(mem["memory/optimizer_bytes"].get<double>(), 8.0 * static_cast<double>(trained));
  EXPECT_EQ(mem["memory/gradient_bytes"].get<double>(), 4.0 * static_cast<double>(trained));
  EXPECT_EQ(mem["memory/parameter_bytes"].get<double>(), 4.0 * static_cast<double>(trained + frozen))
      << "float32 masters of the adapters and float32 (dist.param_dtype) shards of the base, nothing gathered";
  // bfloat16 parameters: 2 bytes per frozen parameter; the plan says what the run holds.
  const auto bf16 = *dir_ / "lora-2-bf16";
  train(cfg_path, bf16, 2, "dist.sharding=full_shard dist.param_dtype=bfloat16 train.max_steps=2");
  EXPECT_EQ(read_metrics(bf16 / "metrics.jsonl").at(2)["memory/parameter_bytes"].get<double>(),
            4.0 * static_cast<double>(trained) + 2.0 * static_cast<double>(frozen));
  std::string plan;
  ASSERT_EQ(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                                    " --config " + cfg_path.string() + " output_dir=" + (*dir_ / "unused").string() +
                                    " dist.sharding=full_shard dist.param_dtype=bfloat16 --plan-memory --world-size 2",
                                &plan),
            0)
      << plan;
  const auto planned = [&](const std::string& label) {  // "<label>N.NN kB"
    const auto at = plan.find(label);
    EXPECT_NE(at, std::string::npos) << label << " in\n" << plan;
    return at == std::string::npos ? -1.0 : std::stod(plan.substr(at + label.size())) * 1e3;
  };
  EXPECT_NEAR(planned("float32 masters "), 4.0 * static_cast<double>(trained),
              0.01 * 4.0 * static_cast<double>(trained))
      << plan;
  EXPECT_NEAR(planned("no gradient or moments): "), 2.0 * static_cast<double>(frozen),
              0.01 * 2.0 * static_cast<double>(frozen))
      << plan;
  stdfs::create_directories(resumed);
  stdfs::copy(two / "checkpoint-10", resumed / "checkpoint-10", stdfs::copy_options::recursive);
  train(cfg_path, resumed, 2, "dist.sharding=full_shard");
  const auto c = read_metrics(resumed / "metrics.jsonl");
  ASSERT_EQ(c.size(), 10u);
  for (int64_t s = 11; s <= 20; ++s)
    EXPECT_EQ(c.at(s)["loss"].get<double>(), b.at(s)["loss"].get<double>()) << "step " << s;
}

// Evaluation split among ranks: each answers every world-th prompt and the
// counts are summed. Two ranks are simulated in one process (rank 1 runs
// first and hands its count to rank 0's sum).
TEST(RankSplitEval, ExactMatchCountsEveryPromptOnce) {
  config::ModelConfig mc;
  mc.family = "gpt2", mc.vocab_size = 0, mc.hidden_size = 32, mc.num_hidden_layers = 2, mc.num_attention_heads = 4;
  mc.max_position_embeddings = 32;
  auto tok = tokenizer::load_tokenizer("auto", anvil::testing::source_dir() + "/data/tokenizer.model");
  mc.vocab_size = tok->vocab_size();
  torch::manual_seed(5);
  auto model = models::family_by_name("gpt2").from_config(mc);
  model->eval();
  config::EvalConfig eval;
  eval.max_new_tokens = 4;
  eval.batch_size = 1;  // no padding: every split generates the same tokens
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> texts;
  for (const char* p : {"reverse: abc\n", "upper: xy\n", "sort: dcba\n", "add: 3 4\n", "reverse: q\n"}) {
    prompts.push_back(tok->encode(p));
    texts.push_back(p);
  }
  // References: what the model says for prompts 0, 1 and 3, wrong for 2 and 4.
  train::EvalResult probe;
  std::vector<std::string> refs(prompts.size(), "\x01");
  eval.table_rows = static_cast<int64_t>(prompts.size());
  train::exact_match_eval(*model, *tok, eval, -1, prompts, texts, refs, probe);
  for (size_t i : {0, 1, 3}) refs[i] = probe.samples[i][1];
  eval.table_rows = 0;

  train::EvalResult whole, rank0, rank1;
  train::exact_match_eval(*model, *tok, eval, -1, prompts, texts, refs, whole);
  EXPECT_DOUBLE_EQ(whole.metrics.at("eval/exact_match"), 3.0 / 5.0);
  std::vector<double> from_rank1;
  train::RankContext r1{1, 2, [&](std::vector<double>& v) { from_rank1 = v; }};
  train::exact_match_eval(*model, *tok, eval, -1, prompts, texts, refs, rank1, r1);
  ASSERT_EQ(from_rank1.size(), 1u);
  EXPECT_EQ(from_rank1[0], 2.0);  // rank 1 answers prompts 1 and 3, both right
  train::RankContext r0{0, 2, [&](std::vector<double>& v) { v[0] += from_rank1[0]; }};
  train::exact_match_eval(*model, *tok, eval, -1, prompts, texts, refs, rank0, r0);
  EXPECT_DOUBLE_EQ(rank0.metrics.at("eval/exact_match"), whole.metrics.at("eval/exact_match"));
}

// Activation checkpointing in-process: the same gradients, dropout included
// (the RNG state of the forward is restored for the recomputation).
TEST(ActivationCheckpointing, SameGradientsWithDropout) {
  for (const auto& family : models::family_names()) {
    config::ModelConfig mc;
    mc.family = family;
    mc.vocab_size = 50, mc.hidden_size = 32, mc.num_hidden_layers = 3, mc.num_attention_heads = 4,
    mc.max_position_embeddings = 16;
    mc.dropout = 0.2;
    torch::manual_seed(3);
    auto model = models::family_by_name(family).from_config(mc);
    model->train();
    auto ids = at::randint(50, {2, 12}, at::kLong);
    auto grads = [&](bool checkpointed) {
      if (checkpointed)
        model->set_block_runner([](size_t, const at::Tensor& x, const models::BlockFn& block) {
          return models::checkpoint_block(block, x);
        });
      else
        model->set_block_runner(nullptr);
      for (auto& p : model->parameters()) p.mutable_grad().reset();
      torch::manual_seed(7);
      auto logits = model->forward(ids);
      logits.pow(2).mean().backward();
      std::vector<at::Tensor> g;
      // An expert no token chose has no gradient (as in transformers).
      for (auto& p : model->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
      return std::make_pair(logits.detach(), g);
    };
    const auto [l0, g0] = grads(false);
    const auto [l1, g1] = grads(true);
    EXPECT_TRUE(at::equal(l0, l1)) << family;
    ASSERT_EQ(g0.size(), g1.size());
    for (size_t i = 0; i < g0.size(); ++i)
      EXPECT_LE((g0[i] - g1[i]).abs().max().item<double>(), 1e-7) << family << " parameter " << i;
  }
}

using anvil::testing::files_below;

// Sharded saves written in the background (each rank's thread writes its
// shard, rank 0's publishes once every rank has marked its shard written)
// put on disk byte for byte what saves written at once between barriers put
// there; a kill of every rank while rank 0 is about to publish leaves the
// previous checkpoint the newest complete one, and the run resumes from it
// bit for bit, and so it does after a kill in the middle of that resume.
TEST_F(DistRuns, BackgroundShardedSavesEqualSavesAtOnceAndAKillMidWriteLosesNothing) {
  // Its own run, for its log: a write still running at the last line reports its time in the log only, so
  // metrics.jsonl need not hold time/checkpoint_write_s on a loaded machine.
  const auto straight = *dir_ / "full_shard-2-background";
  std::string log;
  ASSERT_EQ(train(cfg(), straight, 2, "dist.sharding=full_shard", &log), 0);
  for (const char* ckpt : {"checkpoint-10 in the background", "checkpoint-20 in the background"})
    EXPECT_NE(log.find(ckpt), std::string::npos) << "the saves ran in the background\n" << log;
  const auto at_once = *dir_ / "full_shard-2-sync";
  const auto launch = [&](const std::string& env, const stdfs::path& out) {
    return "cd " + anvil::testing::source_dir() + " && " + env + " exec mpirun --allow-run-as-root --oversubscribe " +
           "--bind-to none -x " + env.substr(0, env.find('=')) + " -np 2 " + anvil::testing::trainer_bin() +
           " --config " + cfg().string() + " output_dir=" + out.string() + " dist.sharding=full_shard";
  };
  ASSERT_EQ(anvil::testing::run(launch("ANVIL_CHECKPOINT_SYNC=1", at_once) + " 2>&1", &log), 0) << log;
  for (const char* ckpt : {"checkpoint-10", "checkpoint-20"}) {
    const auto files = files_below(straight / ckpt);
    ASSERT_EQ(files, files_below(at_once / ckpt)) << ckpt;
    EXPECT_GE(files.size(), 8u);  // sharding.json, 2 shards, 2 rng, model, config files, trainer state
    for (const auto& f : files) {
      if (f == "config.yaml") continue;  // the run's config: its output_dir differs
      EXPECT_TRUE(anvil::testing::read_text(straight / ckpt / f) == anvil::testing::read_text(at_once / ckpt / f))
          << ckpt << "/" << f.string() << " differs";
    }
  }

  // Every write pauses 1 s before it copies and 1 s before trainer_state.json:
  // the kill lands while checkpoint-20's folder waits for that file.
  const auto out = *dir_ / "full_shard-2-killed";
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    const auto cmd = launch("ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS=1000", out) + " > " + out.string() + ".log 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto tmp = out / ".checkpoint-20.tmp-sharded";
  for (int i = 0; i < 1200 && !stdfs::exists(tmp / "config.yaml"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool seen = stdfs::exists(tmp / "config.yaml");
  for (int r : {0, 1})
    if (const pid_t p = find_rank(r, out); p > 0) ::kill(p, SIGKILL);
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  ASSERT_TRUE(seen) << anvil::testing::read_text(out.string() + ".log");
  EXPECT_FALSE(stdfs::exists(out / "checkpoint-20"));
  EXPECT_FALSE(stdfs::exists(tmp / "trainer_state.json"));
  EXPECT_TRUE(stdfs::exists(out / "checkpoint-10" / "trainer_state.json"));

  // A kill of every rank mid-resume (each unit's read waits 300 ms) changes nothing on disk: the resume reads.
  const auto bytes_of = [](const stdfs::path& ckpt) {
    std::map<stdfs::path, std::string> b;
    for (const auto& f : files_below(ckpt)) b[f] = anvil::testing::read_text(ckpt / f);
    return b;
  };
  const auto before = bytes_of(out / "checkpoint-10");
  const pid_t resumer = ::fork();
  if (resumer == 0) {
    const auto cmd = launch("ANVIL_TEST_RESUME_UNIT_DELAY_MS=300", out) + " > " + out.string() + "-resume.log 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  bool reading = false;
  for (int i = 0; i < 1200 && !reading; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto text = anvil::testing::read_text(out.string() + "-resume.log");
    reading = text.find("the resume reads unit 2 of") != std::string::npos;
  }
  for (int r : {0, 1})
    if (const pid_t p = find_rank(r, out); p > 0) ::kill(p, SIGKILL);
  ::kill(resumer, SIGKILL);
  ::waitpid(resumer, nullptr, 0);
  ASSERT_TRUE(reading) << anvil::testing::read_text(out.string() + "-resume.log");
  EXPECT_TRUE(bytes_of(out / "checkpoint-10") == before) << "a killed resume changed checkpoint-10";
  EXPECT_FALSE(stdfs::exists(out / "checkpoint-20"));

  train(cfg(), out, 2, "dist.sharding=full_shard", &log);
  EXPECT_NE(log.find("resumed from " + (out / "checkpoint-10").string() + " at step 10"), std::string::npos) << log;
  const auto a = read_metrics(straight / "metrics.jsonl"), b = read_metrics(out / "metrics.jsonl");
  for (int64_t s = 11; s <= 20; ++s) {
    ASSERT_TRUE(b.count(s)) << "step " << s;
    EXPECT_EQ(b.at(s)["loss"].get<double>(), a.at(s)["loss"].get<double>()) << "step " << s;  // bit for bit
  }
  EXPECT_TRUE(stdfs::exists(out / "checkpoint-20" / "trainer_state.json"));
}

}  // namespace
}  // namespace anvil::distributed
