// YAML -> typed RunConfig. The only place that sees yaml-cpp.
#include "anvil/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "config_internal.h"

namespace anvil::config {
namespace {

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (null)";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return concat("\"", node.Scalar(), "\"");
}

void erase_subtree(FlatConfig& out, const std::string& prefix) {
  out.erase(prefix);
  for (auto it = out.lower_bound(prefix + "."); it != out.end() && it->first.rfind(prefix + ".", 0) == 0;)
    it = out.erase(it);
}

/// Adds `node`'s leaves under `prefix` to `out`. A key that is not a plain
/// name is an error, added to `errors` (and skipped) when given, else thrown.
void flatten(const YAML::Node& node, const std::string& prefix, const std::string& file, FlatConfig& out, int order = 0,
             Errors* errors = nullptr) {
  // `key: null` (or ~, or key=null on the command line) removes what an
  // earlier source set there: the key falls back to its default.
  if (node.IsNull() && !prefix.empty()) {
    erase_subtree(out, prefix);
    return;
  }
  if (node.IsMap()) {
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {  // `? [a, b] : 1` and `{a: 1}: 2` are YAML, but not config keys
        auto message = concat(where_of(file, kv.first), ": ", prefix.empty() ? "" : prefix + ": ",
                              "expected a plain key name, got ", describe(kv.first));
        if (!errors) throw ConfigError(message);
        errors->add(std::move(message), Place{order, line_of(kv.first)});
        continue;
      }
      const auto key = kv.first.Scalar();
      const auto path = prefix.empty() ? key : prefix + "." + key;
      // A later map replaces an earlier scalar at the same path, and vice versa.
      out.erase(path);
      flatten(kv.second, path, file, out, order, errors);
    }
    return;
  }
  erase_subtree(out, prefix);
  out[prefix] = Entry{node, where_of(file, node), file, order};
}

std::string format_double(double x) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, res.ptr);
  // Keep floats recognisable as floats in YAML ("1" would read back as an int).
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos &&
      s.find("nan") == std::string::npos)
    s += ".0";
  return s;
}

// ---- type traits: how a field type reads from YAML and how it is named -----

template <class T>
struct TypeInfo;
template <>
struct TypeInfo<bool> {
  static constexpr const char* name = "true or false";
  static bool read(const YAML::Node& n) { return n.as<bool>(); }
  static std::string show(bool v) { return v ? "true" : "false"; }
};
template <>
struct TypeInfo<int64_t> {
  static constexpr const char* name = "an integer";
  static int64_t read(const YAML::Node& n) { return n.as<int64_t>(); }
  static std::string show(int64_t v) { return std::to_string(v); }
};
template <>
struct TypeInfo<double> {
  static constexpr const char* name = "a number";
  static double read(const YAML::Node& n) { return n.as<double>(); }
  static std::string show(double v) { return format_double(v); }
};
template <>
struct TypeInfo<std::string> {
  static constexpr const char* name = "a string";
  static std::string read(const YAML::Node& n) {
    if (!n.IsScalar()) throw YAML::BadConversion(n.Mark());
    return n.Scalar();
  }
  static std::string show(const std::string& v) { return v.empty() ? "\"\"" : v; }
};
template <>
struct TypeInfo<std::vector<double>> {
  static constexpr const char* name = "a list of numbers";
  static std::vector<double> read(const YAML::Node& n) {
    if (!n.IsSequence()) throw YAML::BadConversion(n.Mark());
    std::vector<double> out;
    for (const auto& e : n) out.push_back(e.as<double>());
    return out;
  }
  static std::string show(const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_double(v[i]);
    return s + "]";
  }
};
template <>
struct TypeInfo<std::vector<int64_t>> {
  static constexpr const char* name = "a list of integers";
  static std::vector<int64_t> read(const YAML::Node& n) {
    if (!n.IsSequence()) throw YAML::BadConversion(n.Mark());
    std::vector<int64_t> out;
    for (const auto& e : n) out.push_back(e.as<int64_t>());
    return out;
  }
  static std::string show(const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  }
};

