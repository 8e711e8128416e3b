#pragma once
// Deterministic, resumable sampling over a mixture of datasets.
//
// Each epoch's order is a pure function of (seed, epoch): the position
// (epoch, offset) is all a checkpoint needs to continue the same stream, and
// the stream does not depend on how many ranks read it.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace anvil::data {

/// One dataset of a mixture. Exactly one of fraction / take / weight applies
/// (fraction = 1 when none is set).
struct MixtureSpec {
  int64_t size = 0;              // samples available
  double fraction = 0;           // per-epoch share, a fresh subset each epoch (> 1 repeats)
  int64_t take = 0;              // per-epoch count, a fresh subset each epoch
  double weight = 0;             // sampling weight (all specs or none)
  std::vector<int64_t> indices;  // the dataset's usable indices; empty = 0..size-1
};

struct SampleRef {
  int32_t dataset = 0;
  int64_t index = 0;
  bool operator==(const SampleRef& o) const { return dataset == o.dataset && index == o.index; }
};

struct SamplerState {
  int64_t epoch = 0;
  int64_t offset = 0;  // samples already taken in this epoch
};

/// The position a checkpoint's "data" object holds ({"epoch", "offset"}:
/// non-negative integers); throws CheckpointError naming the key.
SamplerState sampler_state_of(const nlohmann::json& j);

class MixtureSampler {
 public:
  MixtureSampler(std::vector<MixtureSpec> specs, uint64_t seed, bool shuffle = true);

  SampleRef next();
  SampleRef peek();
  const SamplerState& state() const { return state_; }
  /// Jumps to a position; throws CheckpointError if it does not fit.
  void set_state(const SamplerState& s);
  int64_t epoch_length() const { return static_cast<int64_t>(plan_.size()); }
  /// The whole order of the current epoch.
  const std::vector<SampleRef>& plan() const { return plan_; }

 private:
  void build_plan();
  void roll_over();
  std::vector<MixtureSpec> specs_;
  uint64_t seed_;
  bool shuffle_;
  SamplerState state_;
  std::vector<SampleRef> plan_;
};

/// A seeded permutation of 0..n-1 (Fisher-Yates on splitmix64), fixed across
/// platforms. Exposed for held-out splits and tests.
std::vector<int64_t> permutation(int64_t n, uint64_t seed);

}  // namespace anvil::data
