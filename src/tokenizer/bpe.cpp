// BPE merging of a word's byte ids (a linear scan for short words, HF's
// priority queue for long ones) and the per-thread word cache.
#include "bpe.h"

#include <algorithm>
#include <array>
#include <queue>

namespace anvil::tokenizer::detail {
namespace {

// Long words (runs of digits, CJK, repeated characters): HF's algorithm, a
// priority queue over a linked list, O(n log n).
void merge_long(const MergeMap& merges, std::vector<int32_t>& ids) {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Candidate {
    uint64_t merge;  // rank << 32 | merged id
    uint32_t pos;
    bool operator>(const Candidate& o) const {
      return (merge >> 32) != (o.merge >> 32) ? (merge >> 32) > (o.merge >> 32) : pos > o.pos;
    }
  };
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> sym(ids.size());
  for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (int32_t i = 0; i + 1 < n; ++i) {
    const auto m = merges.find(ids[i], ids[i + 1]);
    if (m != MergeMap::kNone) queue.push({m, static_cast<uint32_t>(i)});
  }
  while (!queue.empty()) {
    const auto top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // Stale entry: the pair at pos changed since it was queued.
    if (merges.find(left.id, right.id) != top.merge) continue;
    left.id = static_cast<int32_t>(top.merge & 0xFFFFFFFFu);
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) {
      const auto m = merges.find(sym[left.prev].id, left.id);
      if (m != MergeMap::kNone) queue.push({m, static_cast<uint32_t>(left.prev)});
    }
    if (left.next >= 0) {
      const auto m = merges.find(left.id, sym[left.next].id);
      if (m != MergeMap::kNone) queue.push({m, top.pos});
    }
  }
  ids.clear();
  for (const auto& s : sym)
    if (s.alive) ids.push_back(s.id);
}

}  // namespace

void apply_merges(const MergeMap& merges, std::vector<int32_t>& ids) {
  constexpr size_t kShort = 48;
  if (ids.size() > kShort) {
    merge_long(merges, ids);
    return;
  }
  if (ids.size() < 2) return;
  std::array<uint64_t, kShort> best;  // best[i]: merge of (ids[i], ids[i + 1])
  size_t n = ids.size();
  for (size_t i = 0; i + 1 < n; ++i) best[i] = merges.find(ids[i], ids[i + 1]);
  while (n > 1) {
    size_t at = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (best[i] < best[at]) at = i;
    if (best[at] == MergeMap::kNone) break;
    ids[at] = static_cast<int32_t>(best[at] & 0xFFFFFFFFu);
    std::copy(ids.begin() + at + 2, ids.begin() + n, ids.begin() + at + 1);
    if (at + 2 < n) std::copy(best.begin() + at + 2, best.begin() + n - 1, best.begin() + at + 1);
    --n;
    if (at + 1 < n) best[at] = merges.find(ids[at], ids[at + 1]);
    if (at > 0) best[at - 1] = merges.find(ids[at - 1], ids[at]);
  }
  ids.resize(n);
}

WordCache& word_cache(uint64_t owner) {
  thread_local std::array<WordCache, 2> slots;
  thread_local size_t victim = 0;
  for (auto& s : slots)
    if (s.owner == owner) return s;
  auto& s = slots[victim];
  victim = (victim + 1) % slots.size();
  s.owner = owner;
  s.words.clear();
  return s;
}

}  // namespace anvil::tokenizer::detail
