#include "data/mixture.h"

#include <cmath>
#include <numeric>

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

// The seed of dataset d's permutation in `epoch`, lap `lap`. Dataset 0, lap 0
// uses the single-dataset formula of earlier versions, so a one-dataset run
// keeps its exact order.
uint64_t perm_seed(uint64_t seed, int64_t epoch, int64_t d, int64_t lap) {
  uint64_t x = seed * 0x100000001B3ull + static_cast<uint64_t>(epoch);
  if (d == 0 && lap == 0) return x;
  x ^= (static_cast<uint64_t>(d) + 1) * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(lap) * 0x8CB92BA72F3D8DD7ull;
  return splitmix64(x);
}

}  // namespace

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  uint64_t x = seed;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(splitmix64(x) % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

MixtureSampler::MixtureSampler(std::vector<MixtureSpec> specs, uint64_t seed, bool shuffle)
    : specs_(std::move(specs)), seed_(seed), shuffle_(shuffle) {
  if (specs_.empty()) throw DataError("sampler: no datasets");
  for (auto& s : specs_) {
    if (s.indices.empty()) {
      s.indices.resize(static_cast<size_t>(s.size));
      std::iota(s.indices.begin(), s.indices.end(), 0);
    }
    if (s.indices.empty()) throw DataError("sampler: a dataset is empty");
  }
  build_plan();
}

void MixtureSampler::build_plan() {
  plan_.clear();
  const auto n_ds = static_cast<int64_t>(specs_.size());
  // The k-th draw from dataset d in this epoch: laps of fresh permutations.
  std::vector<std::vector<int64_t>> lap_order(specs_.size());
  std::vector<int64_t> drawn(specs_.size(), 0);
  auto draw = [&](int64_t d) {
    const auto& idx = specs_[static_cast<size_t>(d)].indices;
    const auto n = static_cast<int64_t>(idx.size());
    auto& k = drawn[static_cast<size_t>(d)];
    if (k % n == 0) {
      auto& order = lap_order[static_cast<size_t>(d)];
      if (shuffle_) {
        order = permutation(n, perm_seed(seed_, state_.epoch, d, k / n));
      } else {
        order.resize(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
      }
    }
    const auto i = lap_order[static_cast<size_t>(d)][static_cast<size_t>(k % n)];
    ++k;
    return SampleRef{static_cast<int32_t>(d), idx[static_cast<size_t>(i)]};
  };
  const bool weighted = specs_[0].weight > 0;
  if (weighted) {
    double total_w = 0;
    int64_t total_n = 0;
    for (const auto& s : specs_) total_w += s.weight, total_n += static_cast<int64_t>(s.indices.size());
    uint64_t x = perm_seed(seed_, state_.epoch, n_ds, 1);
    for (int64_t k = 0; k < total_n; ++k) {
      const double u = static_cast<double>(splitmix64(x) >> 11) * 0x1.0p-53 * total_w;
      double acc = 0;
      int64_t d = 0;
      for (; d < n_ds - 1; ++d) {
        acc += specs_[static_cast<size_t>(d)].weight;
        if (u < acc) break;
      }
      plan_.push_back(draw(d));
    }
    return;
  }
  for (int64_t d = 0; d < n_ds; ++d) {
    const auto& s = specs_[static_cast<size_t>(d)];
    const auto n = static_cast<int64_t>(s.indices.size());
    const int64_t count = s.take > 0 ? s.take : s.fraction > 0 ? std::llround(s.fraction * static_cast<double>(n)) : n;
    for (int64_t k = 0; k < count; ++k) plan_.push_back(draw(d));
  }
  if (n_ds > 1 && shuffle_) {
    const auto order = permutation(static_cast<int64_t>(plan_.size()), perm_seed(seed_, state_.epoch, n_ds, 0));
    std::vector<SampleRef> mixed(plan_.size());
    for (size_t i = 0; i < order.size(); ++i) mixed[i] = plan_[static_cast<size_t>(order[i])];
    plan_ = std::move(mixed);
  }
  if (plan_.empty()) throw DataError("sampler: the mixture's epoch is empty (every dataset's fraction or size is 0)");
}

void MixtureSampler::roll_over() {
  if (state_.offset < epoch_length()) return;
  ++state_.epoch;
  state_.offset = 0;
  build_plan();
}

SampleRef MixtureSampler::next() {
  roll_over();
  return plan_[static_cast<size_t>(state_.offset++)];
}

SampleRef MixtureSampler::peek() {
  roll_over();
  return plan_[static_cast<size_t>(state_.offset)];
}

SamplerState sampler_state_of(const nlohmann::json& j) {
  const auto get = [&](const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
      throw CheckpointError(concat("data.", key, ": expected a non-negative integer, got ",
                                   it == j.end() ? std::string("nothing") : it->dump()));
    return it->get<int64_t>();
  };
  if (!j.is_object()) throw CheckpointError(concat("data: expected an object, got ", j.dump()));
  return {get("epoch"), get("offset")};
}

void MixtureSampler::set_state(const SamplerState& s) {
  if (s.epoch < 0 || s.offset < 0)
    throw CheckpointError(concat("sampler state (epoch ", s.epoch, ", offset ", s.offset, ") is invalid"));
  state_ = s;
  build_plan();
  if (s.offset > epoch_length())
    throw CheckpointError(concat("sampler state (epoch ", s.epoch, ", offset ", s.offset, ") does not fit an epoch of ",
                                 epoch_length(), " samples; did the data change?"));
}

}  // namespace anvil::data
