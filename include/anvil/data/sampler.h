#pragma once
// Deterministic, resumable sample order: each epoch is a permutation derived
// from (seed, epoch) alone, so the position (epoch, offset) is all a
// checkpoint needs to continue the exact same stream.

#include <cstdint>
#include <vector>

namespace anvil::data {

struct SamplerState {
  int64_t epoch = 0;
  int64_t offset = 0;  // samples already taken in this epoch
};

class EpochSampler {
 public:
  EpochSampler(int64_t size, uint64_t seed, bool shuffle = true);

  /// Next sample index; rolls over to a fresh permutation at epoch end.
  int64_t next();
  const SamplerState& state() const { return state_; }
  void set_state(const SamplerState& s);

 private:
  void build_order();
  int64_t size_;
  uint64_t seed_;
  bool shuffle_;
  SamplerState state_;
  std::vector<int64_t> order_;
};

}  // namespace anvil::data