template <>
struct TypeInfo<std::vector<std::string>> {
  static constexpr const char* name = "a list of strings";
  static std::vector<std::string> read(const YAML::Node& n) {
    if (!n.IsSequence()) throw YAML::BadConversion(n.Mark());
    std::vector<std::string> out;
    for (const auto& e : n) {
      if (!e.IsScalar()) throw YAML::BadConversion(e.Mark());
      out.push_back(e.Scalar());
    }
    return out;
  }
  static std::string show(const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += concat(i ? ", " : "", "\"", v[i], "\"");
    return s + "]";
  }
};

bool passes(const Rule& rule, double x) { return !rule.number || rule.number(x); }
bool passes(const Rule& rule, int64_t x) { return passes(rule, static_cast<double>(x)); }
bool passes(const Rule& rule, bool) { return true; }
bool passes(const Rule& rule, const std::string& s) {
  if (rule.choices.empty()) return true;
  return std::find(rule.choices.begin(), rule.choices.end(), s) != rule.choices.end();
}
bool passes(const Rule& rule, const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [&](double x) { return passes(rule, x); });
}
bool passes(const Rule& rule, const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return passes(rule, x); });
}
bool passes(const Rule& rule, const std::vector<std::string>& v) {
  return std::all_of(v.begin(), v.end(), [&](const std::string& x) { return passes(rule, x); });
}

// ---- visitors -------------------------------------------------------------

/// Where a config file indents with a tab (YAML allows only spaces), the
/// first such line, for a parse error whose own words ("illegal map value")
/// do not say so.
std::string tab_hint(const std::string& file) {
  std::ifstream in(file);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const auto first = line.find_first_not_of(' ');
    if (first != std::string::npos && line[first] == '\t')
      return concat(" (line ", n, " indents with a tab; YAML indents with spaces only)");
  }
  return "";
}

/// Reads the flattened sources into a config's fields. A value that does not
/// parse (or fit its rule) is an error, its field keeps its default, and its
/// key joins failed(): the cross-field checks then see that default, and
/// what they say about it only follows from this error.
class Parser {
 public:
  Parser(FlatConfig flat, std::string sources, Errors& errors, Place sources_place = {})
      : flat_(std::move(flat)), sources_(std::move(sources)), errors_(&errors), sources_place_(sources_place) {}

  template <class T>
  void field(const char* key, T& value, const char* /*doc*/, const Rule& rule = {}) {
    const auto path = prefix_ + key;
    known_.insert(path);
    if (!rule.old_name.empty() && !take_old_name(path, prefix_ + rule.old_name)) return;
    auto it = flat_.find(path);
    if (it == flat_.end()) {
      if (rule.required)
        errors_->add(concat(sources_, ": ", path, ": required key is missing; expected ", TypeInfo<T>::name,
                            " (set it in a config file or as ", path, "=...)"),
                     sources_place_);
      return;
    }
    const auto& node = it->second.node;
    const auto& where = it->second.where;
    T parsed{};
    if constexpr (std::is_same_v<T, int64_t>)
      if (!rule.word.empty() && node.IsScalar() && node.Scalar() == rule.word) {
        value = rule.word_value;
        return;
      }
    try {
      if (!node.IsDefined() || node.IsNull()) throw YAML::BadConversion(node.Mark());
      parsed = TypeInfo<T>::read(node);
    } catch (const YAML::Exception&) {
      fail(path, it->second, concat(where, ": ", path, ": expected ", TypeInfo<T>::name, ", got ", describe(node)));
      return;
    }
    if (!passes(rule, parsed)) {
      fail(path, it->second, concat(where, ": ", path, ": expected ", rule.expected, ", got ", describe(node)));
      return;
    }
    value = std::move(parsed);
  }

  template <class S>
  void section(const char* key, S& s, const char* /*doc*/) {
    const auto saved = prefix_;
    const auto path = prefix_ + key;
    known_.insert(path);
    if (auto it = flat_.find(path); it != flat_.end() && !it->second.node.IsNull()) {
      fail(path, it->second,
           concat(it->second.where, ": ", path, ": expected a map of ", path, ".* keys, got ",
                  describe(it->second.node)));
      return;  // its keys would only add errors that follow from this one
    }
    prefix_ = path + ".";
    s.visit(*this);
    prefix_ = saved;
  }

