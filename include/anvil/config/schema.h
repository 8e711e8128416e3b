#pragma once
// The config schema. Validation rules attached to config fields: a config
// struct lists its fields once, in `template <class V> void visit(V& v)`,
// with key, doc and rule; the same list drives parsing, --print-config and
// the reference docs. A rule also says whether every algorithm reads its key
// or only those that declare it when they register (read_if_declared), so a
// key set for a run that would ignore it is an error instead of a silent
// no-op.
//
// Then what registers itself with the config layer: top-level config
// sections (an objective's ppo:, a program's own), the algorithms
// `algorithm:` accepts with the keys each reads, and the model families
// `model.family` accepts with the model keys each reads and its own checks.
// Built-in objectives and families register through these same calls, from
// their own files (src/train/objectives/sft.cpp, src/models/registry.cpp); config/
// names none of them. config.h includes this header and defines RunConfig.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anvil::config {

/// What a value must satisfy, with the words used in "expected ..." messages.
struct Rule {
  std::string expected;                      // e.g. "a positive number"
  std::function<bool(double)> number;        // for numeric fields (and each list element)
  std::vector<std::string> choices;          // for string fields; empty = any
  bool required = false;                     // must be set by some config source
  bool declared = false;                     // read only by the algorithms that declare it (read_if_declared)
  std::optional<double> off = std::nullopt;  // a value asking for nothing (0 = no generation), taken anywhere
  bool changeable_on_resume = false;         // may differ from the checkpoint's on resume (changeable_on_resume)
  /// An integer field that also takes this word (e.g. "auto"), read as `word_value` and written back as the
  /// word (or_word).
  std::string word{};
  int64_t word_value = 0;
  /// The key's former name in the same section (model.num_layers for model.num_hidden_layers), still read with
  /// a warning until kOldNamesUntil (renamed_from).
  std::string old_name{};
};

/// The release until which a renamed key's former name is accepted.
inline constexpr const char* kOldNamesUntil = "0.2.0";

inline Rule any() { return {}; }
inline Rule required() {
  Rule r;
  r.required = true;
  r.expected = "a value";
  return r;
}
/// A rule that must also be set by some config source (no usable default).
inline Rule required(Rule r) {
  r.required = true;
  return r;
}
inline Rule positive() {
  return {"a positive number", [](double x) { return x > 0; }, {}};
}
inline Rule non_negative() {
  return {"a number >= 0", [](double x) { return x >= 0; }, {}};
}
inline Rule at_least(double lo, std::string expected) {
  return {std::move(expected), [lo](double x) { return x >= lo; }, {}};
}
inline Rule in_unit_interval() {
  return {"a number in [0, 1]", [](double x) { return x >= 0 && x <= 1; }, {}};
}
inline Rule in_open_unit_interval() {
  return {"a number in [0, 1)", [](double x) { return x >= 0 && x < 1; }, {}};
}
inline Rule one_of(std::vector<std::string> choices) {
  std::string e = "one of";
  for (size_t i = 0; i < choices.size(); ++i) e += (i ? ", " : " ") + choices[i];
  return {e, {}, std::move(choices)};
}
/// The names of an enum's values, for a config key that is one of them: the
/// key reads and writes the names (enum_field), and code compares the enum.
template <class E>
class Choices {
 public:
  Choices(std::initializer_list<std::pair<const char*, E>> values) : values_(values) {}
  /// `e`'s name ("" for a value without one).
  const char* name(E e) const {
    for (const auto& [n, v] : values_)
      if (v == e) return n;
    return "";
  }
  std::optional<E> find(const std::string& name) const {
    for (const auto& [n, v] : values_)
      if (name == n) return v;
    return std::nullopt;
  }
  /// The rule "one of" the names (wrap it: changeable_on_resume(c.rule())).
  Rule rule() const {
    std::vector<std::string> names;
    for (const auto& [n, v] : values_) names.emplace_back(n);
    return one_of(std::move(names));
  }

 private:
  std::vector<std::pair<const char*, E>> values_;
};

/// A field whose config value is one of `choices`' names and whose value is
/// the enum: the visitor sees the name under `rule` (choices.rule(), maybe
/// wrapped), and the enum is set from the name it parsed, once, here.
template <class V, class E>
void enum_field(V& v, const char* key, E& value, const char* doc, const Choices<E>& choices, const Rule& rule) {
  std::string name = choices.name(value);
  v.field(key, name, doc, rule);
  if (const auto parsed = choices.find(name)) value = *parsed;
}

