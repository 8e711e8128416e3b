// The trainer under dist.context_parallel (distributed/context_parallel.h, models/context_parallel.h): each rank of
// a context-parallel group runs a head and a tail chunk of every row, attention gathering the group's keys and
// values. Padded SFT rows (GPT-2) at cp 2, cp 2 x full_shard 2 and tp 2 x cp 2, and packed rows of a Mistral (its
// window crossing the chunks) at cp 2, train as one process does: per-step loss, gradient norm and eval loss within
// 1e-5, the final weights within 1e-5. Its checkpoints hold whole parameters (the ranks of a group hold the same ones),
// so one process continues a cp 2 x full_shard 2 run within 1e-5. Ring attention (dist.context_parallel_mode: ring)
// trains the same runs, alone and with tensor and sequence parallelism, and holds less than the all-gather at rows
// of 1024; hybrid sharding splits the 4 ranks into 2 replica groups. Launches the mesh cannot take are refused by
// key. The model-level checks, every family's logits and gradients on cp 2, tp 2 x cp 2 and (ring) cp 4, are
// TensorParallelRanks' (tensor_parallel_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "distributed/dist_runs.h"
#include "test_util.h"

namespace anvil::distributed {
namespace {

namespace stdfs = std::filesystem;

TEST(ContextParallelRuns, TrainLikeOneProcessOnEveryMeshAndResumeOnOne) {
  anvil::testing::TempDir dir;
  const auto cfg = dir / "run.yaml";
  std::string run = kRun;
  const auto steps = run.find("max_steps: 20");
  run.replace(steps, std::string("max_steps: 20").size(), "max_steps: 6");
  run.replace(run.find("save_every: 10"), std::string("save_every: 10").size(), "save_every: 3");
  run.replace(run.find("eval_every: 10"), std::string("eval_every: 10").size(), "eval_every: 3");
  anvil::testing::write_text(cfg, run);
  train(cfg, dir / "plain", 0);
  const auto plain = read_metrics(dir / "plain" / "metrics.jsonl");
  ASSERT_EQ(plain.size(), 6u);
  const auto check = [&](const std::string& name, int ranks, const std::string& extra, const std::string& says) {
    std::string log;
    train(cfg, dir / name, ranks, extra, &log);
    EXPECT_NE(log.find(says), std::string::npos) << log;
    expect_close_losses(plain, read_metrics(dir / name / "metrics.jsonl"), 1, 6, 1e-5, name);
    EXPECT_LE(max_param_diff(dir / "plain" / "checkpoint-6" / "model.safetensors", dir / name / "checkpoint-6"), 1e-5)
        << name;
  };
  check("cp2", 2, "dist.context_parallel=2", "no_shard, context parallel 2 x data parallel 1");
  const std::string fsdp = "dist.context_parallel=2 dist.sharding=full_shard";
  check("cp2-fsdp2", 4, fsdp, "full_shard, context parallel 2 x data parallel 2");
  check("tp2-cp2", 4, "dist.context_parallel=2 dist.tensor_parallel=2",
        "no_shard, tensor parallel 2, context parallel 2 x data parallel 1");
  // Ring attention: the key/value shares passed around the group instead of gathered; with tensor and sequence
  // parallelism on 4 ranks; hybrid sharding, each replica group a context-parallel pair.
  const std::string ring = "dist.context_parallel=2 dist.context_parallel_mode=ring";
  check("cp2-ring", 2, ring, "no_shard, context parallel 2 (ring) x data parallel 1");
  check("tp2-cp2-ring", 4, ring + " dist.tensor_parallel=2 dist.sequence_parallel=true",
        "no_shard, tensor parallel 2 (sequence parallel), context parallel 2 (ring) x data parallel 1");
  check("cp2-hsdp", 4, fsdp + " dist.replicate=2",
        "full_shard, hybrid: 2 replicas of 2 ranks, context parallel 2 x data parallel 2");
  // One process continues the cp 2 x full_shard 2 run from its step-3 checkpoint.
  {
    const auto out = dir / "to-plain";
    stdfs::create_directories(out);
    stdfs::copy(dir / "cp2-fsdp2" / "checkpoint-3", out / "checkpoint-3", stdfs::copy_options::recursive);
    train(cfg, out, 0);
    expect_close_losses(read_metrics(dir / "cp2-fsdp2" / "metrics.jsonl"), read_metrics(out / "metrics.jsonl"), 4, 6,
                        1e-5, "cp 2 x full_shard 2 -> plain");
  }
  // Packed rows of 32 (documents restart their positions; the mask is the documents') through Mistral: LLaMA's
  // layout with grouped-query heads and a window of 4 that crosses the chunks.
  {
    std::string mistral = run;
    const auto at = mistral.find("model: {");
    mistral.replace(at, mistral.find('\n', at) - at,
                    "model: {family: mistral, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, "
                    "num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 64, sliding_window: 4}");
    const auto mcfg = dir / "mistral.yaml";
    anvil::testing::write_text(mcfg, mistral);
    const std::string packed = "data.packing=true data.max_length=32 train.save_every=0";
    train(mcfg, dir / "mistral-plain", 0, packed);
    train(mcfg, dir / "mistral-cp2", 2, packed + " dist.context_parallel=2");
    expect_close_losses(read_metrics(dir / "mistral-plain" / "metrics.jsonl"),
                        read_metrics(dir / "mistral-cp2" / "metrics.jsonl"), 1, 6, 1e-5, "mistral, packed rows, cp 2");
    train(mcfg, dir / "mistral-cp2-ring", 2, packed + " " + ring);
    expect_close_losses(read_metrics(dir / "mistral-plain" / "metrics.jsonl"),
                        read_metrics(dir / "mistral-cp2-ring" / "metrics.jsonl"), 1, 6, 1e-5,
                        "mistral, packed rows, cp 2, ring");
  }
  // Memory per rank, measured: rows of 1024 packed positions, 2 ranks each holding one row (data parallel) or half
  // of two (cp 2): the step's CPU tensor peak (the small state plus the activations, attention's scores the
  // largest) is about half, the keys and values gathered whole being what stays.
  {
    const std::string rows =
        "model.max_position_embeddings=1024 data.packing=true data.max_length=1024 "
        "train.micro_batch_size=1 train.global_batch_size=2 train.max_steps=2 train.save_every=0 "
        "train.eval_every=0 eval.generate_samples=0";
    train(cfg, dir / "long-dp2", 2, rows + " dist.sharding=no_shard");
    train(cfg, dir / "long-cp2", 2, rows + " dist.context_parallel=2");
    const auto dp2 = read_metrics(dir / "long-dp2" / "metrics.jsonl").at(2),
               cp2 = read_metrics(dir / "long-cp2" / "metrics.jsonl").at(2);
    EXPECT_NEAR(cp2["loss"].get<double>(), dp2["loss"].get<double>(), 1e-5 * dp2["loss"].get<double>());
    const double peak = cp2["memory/cpu_peak_bytes"].get<double>() / dp2["memory/cpu_peak_bytes"].get<double>();
    std::cout << "[dist] cp 2 / dp 2 per rank, rows of 1024: step tensor peak " << peak << "\n";
    EXPECT_LT(peak, 0.65);
    // Ring mode holds its own share and one passing share of keys and values, never the whole row's.
    train(cfg, dir / "long-cp2-ring", 2, rows + " " + ring);
    const auto cp2_ring = read_metrics(dir / "long-cp2-ring" / "metrics.jsonl").at(2);
    EXPECT_NEAR(cp2_ring["loss"].get<double>(), dp2["loss"].get<double>(), 1e-5 * dp2["loss"].get<double>());
    const double ring_peak =
        cp2_ring["memory/cpu_peak_bytes"].get<double>() / dp2["memory/cpu_peak_bytes"].get<double>();
    std::cout << "[dist] cp 2 ring / dp 2 per rank, rows of 1024: step tensor peak " << ring_peak << "\n";
    EXPECT_LT(ring_peak, peak);
  }
  // Refused by key.
  const auto refused = [&](int ranks, const std::string& extra) {
    return refused_run(cfg, dir / "refused", ranks, extra);
  };
  EXPECT_NE(refused(0, "dist.context_parallel=2")
                .find("dist.context_parallel: 2 splits each row across that many "
                      "ranks, and this run has 1"),
            std::string::npos);
  EXPECT_NE(refused(2, "dist.context_parallel=2 data.packing=true data.max_length=30")
                .find("data.max_length: packed rows of 30 positions do not split into 2 x dist.context_parallel = 4 "
                      "chunks"),
            std::string::npos);
  EXPECT_NE(
      refused(0, "algorithm=dpo dist.context_parallel=2").find("dist.context_parallel: not read by algorithm dpo"),
      std::string::npos);
  EXPECT_NE(refused(2, ring + " model.dropout=0.1")
                .find("dist.context_parallel_mode: ring attention has no attention dropout (the model's attn_pdrop is "
                      "0.1); set model.dropout: 0 or dist.context_parallel_mode: allgather"),
            std::string::npos);
}

}  // namespace
}  // namespace anvil::distributed