  /// A list of maps, each parsed with its item type's own fields: data.train[0].path, ...
  template <class S>
  void list(const char* key, std::vector<S>& items, const char* doc) {
    list_of(key, ListRef::of(items), doc);
  }
  void list_of(const char* key, const ListRef& items, const char* /*doc*/) {
    const auto path = prefix_ + key;
    known_.insert(path);
    auto it = flat_.find(path);
    if (it == flat_.end()) return;
    const auto& [node, where, file, order] = it->second;
    if (!node.IsSequence()) {
      fail(path, it->second,
           concat(where, ": ", path, ": expected a list of maps (- key: value), got ", describe(node)));
      return;
    }
    std::vector<size_t> maps;
    for (size_t i = 0; i < node.size(); ++i) {
      if (node[i].IsMap()) {
        maps.push_back(i);
        continue;
      }
      // The items that parse take places 0, 1, ...: checks naming them by index would name others.
      fail(path, it->second,
           concat(where_of(file, node[i]), ": ", path, "[", i, "]: expected a map, got ", describe(node[i])),
           line_of(node[i]));
    }
    items.resize(maps.size());
    const bool on_command_line = file.rfind("command line", 0) == 0;
    for (size_t j = 0; j < maps.size(); ++j) {
      const auto i = maps[j];
      const auto item_path = concat(path, "[", i, "]");
      FlatConfig sub;
      flatten(node[i], item_path, file, sub, order, errors_);
      for (auto& [k, e] : sub)
        if (on_command_line) e.where = where;
      Parser p(std::move(sub), on_command_line ? where : where_of(file, node[i]), *errors_,
               Place{order, line_of(node[i])});
      p.prefix_ = item_path + ".";
      detail::FieldVisitorFor<Parser> fields(p);
      items.visit(j, fields);
      p.reject_unknown();
      failed_.insert(p.failed_.begin(), p.failed_.end());
    }
  }

  void reject_unknown() const {
    for (const auto& [path, entry] : flat_)
      if (!known_.count(path))
        errors_->add(concat(entry.where, ": ", path, ": unknown key", unknown_key_hint(path, known_)), place_of(entry));
  }

  const FlatConfig& flat() const { return flat_; }
  /// The keys whose values did not parse (each an error already).
  const std::set<std::string>& failed() const { return failed_; }

 private:
  /// A renamed key written with its old name is read as `path`: the later of
  /// the two sources wins, and both in one source is an error (false).
  bool take_old_name(const std::string& path, const std::string& old_path) {
    known_.insert(old_path);
    const auto old = flat_.find(old_path);
    if (old == flat_.end()) return true;
    if (const auto now = flat_.find(path); now != flat_.end()) {
      if (now->second.order == old->second.order) {
        fail(path, old->second,
             concat(old->second.where, ": ", old_path, ": is the old name of ", path, ", which ", now->second.where,
                    " sets too; keep ", path, " only"));
        return false;
      }
      if (now->second.order > old->second.order) {
        flat_.erase(old);
        return true;
      }
    }
    log::warn(old->second.where, ": ", old_path, " is now ", path,
              " (Hugging Face's name); the old name is read until ", kOldNamesUntil);
    flat_[path] = old->second;
    flat_.erase(old_path);
    return true;
  }

  void fail(const std::string& path, const Entry& entry, std::string message, int line = -1) {
    errors_->add(std::move(message), line < 0 ? place_of(entry) : Place{entry.order, line});
    failed_.insert(path);
  }

  FlatConfig flat_;
  std::string sources_;
  Errors* errors_;
  Place sources_place_;
  std::string prefix_;
  std::set<std::string> known_;
  std::set<std::string> failed_;
};

