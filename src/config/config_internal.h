#pragma once
// The config layer's internals shared by its .cpp files (config.cpp parses,
// validate.cpp checks, suggest.cpp finds the key an unknown one meant): the
// flattened sources and the error list.

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
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

/// Where an error points, for listing the errors of a load in the order of
/// their sources (the files as given, then the overrides) and lines; one
/// about the config as a whole (a required key no source sets) comes last.
struct Place {
  int source = std::numeric_limits<int>::max();  // Entry::order
  int line = 0;                                  // 1-based; 0 = none
};

inline int line_of(const YAML::Node& node) { return node.Mark().line < 0 ? 0 : node.Mark().line + 1; }
inline Place place_of(const Entry& e) { return {e.order, line_of(e.node)}; }

/// The errors of one load, reported together (the first kMaxErrors of them),
/// in the order of their places; errors at one place keep the order they
/// were found in.
class Errors {
 public:
  static constexpr size_t kMaxErrors = 20;
  void add(std::string message, Place place = {}) {
    for (const auto& e : list_)
      if (e.message == message) return;
    list_.push_back({std::move(message), place});
  }
  bool empty() const { return list_.empty(); }
  void throw_if_any() const {
    if (list_.empty()) return;
    auto sorted = list_;
    std::stable_sort(sorted.begin(), sorted.end(), [](const Error& a, const Error& b) {
      return std::tie(a.place.source, a.place.line) < std::tie(b.place.source, b.place.line);
    });
    if (sorted.size() == 1) throw ConfigError(sorted.front().message);
    std::string msg = concat(sorted.size(), " errors in the config:");
    for (size_t i = 0; i < sorted.size() && i < kMaxErrors; ++i) msg += "\n  " + sorted[i].message;
    if (sorted.size() > kMaxErrors) msg += concat("\n  ... and ", sorted.size() - kMaxErrors, " more");
    throw ConfigError(msg);
  }

 private:
  struct Error {
    std::string message;
    Place place;
  };
  std::vector<Error> list_;
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

/// The renamed keys (renamed_from): old name -> name, e.g. model.num_layers ->
/// model.num_hidden_layers (a list's keys as the reference names them).
std::map<std::string, std::string> old_key_names();

/// Whether `message` names one of `failed`, the keys whose values did not
/// parse, or a key inside one (data.train[0].path inside data.train): a check
/// of the parsed config saw a default in its place, so what it says follows
/// from that error (validate.cpp).
bool follows_from_failed(const std::string& message, const std::set<std::string>& failed);

/// Cross-field checks of a parsed config; every problem goes into `errors`
/// with the file and line of the key, but those that name a key of `failed`
/// (follows_from_failed) (validate.cpp).
void validate(const RunConfig& c, const FlatConfig& flat, const std::string& sources,
              const std::set<std::string>& failed, Errors& errors);

}  // namespace anvil::config
