// A randomly initialised model built without storage (models::build_deferred_random): what a rank of a
// sharded run holds while it reads its shards, measured from the process's high-water mark. The values
// themselves are checked bit for bit against the eager build for every family in families_test.cpp
// (Family.ADeferredRandomBuildReadsTheWeightsTheEagerBuildDraws).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"
#include "anvil/models/registry.h"
#include "core/host_memory.h"
#include "models/init.h"

namespace anvil::models {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// What a rank of 4 holds reading its quarter of every parameter of a randomly initialised GPT-2 of `layers`
/// blocks, as its shards of a flat unit per block would cut them: the process's high-water mark above what was
/// resident before the build (what the heap kept freed is given back first).
struct QuarterRead {
  double peak = 0, model_bytes = 0, shard_bytes = 0, seconds = 0;
  at::Tensor shards;
  config::ModelConfig config;
};

config::ModelConfig wide_gpt2(int64_t layers) {
  config::ModelConfig mc;
  mc.family = "gpt2";
  mc.vocab_size = 1000, mc.hidden_size = 1024, mc.num_hidden_layers = layers, mc.num_attention_heads = 8,
  mc.max_position_embeddings = 64;
  return mc;
}

QuarterRead read_quarters(const config::ModelConfig& mc) {
  const auto& family = family_by_name(mc.family);
  QuarterRead r;
  r.config = mc;
  return_free_host_memory();
  EXPECT_TRUE(reset_host_peak());
  const auto before = host_memory().resident;
  const auto start = std::chrono::steady_clock::now();
  at::manual_seed(3);
  auto model = build_deferred_random([&] { return family.from_config(mc); }, at::kCPU);
  EXPECT_NE(model, nullptr);
  if (!model) return r;
  // The rank's shards, allocated first as ShardedModel allocates a unit's, then filled read by read.
  int64_t total = 0, quarters = 0;
  for (const auto& p : model->named_parameters()) {
    total += p.value().numel();
    quarters += (p.value().numel() + 3) / 4;
  }
  r.shards = at::zeros({quarters}, at::kFloat);
  int64_t at_ = 0;
  for (const auto& p : model->named_parameters()) {
    const auto n = p.value().numel(), quarter = (n + 3) / 4;
    r.shards.narrow(0, at_, quarter).copy_(model->parameter_source->read(p.key(), n - quarter, quarter));
    at_ += quarter;
  }
  r.seconds = seconds_since(start);
  r.peak = static_cast<double>(host_memory().peak - before);
  r.model_bytes = 4.0 * static_cast<double>(total), r.shard_bytes = 4.0 * static_cast<double>(quarters);
  std::cout << "[random init] " << mc.num_hidden_layers << " blocks, " << total / 1e6 << " M parameters ("
            << r.model_bytes / 1e6 << " MB): a quarter of each built and read in " << r.seconds
            << " s; peak above the start " << r.peak / 1e6 << " MB\n";
  return r;
}

// GPT-2s of 4 and 20 blocks of 12.6 M parameters (hidden 1024, so the largest parameter is the same in both):
// the 16 more blocks (806 MB in float32) may raise the high-water mark by their quarter (202 MB) and the
// allocator's noise, never by half of them (which any whole copy of the model would pass). The difference of the
// two peaks leaves out most of what the process holds apart from the model: pages of code first run, threads'
// stacks and arenas, the replay's scratch buffer and a parameter drawn whole, measured from 18 MB to 104 MB above
// the shards, and not the same from one read to the next. The quarters are the eager build's last quarters, bit
// for bit.
TEST(RandomInit, ARankReadingItsShardsHoldsNoWholeModel) {
  // A small build and read first, so that the code they run (LibTorch's draw and copy kernels) is paged in
  // before the marks are reset: its pages would count as resident memory too.
  {
    auto small = wide_gpt2(1);
    small.hidden_size = 64, small.num_attention_heads = 4;
    at::manual_seed(3);
    const auto& family = family_by_name(small.family);
    auto warm = build_deferred_random([&] { return family.from_config(small); }, at::kCPU);
    ASSERT_NE(warm, nullptr);
    for (const auto& p : warm->named_parameters()) warm->parameter_source->read(p.key(), 0, p.value().numel());
  }
  if (!reset_host_peak()) GTEST_SKIP() << "this kernel does not reset the high-water mark (/proc/self/clear_refs)";
  const auto few = read_quarters(wide_gpt2(4));
  ASSERT_TRUE(few.shards.defined());
  auto many = read_quarters(wide_gpt2(20));
  ASSERT_TRUE(many.shards.defined());
  const double more = many.model_bytes - few.model_bytes, grew = many.peak - few.peak;
  // + 96 MB: what the process holds apart from the model moved by up to 50 MB between two reads in one process.
  const double allowed = (many.shard_bytes - few.shard_bytes) + 96e6;
  std::cout << "[random init] 16 more blocks (" << more / 1e6 << " MB) raised the peak by " << grew / 1e6
            << " MB, allowed " << allowed / 1e6 << " MB (half of them: " << more / 2e6 << " MB)\n";
  EXPECT_GT(more, 800e6);
  EXPECT_LE(grew, allowed);
  EXPECT_LT(grew, more / 2) << "a whole model's weights were held";
  EXPECT_LT(many.peak, many.model_bytes / 2) << "a whole model's weights were held";
  many.shards = at::Tensor();

  // For the record, the eager build of the smaller model (draws once, holds it whole).
  const auto& family = family_by_name(few.config.family);
  at::manual_seed(3);
  const auto start = std::chrono::steady_clock::now();
  const auto eager = family.from_config(few.config);
  std::cout << "[random init] the eager build of 4 blocks: " << seconds_since(start) << " s\n";
  // The quarters are the eager weights' last quarters.
  int64_t at_ = 0;
  for (const auto& p : eager->named_parameters()) {
    const auto flat = p.value().reshape(-1);
    const auto quarter = (flat.numel() + 3) / 4;
    EXPECT_TRUE(at::equal(few.shards.narrow(0, at_, quarter), flat.narrow(0, flat.numel() - quarter, quarter)))
        << p.key();
    at_ += quarter;
  }
}

}  // namespace
}  // namespace anvil::models