/// `r`, for a key that only some algorithms read: those that list it when
/// they register (train::register_objective's `reads`). Set to another value
/// than its default in a run of any other algorithm, the key is an error that
/// names its readers. An `off` value (one that turns the key's feature off)
/// is accepted anywhere.
inline Rule read_if_declared(Rule r = {}) {
  r.declared = true;
  return r;
}
inline Rule read_if_declared(Rule r, double off) {
  r.off = off;
  return read_if_declared(std::move(r));
}
/// `r`, for a key that says how long a run goes, what it observes or how it
/// executes, not what it computes (the save cadence, a timeout, how many
/// sequences are generated together): a resume may change it, and the change
/// is logged (may_change_on_resume). Any other key's change stops a resume
/// unless train.allow_config_change is set.
inline Rule changeable_on_resume(Rule r = {}) {
  r.changeable_on_resume = true;
  return r;
}
/// `r` for an integer field that also takes `word`, held as `value` (outside
/// what `r` accepts) and printed as the word: train.micro_batch_size: auto.
inline Rule or_word(Rule r, std::string word, int64_t value) {
  r.expected += ", or " + word;
  r.word = std::move(word);
  r.word_value = value;
  return r;
}

/// `r` for a key renamed from `old_name` (in the same section): a config
/// that still says the old name is read as if it said the new one, with a
/// warning naming both, until kOldNamesUntil; both in one source is an error,
/// and in two sources the later one wins, as for any key.
inline Rule renamed_from(std::string old_name, Rule r = {}) {
  r.old_name = std::move(old_name);
  return r;
}

struct ModelConfig;

class FieldVisitor;

/// A nested section of a registered section (ppo.reward), as FieldVisitor
/// passes it: visits the section's fields.
struct SectionRef {
  std::function<void(FieldVisitor&)> visit;
  template <class S>
  static SectionRef of(S& s) {
    return {[&s](FieldVisitor& v) { s.visit(v); }};
  }
};

/// A list of maps inside a registered section (ppo.rewards), as FieldVisitor
/// passes it: its size, a resize to default items, and item i's fields (or a
/// default item's, for the reference).
struct ListRef {
  std::function<size_t()> size;
  std::function<void(size_t)> resize;
  std::function<void(size_t, FieldVisitor&)> visit;
  std::function<void(FieldVisitor&)> visit_default;
  template <class S>
  static ListRef of(std::vector<S>& items) {
    return {[&items] { return items.size(); }, [&items](size_t n) { items.assign(n, S{}); },
            [&items](size_t i, FieldVisitor& v) { items.at(i).visit(v); },
            [](FieldVisitor& v) {
              S item;
              item.visit(v);
            }};
  }
};

/// How a registered section lists its fields: `template <class V> void
/// visit(V& v)` (or `void visit(FieldVisitor& v)`) calls v.field(key, value,
/// doc, rule) for each, v.section(key, sub, doc) for a nested struct and
/// v.list(key, items, doc) for a std::vector of structs, as built-in sections
/// do. Fields are bool, int64_t, double, std::string, or std::vector of
/// double, int64_t or std::string.
class FieldVisitor {
 public:
  virtual ~FieldVisitor() = default;
  virtual void field(const char* key, bool& value, const char* doc, const Rule& rule) = 0;
  virtual void field(const char* key, int64_t& value, const char* doc, const Rule& rule) = 0;
  virtual void field(const char* key, double& value, const char* doc, const Rule& rule) = 0;
  virtual void field(const char* key, std::string& value, const char* doc, const Rule& rule) = 0;
  virtual void field(const char* key, std::vector<double>& value, const char* doc, const Rule& rule) = 0;
  virtual void field(const char* key, std::vector<int64_t>& value, const char* doc, const Rule& rule) = 0;
  virtual void field(const char* key, std::vector<std::string>& value, const char* doc, const Rule& rule) = 0;
  virtual void section(const char* key, const SectionRef& s, const char* doc) = 0;
  virtual void list(const char* key, const ListRef& items, const char* doc) = 0;
  template <class T>
  void field(const char* key, T& value, const char* doc) {
    field(key, value, doc, Rule{});
  }
  template <class S>
  void section(const char* key, S& s, const char* doc) {
    section(key, SectionRef::of(s), doc);
  }
  template <class S>
  void list(const char* key, std::vector<S>& items, const char* doc) {
    list(key, ListRef::of(items), doc);
  }
};

/// A registered config section's values, held by RunConfig::extensions.
class Extension {
 public:
  virtual ~Extension() = default;
  virtual void visit(FieldVisitor& v) = 0;
  virtual std::unique_ptr<Extension> clone() const = 0;
};