/// Prints a config as YAML: every key, except the sections of algorithms
/// other than `algorithm`'s.
class Printer {
 public:
  explicit Printer(std::string algorithm) : algorithm_(std::move(algorithm)) { out_ << YAML::BeginMap; }
  template <class T>
  void field(const char* key, T& value, const char*, const Rule& rule = {}) {
    out_ << YAML::Key << key << YAML::Value;
    if constexpr (std::is_same_v<T, int64_t>)
      if (!rule.word.empty() && value == rule.word_value) {
        out_ << rule.word;
        return;
      }
    if constexpr (std::is_same_v<T, std::vector<double>>) {
      out_ << YAML::Flow << YAML::BeginSeq;
      for (double x : value) out_ << format_double(x);
      out_ << YAML::EndSeq;
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      out_ << YAML::Flow << YAML::BeginSeq;
      for (int64_t x : value) out_ << x;
      out_ << YAML::EndSeq;
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      out_ << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : value) out_ << YAML::DoubleQuoted << x;
      out_ << YAML::EndSeq;
    } else if constexpr (std::is_same_v<T, std::string>) {
      out_ << YAML::DoubleQuoted << value;
    } else {
      out_ << TypeInfo<T>::show(value);
    }
  }
  template <class S>
  void section(const char* key, S& s, const char*) {
    if (depth_ == 0) {
      const auto owner = section_algorithm(key);
      if (!owner.empty() && owner != algorithm_) return;
    }
    ++depth_;
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    s.visit(*this);
    out_ << YAML::EndMap;
    --depth_;
  }
  template <class S>
  void list(const char* key, std::vector<S>& items, const char* doc) {
    list_of(key, ListRef::of(items), doc);
  }
  void list_of(const char* key, const ListRef& items, const char*) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginSeq;
    detail::FieldVisitorFor<Printer> fields(*this);
    for (size_t i = 0; i < items.size(); ++i) {
      out_ << YAML::BeginMap;
      items.visit(i, fields);
      out_ << YAML::EndMap;
    }
    out_ << YAML::EndSeq;
  }
  std::string str() {
    out_ << YAML::EndMap;
    return std::string(out_.c_str()) + "\n";
  }

 private:
  std::string algorithm_;
  int depth_ = 0;
  YAML::Emitter out_;
};

std::string md_cell(std::string s) {  // a Markdown table cell: '|' escaped
  for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.insert(i, "\\");
  return s;
}
class Reference {
 public:
  template <class T>
  void field(const char* key, T& value, const char* doc, const Rule& rule = {}) {
    std::string allowed = rule.expected;
    if (rule.required) allowed = rule.number ? "required; " + rule.expected : "required";
    if (rule.declared) {
      allowed += allowed.empty() ? "read by " : "; read by ";
      const auto readers = readers_of(prefix_ + key);
      for (size_t i = 0; i < readers.size(); ++i) allowed += (i ? ", " : "") + readers[i];
      if constexpr (std::is_arithmetic_v<T>)
        if (rule.off) allowed += concat(" (any algorithm takes ", TypeInfo<T>::show(static_cast<T>(*rule.off)), ")");
    }
    if (const auto families = model_families_reading(prefix_ + key); !families.empty()) {
      allowed += allowed.empty() ? "model.family " : "; model.family ";
      for (size_t i = 0; i < families.size(); ++i) allowed += (i ? ", " : "") + families[i];
    }
    if (rule.changeable_on_resume) allowed += allowed.empty() ? "may change on resume" : "; may change on resume";
    if (!rule.old_name.empty())
      allowed += concat(allowed.empty() ? "" : "; ", "old name ", rule.old_name, " read until ", kOldNamesUntil);
    rows_ << "| `" << prefix_ << key << "` | " << TypeInfo<T>::name << " | `" << md_cell(TypeInfo<T>::show(value))
          << "` | " << allowed << " | " << md_cell(doc) << " |\n";
  }
  template <class S>
  void section(const char* key, S& s, const char* doc) {
    const auto saved = prefix_;
    prefix_ += std::string(key) + ".";
    rows_ << "| **`" << prefix_.substr(0, prefix_.size() - 1) << "`** | section | | | " << doc << " |\n";
    s.visit(*this);
    prefix_ = saved;
  }
  template <class S>
  void list(const char* key, std::vector<S>& items, const char* doc) {
    list_of(key, ListRef::of(items), doc);
  }
  void list_of(const char* key, const ListRef& items, const char* doc) {
    const auto saved = prefix_;
    prefix_ += std::string(key) + "[].";
    rows_ << "| **`" << prefix_.substr(0, prefix_.size() - 1) << "`** | list of maps | `[]` | | " << doc << " |\n";
    detail::FieldVisitorFor<Reference> fields(*this);
    items.visit_default(fields);
    prefix_ = saved;
  }
  std::string str() const {
    return "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n" + rows_.str();
  }

 private:
  std::string prefix_;
  std::ostringstream rows_;
};

