#pragma once
// Added tokens of a tokenizer.json and the trie that finds them in text, with
// HF's leftmost-longest matching. Internal to the HF backend.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace anvil::tokenizer::detail {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = true;
};

// Byte trie over added-token contents with HF's Aho-Corasick LeftmostLongest
// semantics: the match starting first wins, the longest among those; matches
// never overlap.
class TokenTrie {
 public:
  void add(std::string_view key, int32_t value) {
    if (key.empty()) return;
    first_[static_cast<unsigned char>(key[0])] = true;
    int32_t node = 0;
    for (const char c : key) {
      int32_t child = find_child(node, static_cast<unsigned char>(c));
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(static_cast<unsigned char>(c), child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].value = value;
  }
  bool empty() const { return nodes_.size() == 1; }

  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    for (size_t i = 0; i < s.size();) {
      if (!first_[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      int32_t node = 0, value = -1;
      size_t end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        node = find_child(node, static_cast<unsigned char>(s[j]));
        if (node < 0) break;
        if (nodes_[node].value >= 0) value = nodes_[node].value, end = j + 1;
      }
      if (value < 0) {
        ++i;
        continue;
      }
      f(i, end, value);
      i = end;
    }
  }

 private:
  int32_t find_child(int32_t node, unsigned char c) const {
    for (const auto& [byte, child] : nodes_[node].children)
      if (byte == c) return child;
    return -1;
  }
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t value = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

}  // namespace anvil::tokenizer::detail
