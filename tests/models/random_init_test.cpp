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

// A GPT-2 of 101 M parameters (403 MB in float32): a rank of 4 reads a quarter of every parameter, as its
// shards of a flat unit per block would cut them. Beyond those quarters it may hold two parameters (the
// replay's scratch buffer and the parameter a read draws whole) and some slack, never the model.
TEST(RandomInit, ARankReadingItsShardsHoldsNoWholeModel) {
  config::ModelConfig mc;
  mc.family = "gpt2";
  mc.vocab_size = 1000, mc.hidden_size = 1024, mc.num_hidden_layers = 8, mc.num_attention_heads = 8,
  mc.max_position_embeddings = 64;
  const auto& family = family_by_name(mc.family);
  // A small build and read first, so that the code they run (LibTorch's draw and copy kernels) is paged in
  // before the mark is reset: its pages would count as resident memory too.
  {
    auto small = mc;
    small.hidden_size = 64, small.num_hidden_layers = 1, small.num_attention_heads = 4;
    at::manual_seed(3);
    auto warm = build_deferred_random([&] { return family.from_config(small); }, at::kCPU);
    ASSERT_NE(warm, nullptr);
    for (const auto& p : warm->named_parameters()) warm->parameter_source->read(p.key(), 0, p.value().numel());
  }
  if (!reset_host_peak()) GTEST_SKIP() << "this kernel does not reset the high-water mark (/proc/self/clear_refs)";
  const auto before = host_memory().resident;
  at::manual_seed(3);
  auto start = std::chrono::steady_clock::now();
  auto model = build_deferred_random([&] { return family.from_config(mc); }, at::kCPU);
  const double build_s = seconds_since(start);
  ASSERT_NE(model, nullptr);
  // The rank's shards, allocated first as ShardedModel allocates a unit's, then filled read by read.
  int64_t total = 0, largest = 0, quarters = 0;
  for (const auto& p : model->named_parameters()) {
    total += p.value().numel();
    largest = std::max(largest, p.value().numel());
    quarters += (p.value().numel() + 3) / 4;
  }
  auto shards = at::zeros({quarters}, at::kFloat);
  start = std::chrono::steady_clock::now();
  int64_t at_ = 0;
  for (const auto& p : model->named_parameters()) {
    const auto n = p.value().numel(), quarter = (n + 3) / 4;
    shards.narrow(0, at_, quarter).copy_(model->parameter_source->read(p.key(), n - quarter, quarter));
    at_ += quarter;
  }
  const double read_s = seconds_since(start);
  const double peak = static_cast<double>(host_memory().peak - before);
  const double model_bytes = 4.0 * static_cast<double>(total), shard_bytes = model_bytes / 4;
  // + 64 MB for the allocator and pages of code first run here (the suite measured 191 MB once, alone 128 MB).
  const double allowed = shard_bytes + 2 * 4.0 * static_cast<double>(largest) + 64e6;
  std::cout << "[random init] " << total / 1e6 << " M parameters (" << model_bytes / 1e6 << " MB): a quarter of each "
            << "read in " << read_s << " s after a " << build_s << " s build; peak above the start " << peak / 1e6
            << " MB, allowed " << allowed / 1e6 << " MB\n";
  EXPECT_GT(total, 100'000'000);
  EXPECT_LE(peak, allowed);
  EXPECT_LT(peak, model_bytes / 2) << "a whole model's weights were held";

  // For the record, the eager build of the same model (draws once, holds it whole).
  at::manual_seed(3);
  start = std::chrono::steady_clock::now();
  const auto eager = family.from_config(mc);
  std::cout << "[random init] the eager build: " << seconds_since(start) << " s\n";
  // The quarters are the eager weights' last quarters.
  at_ = 0;
  for (const auto& p : eager->named_parameters()) {
    const auto flat = p.value().reshape(-1);
    const auto quarter = (flat.numel() + 3) / 4;
    EXPECT_TRUE(at::equal(shards.narrow(0, at_, quarter), flat.narrow(0, flat.numel() - quarter, quarter))) << p.key();
    at_ += quarter;
  }
}

}  // namespace
}  // namespace anvil::models
