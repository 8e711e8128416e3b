#pragma once
// The config layer's internals shared by its .cpp files (config.cpp parses,
// validate.cpp checks, suggest.cpp finds the key an unknown one meant): the
// flattened sources and the error list.

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/core/error.h"

namespace anvil::config {

// A leaf value from some source; later sources replace earlier ones.
struct Entry {
  YAML::Node node;
  std::string where;  // "configs/a.yaml:12" or "command line (train.lr=3e-4)"
  std::string file;   // the source alone, for entries nested in a list
  int order = 0;      // the source's place in the chain (files, then overrides)
};

/// The errors of one load, reported together (the first kMaxErrors of them).
class Errors {
 public:
  static constexpr size_t kMaxErrors = 20;
  void add(std::string message) {
    if (std::find(list_.begin(), list_.end(), message) == list_.end()) list_.push_back(std::move(message));
  }
  bool empty() const { return list_.empty(); }
  void throw_if_any() const {
    if (list_.empty()) return;
    if (list_.size() == 1) throw ConfigError(list_.front());
    std::string msg = concat(list_.size(), " errors in the config:");
    for (size_t i = 0; i < list_.size() && i < kMaxErrors; ++i) msg += "\n  " + list_[i];
    if (list_.size() > kMaxErrors) msg += concat("\n  ... and ", list_.size() - kMaxErrors, " more");
    throw ConfigError(msg);
  }

 private:
  std::vector<std::string> list_;
};
using FlatConfig = std::map<std::string, Entry>;

inline std::string where_of(const std::string& file, const YAML::Node& node) {
  const auto mark = node.Mark();
  if (mark.line < 0) return file;
  return concat(file, ":", mark.line + 1);
}

/// What an error about `path`, a key that no section has, adds after
/// "unknown key": "; did you mean <key>?" (with the other trainer's name when
/// it is one of TRL's or transformers'), or "" (suggest.cpp). `known`: the
/// keys the config may have.
std::string unknown_key_hint(const std::string& path, const std::set<std::string>& known);

/// Cross-field checks of a parsed config; every problem goes into `errors`
/// with the file and line of the key (validate.cpp).
void validate(const RunConfig& c, const FlatConfig& flat, const std::string& sources, Errors& errors);

}  // namespace anvil::config