// `data.train[1].fraction=0.2`: sets one key of one item of a list that an
// earlier source set (the names errors use). Returns false if `ov` is not of
// that form.
bool override_list_item(FlatConfig& flat, const std::string& key, const YAML::Node& value, const std::string& where,
                        int order) {
  // KEY[N] or KEY[N].FIELD, parsed by hand (std::regex recurses per character).
  const auto lb = key.find('[');
  const auto rb = key.find(']', lb == std::string::npos ? 0 : lb);
  if (lb == std::string::npos || lb == 0 || rb == std::string::npos || rb == lb + 1 || rb - lb > 10) return false;
  const auto digits = key.substr(lb + 1, rb - lb - 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  std::string field;
  if (rb + 1 < key.size()) {
    if (key[rb + 1] != '.' || rb + 2 >= key.size()) return false;
    field = key.substr(rb + 2);
    if (field.find_first_of(".[]") != std::string::npos) return false;
  }
  const auto base = key.substr(0, lb);
  const auto it = flat.find(base);
  if (it == flat.end() || !it->second.node.IsSequence())
    throw ConfigError(concat(where, ": ", base, ": no list to index (set ", base, " in a config file first)"));
  const auto index = std::stoull(digits);
  YAML::Node list = YAML::Clone(it->second.node);
  if (index >= list.size())
    throw ConfigError(concat(where, ": ", base, "[", digits, "]: ", base, " has ", list.size(),
                             list.size() == 1 ? " item" : " items", " (indices from 0)"));
  if (!field.empty()) {
    YAML::Node item = list[index];
    if (!item.IsMap()) throw ConfigError(concat(where, ": ", base, "[", index, "]: expected a map, got a value"));
    if (value.IsNull())
      item.remove(field);
    else
      item[field] = value;
  } else {
    list[index] = value;
  }
  it->second = Entry{list, where, where, order};
  return true;
}

/// The files and overrides, flattened; later sources win. What cannot be read
/// goes into `errors`: an override whose value is not YAML also into
/// `failed`, and a file that cannot be read or is not YAML stops the load
/// once every source has been read (without the file, any other error could
/// follow from its missing keys).
FlatConfig read_sources(const std::vector<std::string>& files, const std::vector<std::string>& overrides,
                        Errors& errors, std::set<std::string>& failed) {
  FlatConfig flat;
  int order = 0;
  bool unreadable = false;
  for (const auto& given : files) {
    ++order;
    // A bare file name that is not here is looked up in configs/ (`trainer --config sft_galactica.yaml`).
    std::string file = given;
    if (!std::filesystem::exists(file) && std::filesystem::path(file).parent_path().empty() &&
        std::filesystem::is_regular_file(std::filesystem::path("configs") / file))
      file = (std::filesystem::path("configs") / file).string();
    YAML::Node root;
    try {
      root = YAML::LoadFile(file);
    } catch (const YAML::BadFile&) {
      errors.add(
          concat(given, ": cannot read config file",
                 file == given && std::filesystem::path(given).parent_path().empty() ? " (looked here and in configs/)"
                                                                                     : ""),
          Place{order, 0});
      unreadable = true;
      continue;
    } catch (const YAML::ParserException& e) {
      errors.add(concat(file, ":", e.mark.line + 1, ": invalid YAML: ", e.msg, tab_hint(file)),
                 Place{order, e.mark.line + 1});
      unreadable = true;
      continue;
    }
    if (root.IsNull()) continue;  // an empty file
    if (!root.IsMap()) {
      errors.add(concat(file, ": expected a map of keys at the top level"), Place{order, 0});
      unreadable = true;
      continue;
    }
    flatten(root, "", file, flat, order, &errors);
  }
  for (const auto& ov : overrides) {
    ++order;
    const auto eq = ov.find('=');
    if (eq == std::string::npos || eq == 0) {
      errors.add(concat("command line: \"", ov, "\": expected key.path=value"), Place{order, 0});
      continue;
    }
    const auto key = ov.substr(0, eq);
    YAML::Node value;
    try {
      value = YAML::Load(ov.substr(eq + 1));
    } catch (const YAML::ParserException& e) {
      errors.add(concat("command line (", ov, "): ", key, ": invalid YAML value: ", e.msg), Place{order, 0});
      failed.insert(key);
      continue;
    }
    const auto where = concat("command line (", ov, ")");
    try {
      if (override_list_item(flat, key, value, where, order)) continue;
    } catch (const ConfigError& e) {
      errors.add(e.what(), Place{order, 0});
      continue;
    }
    // A map merges key by key (its nulls remove keys, as in a file); every
    // entry it set names the override, not a line of it.
    flatten(value, key, where, flat, order, &errors);
    for (auto it = flat.lower_bound(key); it != flat.end() && it->first.rfind(key, 0) == 0; ++it)
      if (it->second.order == order) it->second.where = it->second.file = where;
  }
  if (unreadable) errors.throw_if_any();
  // model.from set later in the chain than shape keys (a base config, then a
  // checkpoint to start from) replaces them: the folder's config.json holds
  // the shape. Keys set with it or after it still conflict (validate says so).
  if (const auto from = flat.find("model.from"); from != flat.end()) {
    std::vector<std::string> replaced;
    for (auto it = flat.begin(); it != flat.end();) {
      if (it->first.rfind("model.", 0) == 0 && it->first != "model.from" && it->first != "model.family" &&
          it->second.order < from->second.order) {
        replaced.push_back(it->first);
        it = flat.erase(it);
      } else {
        ++it;
      }
    }
    if (!replaced.empty()) {
      std::string keys;
      for (const auto& k : replaced) keys += (keys.empty() ? "" : ", ") + k;
      log::info("model.from (", from->second.where, ") replaces ", keys,
                " set earlier: the shape comes from its config.json");
    }
  }
  return flat;
}

std::string describe_sources(const std::vector<std::string>& files) {
  if (files.empty()) return "config";
  std::string s;
  for (size_t i = 0; i < files.size(); ++i) s += (i ? " + " : "") + files[i];
  return s;
}

}  // namespace