/// The Extension holding a `T` (a struct with `visit`, as FieldVisitor says).
template <class T>
class ExtensionOf final : public Extension {
 public:
  T value;
  void visit(FieldVisitor& v) override { value.visit(v); }
  std::unique_ptr<Extension> clone() const override { return std::make_unique<ExtensionOf>(*this); }
};

struct RunConfig;

/// What a registered section's check reports problems through: each with the
/// key's file and line, together with every other problem of the config.
class Checks {
 public:
  using Fail = std::function<void(const std::string& key, const std::string& what)>;
  explicit Checks(Fail fail) : fail_(std::move(fail)) {}
  /// `key` (e.g. "ppo.rewards[1].clip", a path as the config has it) is
  /// wrong; `what` says why and what was expected.
  void fail(const std::string& key, const std::string& what) const { fail_(key, what); }
  /// `path`, the value of `key`, must be a model folder (or a Hugging Face
  /// model id in the local cache); empty passes.
  void model_folder(const std::string& key, const std::string& path) const;

 private:
  Fail fail_;
};

/// A section a program (or the library, for its built-in objectives)
/// registered: its name, doc line and a maker of its defaults.
struct RegisteredSection {
  std::string name;
  std::string doc;
  std::function<std::unique_ptr<Extension>()> make;
  std::string algorithm;  // the algorithm that reads it ("" = every run)
  /// Cross-field checks, run once the whole config has parsed, when the run
  /// reads the section.
  std::function<void(const RunConfig& cfg, const Checks& checks)> check = {};
  /// Other trainers' names for its keys: {last part of the name, our key}
  /// ({"num_generations", "ppo.samples_per_prompt"}), named in the message
  /// when a config uses them.
  std::vector<std::pair<std::string, std::string>> foreign_names = {};
};

/// Registers the top-level config section `name`: its keys load from files
/// and overrides, print, appear in the reference and are checked on resume
/// like a built-in section's. A section of an `algorithm` is accepted only in
/// configs of that algorithm. Throws ConfigError when the name is taken.
void register_section(RegisteredSection section);
/// The same for the section held as a `T`; `check(section, cfg, checks)`
/// (optional) runs the section's cross-field checks.
template <class T>
void register_section(const std::string& name, const std::string& doc, const std::string& algorithm = "",
                      std::function<void(const T& section, const RunConfig& cfg, const Checks& checks)> check = {},
                      std::vector<std::pair<std::string, std::string>> foreign_names = {});

/// The algorithm that reads top-level section `section` (a registered
/// section's), "" when every run does.
std::string section_algorithm(const std::string& section);
std::vector<RegisteredSection> registered_sections();

/// Values of registered structs by name (a config's registered sections, a
/// model's families' own keys), deep-copied with the config that holds them.
class ExtensionMap {
 public:
  using Maker = std::function<std::unique_ptr<Extension>()>;
  ExtensionMap() = default;
  ExtensionMap(const ExtensionMap& o) { *this = o; }
  ExtensionMap& operator=(const ExtensionMap& o) {
    if (this == &o) return *this;
    values_.clear();
    for (const auto& [k, v] : o.values_) values_.emplace(k, v->clone());
    return *this;
  }
  ExtensionMap(ExtensionMap&&) = default;
  ExtensionMap& operator=(ExtensionMap&&) = default;

 protected:
  /// The value `name` (made by `make` when missing).
  Extension& value_at(const std::string& name, const Maker& make) {
    auto& e = values_[name];
    if (!e) e = make();
    return *e;
  }
  /// The value `name` as a `T`: the one held, else `make`'s defaults when it
  /// makes a `T` (`make` is the registered maker, empty when there is none);
  /// otherwise throws std::out_of_range(`missing`).
  template <class T>
  const T& value_as(const std::string& name, const Maker& make, const std::string& missing) const {
    if (const auto it = values_.find(name); it != values_.end()) {
      if (const auto* e = dynamic_cast<const ExtensionOf<T>*>(it->second.get())) return e->value;
    } else if (make && dynamic_cast<const ExtensionOf<T>*>(make().get())) {
      static const T defaults{};
      return defaults;
    }
    throw std::out_of_range(missing);
  }
  /// The same, to change; created with its defaults when missing.
  template <class T>
  T& value_as(const std::string& name, const Maker& make, const std::string& missing) {
    if (make)
      if (auto* e = dynamic_cast<ExtensionOf<T>*>(&value_at(name, make))) return e->value;
    throw std::out_of_range(missing);
  }

