#pragma once
// A family's plain config.json keys, listed once. Each family's options list
// them in `template <class V> void visit_hf(V& v)` (LLaMA's with the row of
// its variant): the key, the options field, transformers' default and what
// the value must be. HfKeyReader reads a config.json through that list and
// HfKeyWriter writes one, so reading and writing cannot disagree on a name,
// a default or a key's presence. What is not a plain key (rotary settings,
// sliding windows whose null means "none", special tokens, layer lists) the
// family reads and writes beside the list. Internal to src/models/.

#include <nlohmann/json.hpp>
#include <string>

#include "models/hf_config_reader.h"

namespace anvil::models {

using HfBound = HfConfigReader::Bound;

/// Fills a family's options from a config.json, key by key in the list's
/// order (a default may name a key read before it: num_key_value_heads
/// defaults to num_attention_heads).
class HfKeyReader {
 public:
  explicit HfKeyReader(const HfConfigReader& r) : r_(r) {}
  /// A key the file must have.
  void required(const char* key, int64_t& x) { x = r_.integer(key); }
  void key(const char* key, int64_t& x, int64_t def) { x = r_.integer(key, def); }
  void key(const char* key, double& x, double def, HfBound bound = HfBound::non_negative) {
    x = r_.number(key, def, bound);
  }
  void key(const char* key, bool& x, bool def) { x = r_.boolean(key, def); }
  void key(const char* key, std::string& x, const char* def) { x = r_.string(key, def); }
  /// A key written as `key` and read as `key`, or as `older` when only that is
  /// there (transformers 4's and 5's spellings).
  void key_or(const char* key, const char* older, int64_t& x, int64_t def) {
    x = r_.integer(!r_.find(key) && r_.find(older) ? older : key, def);
  }
  void key_or(const char* key, const char* older, std::string& x, const char* def) {
    x = r_.string(!r_.find(key) && r_.find(older) ? older : key, def);
  }
  /// An integer whose 0 means "derived" (GPT-2's n_inner): missing or null
  /// reads 0, and 0 is written as null.
  void zero_is_null(const char* key, int64_t& x) { x = r_.integer(key, 0); }
  /// A key whose only supported value is `value` (another fails with `why`);
  /// written as `value`.
  void only(const char* key, bool value, const char* why) {
    if (r_.boolean(key, value) != value) r_.fail(key, why);
  }
  void only(const char* key, const char* value, const char* why) {
    if (const auto got = r_.string(key, value); got != value) r_.fail(key, concat(why, ", got \"", got, "\""));
  }
  /// A value written for transformers' sake that Anvil does not read.
  template <class T>
  void constant(const char*, const T&) {}

 private:
  const HfConfigReader& r_;
};

/// Writes a family's listed keys into a config.json.
class HfKeyWriter {
 public:
  explicit HfKeyWriter(nlohmann::json& j) : j_(j) {}
  void required(const char* key, int64_t& x) { j_[key] = x; }
  template <class T, class Default, class... Bound>
  void key(const char* key, T& x, const Default&, Bound...) {
    j_[key] = x;
  }
  template <class T, class Default>
  void key_or(const char* key, const char*, T& x, const Default&) {
    j_[key] = x;
  }
  void zero_is_null(const char* key, int64_t& x) { j_[key] = x > 0 ? nlohmann::json(x) : nlohmann::json(nullptr); }
  template <class T>
  void only(const char* key, const T& value, const char*) {
    j_[key] = value;
  }
  template <class T>
  void constant(const char* key, const T& value) {
    j_[key] = value;
  }

 private:
  nlohmann::json& j_;
};

}  // namespace anvil::models