namespace {
/// A section another algorithm reads (dpo.beta in an sft run) is an error
/// naming its first key, once per section.
void reject_foreign_sections(const RunConfig& cfg, const FlatConfig& flat, const std::set<std::string>& failed,
                             Errors& errors) {
  if (failed.count("algorithm")) return;  // the run's algorithm is unknown
  std::set<std::string> reported;
  for (const auto& [key, entry] : flat) {
    const auto top = key.substr(0, key.find_first_of(".["));
    const auto owner = section_algorithm(top);
    if (owner.empty() || owner == cfg.algorithm || !reported.insert(top).second) continue;
    errors.add(
        concat(entry.where, ": ", key, ": the ", top, " section is read by algorithm: ", owner,
               "; this run's algorithm is ", cfg.algorithm, " (remove the section, or set algorithm: ", owner, ")"),
        place_of(entry));
  }
}
}  // namespace

RunConfig load_config(const std::vector<std::string>& files, const std::vector<std::string>& overrides) {
  // Every error of the load together: what cannot be read, values that do not
  // parse, unknown keys, other algorithms' sections and the cross-field
  // checks, which run on the values that parsed.
  Errors errors;
  std::set<std::string> failed;
  Parser parser(read_sources(files, overrides, errors, failed), describe_sources(files), errors);
  RunConfig cfg;
  cfg.visit(parser);
  parser.reject_unknown();
  failed.insert(parser.failed().begin(), parser.failed().end());
  validate(cfg, parser.flat(), describe_sources(files), failed, errors);
  reject_foreign_sections(cfg, parser.flat(), failed, errors);
  errors.throw_if_any();
  return cfg;
}

std::string to_yaml(RunConfig cfg) {
  Printer p(cfg.algorithm);
  cfg.visit(p);
  return p.str();
}