 private:
  std::map<std::string, std::unique_ptr<Extension>> values_;
};

/// RunConfig's registered sections by name.
class Extensions : public ExtensionMap {
 public:
  /// The section `s` (created with its defaults when missing).
  Extension& at(const RegisteredSection& s) { return value_at(s.name, s.make); }
  /// The values of section `name` as a `T`, its defaults when the config has
  /// not set it; throws std::out_of_range when the section is not registered
  /// with this type.
  template <class T>
  const T& get(const std::string& name) const {
    return value_as<T>(name, maker(name), missing(name));
  }
  /// The values of section `name` as a `T`, to change (tests, programs that
  /// build a config in code); created with its defaults when missing.
  template <class T>
  T& get(const std::string& name) {
    return value_as<T>(name, maker(name), missing(name));
  }

 private:
  static Maker maker(const std::string& name) {
    for (const auto& s : registered_sections())
      if (s.name == name) return s.make;
    return {};
  }
  static std::string missing(const std::string& name) {
    return "config section \"" + name + "\" is not registered with this type";
  }
};

namespace detail {
/// Gives a registered section's fields to one of the config layer's visitors
/// (those RunConfig::visit takes: field, section and list templates, and
/// list_of(key, const ListRef&, doc) for a list inside a registered section).
template <class V>
class FieldVisitorFor final : public FieldVisitor {
 public:
  explicit FieldVisitorFor(V& v) : v_(v) {}
  using FieldVisitor::field;
  using FieldVisitor::list;
  using FieldVisitor::section;
  void field(const char* k, bool& x, const char* d, const Rule& r) override { v_.field(k, x, d, r); }
  void field(const char* k, int64_t& x, const char* d, const Rule& r) override { v_.field(k, x, d, r); }
  void field(const char* k, double& x, const char* d, const Rule& r) override { v_.field(k, x, d, r); }
  void field(const char* k, std::string& x, const char* d, const Rule& r) override { v_.field(k, x, d, r); }
  void field(const char* k, std::vector<double>& x, const char* d, const Rule& r) override { v_.field(k, x, d, r); }
  void field(const char* k, std::vector<int64_t>& x, const char* d, const Rule& r) override { v_.field(k, x, d, r); }
  void field(const char* k, std::vector<std::string>& x, const char* d, const Rule& r) override {
    v_.field(k, x, d, r);
  }
  void section(const char* k, const SectionRef& s, const char* d) override;
  void list(const char* k, const ListRef& items, const char* d) override { v_.list_of(k, items, d); }

 private:
  V& v_;
};
/// A SectionRef as the config layer's visitors take a section: a struct with visit(V&).
struct SectionShim {
  const SectionRef& ref;
  template <class V>
  void visit(V& v) {
    FieldVisitorFor<V> a(v);
    ref.visit(a);
  }
};
template <class V>
void FieldVisitorFor<V>::section(const char* k, const SectionRef& s, const char* d) {
  SectionShim shim{s};
  v_.section(k, shim, d);
}
struct ExtensionShim {
  Extension& ext;
  template <class V>
  void visit(V& v) {
    FieldVisitorFor<V> a(v);
    ext.visit(a);
  }
};
}  // namespace detail

/// The names `algorithm:` accepts: those registered through
/// train::register_objective (the library's own, then a program's), in the
/// order they were registered.
std::vector<std::string> algorithm_names();
/// Adds `name` to algorithm_names() (train::register_objective calls it);
/// throws ConfigError when it is already there. Without `reads`, the
/// algorithm is taken to read every key; with it, of the keys that only some
/// algorithms read (read_if_declared), it reads those listed, by the names
/// keys_read_by gives (a key it does not know is a ConfigError).
void add_algorithm_name(const std::string& name);
void add_algorithm_name(const std::string& name, const std::vector<std::string>& reads);

/// Every key that a run of `algorithm` reads, as the reference names them
/// (train.loss_chunk_size, data.train[].response_field): all keys but those
/// of other algorithms' sections and the read_if_declared keys it did not
/// declare. Set to a value other than its default, any other key is a config
/// error. Throws ConfigError when no such algorithm is registered.
std::vector<std::string> keys_read_by(const std::string& algorithm);
/// data.train[].<field> and data.eval[].<field> for each of `fields`: how a
/// registering objective names the dataset keys it reads.
std::vector<std::string> dataset_keys(const std::vector<std::string>& fields);
/// The algorithms that declared they read the read_if_declared key `key`
/// (named as keys_read_by names it), in registration order.
std::vector<std::string> readers_of(const std::string& key);

