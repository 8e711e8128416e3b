#include "anvil/data/sampler.h"

#include <numeric>
#include <stdexcept>

#include "anvil/core/error.h"

namespace anvil::data {
namespace {

// splitmix64: a fixed, platform-independent generator (std:: distributions
// are not specified bit-for-bit across standard libraries).
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

EpochSampler::EpochSampler(int64_t size, uint64_t seed, bool shuffle) : size_(size), seed_(seed), shuffle_(shuffle) {
  if (size <= 0) throw DataError("sampler: dataset is empty");
  build_order();
}

void EpochSampler::build_order() {
  order_.resize(static_cast<size_t>(size_));
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  uint64_t x = seed_ * 0x100000001B3ull + static_cast<uint64_t>(state_.epoch);
  for (int64_t i = size_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(splitmix64(x) % static_cast<uint64_t>(i + 1));
    std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
  }
}

int64_t EpochSampler::next() {
  if (state_.offset >= size_) {
    ++state_.epoch;
    state_.offset = 0;
    build_order();
  }
  return order_[static_cast<size_t>(state_.offset++)];
}

void EpochSampler::set_state(const SamplerState& s) {
  if (s.epoch < 0 || s.offset < 0 || s.offset > size_)
    throw CheckpointError(concat("sampler state (epoch ", s.epoch, ", offset ", s.offset,
                                 ") does not fit a dataset of ", size_, " samples"));
  state_ = s;
  build_order();
}

}  // namespace anvil::data