std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& after_yaml) {
  const auto flat_of = [](const std::string& text, const char* which) {
    FlatConfig flat;
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw ConfigError(concat(which, " config: invalid YAML: ", e.what()));
    }
    if (root.IsMap()) flatten(root, "", which, flat);
    return flat;
  };
  auto a = flat_of(before_yaml, "the saved");
  auto b = flat_of(after_yaml, "the new");
  // A checkpoint saved before a key was renamed says its old name.
  for (const auto& [old_name, name] : old_key_names())
    if (const auto it = a.find(old_name); it != a.end()) {
      if (!a.count(name)) a[name] = it->second;
      a.erase(it);
    }
  // Lists of maps of the same length on both sides compare item by item
  // (ppo.rewards[1].timeout_s), so each changed key is named and judged on
  // its own.
  const auto maps = [](const YAML::Node& n) {
    return n.IsSequence() && std::all_of(n.begin(), n.end(), [](const YAML::Node& i) { return i.IsMap(); });
  };
  std::vector<std::string> lists;
  for (const auto& [k, e] : a)
    if (const auto other = b.find(k);
        other != b.end() && maps(e.node) && maps(other->second.node) && e.node.size() == other->second.node.size())
      lists.push_back(k);
  for (const auto& key : lists) {
    const auto before = a.at(key).node, after = b.at(key).node;
    a.erase(key);
    b.erase(key);
    for (size_t i = 0; i < before.size(); ++i) {
      flatten(before[i], concat(key, "[", i, "]"), "the saved", a);
      flatten(after[i], concat(key, "[", i, "]"), "the new", b);
    }
  }
  // A key the saved config lacks (written by an older version) had its
  // default, but for keys whose default changed what such runs did: until
  // 2026-11-26 weight decay applied to biases and norm weights too.
  const auto defaults = flat_of(to_yaml(RunConfig{}), "the default");
  if (const auto wd = a.find("optimizer.weight_decay");
      wd != a.end() && wd->second.node.as<double>(0.0) != 0 && !a.count("optimizer.decay_biases_and_norms"))
    a["optimizer.decay_biases_and_norms"].node = YAML::Node(true);
  const auto text = [](const FlatConfig& f, const std::string& k) -> std::string {
    const auto it = f.find(k);
    if (it == f.end()) return "(absent)";
    YAML::Emitter out;
    out << YAML::Flow << it->second.node;
    return out.c_str();
  };
  std::set<std::string> keys;
  for (const auto& [k, e] : a) keys.insert(k);
  for (const auto& [k, e] : b) keys.insert(k);
  // Sections of other algorithms than the new config's are not part of its
  // run (configs saved before they were left out of config.yaml list them).
  const auto fallback = RunConfig{}.algorithm;
  const auto algo = b.count("algorithm") ? b.at("algorithm").node.as<std::string>(fallback) : fallback;
  std::vector<ConfigChange> out;
  for (const auto& k : keys) {
    const auto owner = section_algorithm(k.substr(0, k.find_first_of(".[")));
    if (!owner.empty() && owner != algo) continue;
    if (const auto x = text(a.count(k) ? a : defaults, k), y = text(b, k); x != y) out.push_back({k, x, y});
  }
  return out;
}

namespace {
std::mutex& algorithm_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& algorithm_list() {
  static std::vector<std::string> names;
  return names;
}
}  // namespace

namespace {
std::vector<RegisteredSection>& section_list() {
  static std::vector<RegisteredSection> sections;
  return sections;
}
}  // namespace

void register_section(RegisteredSection section) {
  static const std::set<std::string> builtin = {"output_dir", "algorithm", "model", "tokenizer", "data",    "optimizer",
                                                "schedule",   "train",     "dist",  "eval",      "logging", "lora"};
  std::lock_guard<std::mutex> lock(algorithm_mutex());
  auto& list = section_list();
  if (section.name.empty() ||
      section.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    throw ConfigError(concat("register_section: \"", section.name, "\": expected a name of a-z, 0-9 and _"));
  if (!section.make) throw ConfigError(concat("register_section: ", section.name, ": no maker given"));
  if (builtin.count(section.name) ||
      std::any_of(list.begin(), list.end(), [&](const RegisteredSection& s) { return s.name == section.name; }))
    throw ConfigError(concat("config section \"", section.name, "\" is already registered"));
  list.push_back(std::move(section));
}

std::string section_algorithm(const std::string& section) {
  std::lock_guard<std::mutex> lock(algorithm_mutex());
  for (const auto& s : section_list())
    if (s.name == section) return s.algorithm;
  return "";
}

std::vector<RegisteredSection> registered_sections() {
  std::lock_guard<std::mutex> lock(algorithm_mutex());
  return section_list();
}

std::vector<std::string> algorithm_names() {
  std::lock_guard<std::mutex> lock(algorithm_mutex());
  return algorithm_list();
}

void add_algorithm_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(algorithm_mutex());
  auto& names = algorithm_list();
  if (std::find(names.begin(), names.end(), name) != names.end())
    throw ConfigError(concat("algorithm \"", name, "\" is already registered"));
  names.push_back(name);
}

std::string reference_markdown() {
  RunConfig cfg;
  Reference r;
  cfg.visit(r);
  return r.str();
}

}  // namespace anvil::config