/// Keys of the model section that several families read but not every one
/// (grouped-query attention, rotary, experts): a struct with visit, as
/// FieldVisitor says, and a static `kGroup` name, registered once
/// (models/registry.h registers the library's). The families that read one of
/// its keys name it in FamilyKeys::reads; set to another value than its
/// default for any other family, it is a config error naming its readers.
/// Its keys load, print, appear in the reference and are checked on resume
/// like ModelConfig's own; ModelConfig::keys holds their values. `check`
/// runs on a model built from keys (not model.from), whatever its family.
struct ModelKeyGroup {
  std::string name;
  std::function<std::unique_ptr<Extension>()> keys;
  std::function<void(const ModelConfig& model, const Checks& checks)> check = {};
};

/// A model family as the config layer knows it: its name (model.family), the
/// keys of the registered groups it reads, the keys that are its alone, and
/// its own checks of a model built from keys (not run for model.from, whose
/// config.json defines the model). models::ModelFamily registers one for each
/// family of the model registry (src/models/registry.cpp).
struct FamilyKeys {
  std::string name;
  /// Keys of ModelKeyGroups it reads, by their full name
  /// ("model.sliding_window"). A key that some family reads and this one does
  /// not, set to another value than its default, is a config error naming the
  /// families that read it.
  std::vector<std::string> reads;
  std::function<void(const ModelConfig& model, const Checks& checks)> check = {};
  /// Keys only it reads (family_keys<T>(): a struct with visit, as
  /// FieldVisitor says): a group of its own, named as the family, in the
  /// model section beside the others (model.do_layer_norm_before for opt);
  /// read them with ModelConfig::keys.get<T>(name).
  std::function<std::unique_ptr<Extension>()> own_keys = {};
};

/// The maker of a family's own keys (or of a key group's), held as a `T`.
template <class T>
std::function<std::unique_ptr<Extension>()> family_keys() {
  return [] { return std::unique_ptr<Extension>(std::make_unique<ExtensionOf<T>>()); };
}
/// The group of keys held as a `T` (named T::kGroup).
template <class T>
ModelKeyGroup model_key_group(std::function<void(const ModelConfig& model, const Checks& checks)> check = {}) {
  return {T::kGroup, family_keys<T>(), std::move(check)};
}

/// Adds a group to model_key_groups(); throws ConfigError when its name is
/// taken (by a group or a family) or one of its keys is already a key of the
/// model section. Groups register before the families that read them.
void add_model_key_group(ModelKeyGroup group);
/// The registered groups, in registration order.
std::vector<ModelKeyGroup> model_key_groups();
/// Adds a family to model_family_names(); throws ConfigError when the name is
/// taken, a key it reads is not a model.* key, or one of its own keys is
/// already a key of the model section.
void add_model_family(FamilyKeys family);
/// The registered families, in registration order.
std::vector<FamilyKeys> model_families();
/// The names `model.family` accepts, in registration order.
std::vector<std::string> model_family_names();
/// The registered families that read `key` (a model.* key only some read,
/// its own keys among them), in registration order; empty when every family
/// reads it.
std::vector<std::string> model_families_reading(const std::string& key);

/// The model section's keys beyond those every family reads: the registered
/// groups' (ModelKeyGroup) and each family's own, by group or family name.
class ModelKeys : public ExtensionMap {
 public:
  /// The keys registered as `name` (created with their defaults when missing).
  Extension& at(const std::string& name) { return value_at(name, maker(name)); }
  /// Group T::kGroup's keys as a `T` (models::RotaryKeys), their defaults when
  /// the config has set none.
  template <class T>
  const T& get() const {
    return get<T>(T::kGroup);
  }
  template <class T>
  T& get() {
    return get<T>(T::kGroup);
  }
  /// The keys registered as `name` (a group, or a family's own) as a `T`;
  /// throws std::out_of_range when none of this type are registered so.
  template <class T>
  const T& get(const std::string& name) const {
    return value_as<T>(name, maker(name), missing(name));
  }
  /// The same, to change (tests, programs that build a config in code).
  template <class T>
  T& get(const std::string& name) {
    return value_as<T>(name, maker(name), missing(name));
  }

 private:
  static Maker maker(const std::string& name) {
    for (const auto& g : model_key_groups())
      if (g.name == name) return g.keys;
    for (const auto& f : model_families())
      if (f.name == name) return f.own_keys;
    return {};
  }
  static std::string missing(const std::string& name) {
    return "no model key group or family \"" + name + "\" registered keys of this type";
  }
};

}  // namespace anvil::config
