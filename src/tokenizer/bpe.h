#pragma once
// The BPE model's merge machinery: the merge table, the merge loop HF's BPE
// runs on each word, and the per-thread cache of merged words.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace anvil::tokenizer::detail {

// (left id, right id) -> (rank, merged id), open addressing.
class MergeMap {
 public:
  static constexpr uint64_t kNone = ~0ull;

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    shift_ = 64 - static_cast<int>(std::countr_zero(cap));
  }
  // A later duplicate overrides an earlier one, as in HF's HashMap collect.
  void insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged) {
    const uint64_t key = pack(left, right);
    for (size_t i = home(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = {key, rank, merged};
        return;
      }
    }
  }
  // (rank << 32 | merged id), or kNone: ordering by the packed value orders by rank.
  uint64_t find(uint32_t left, uint32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = home(key);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.key == key) return (static_cast<uint64_t>(s.rank) << 32) | s.merged;
      if (s.key == kEmpty) return kNone;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    uint32_t rank, merged;
  };
  static uint64_t pack(uint32_t left, uint32_t right) { return (static_cast<uint64_t>(left) << 32) | right; }
  size_t home(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  int shift_ = 60;
};

// Applies the lowest-ranked merge, leftmost first, until none applies: the
// order of HF's priority queue on (rank, position).
void apply_merges(const MergeMap& merges, std::vector<int32_t>& ids);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Word (raw bytes) -> ids, per thread and per tokenizer.
struct WordCache {
  uint64_t owner = 0;
  StringMap<std::vector<int32_t>> words;
};
constexpr size_t kMaxCachedWordBytes = 256;  // as HF's BPE cache
constexpr size_t kCacheCapacity = 1 << 16;   // words; the cache starts over when full

// One cache per thread serves the last two tokenizers used on it.
WordCache& word_cache(uint64_t owner);

}  // namespace anvil::tokenizer::detail
