#pragma once
// Validation rules attached to config fields. A config struct lists its
// fields once, in `template <class V> void visit(V& v)`, with key, doc and
// rule; the same list drives parsing, --print-config and the reference docs.
// A rule also says whether every algorithm reads its key or only those that
// declare it when they register (read_if_declared), so a key set for a run
// that would ignore it is an error instead of a silent no-op.

#include <functional>
#include <optional>
#include <string>
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
};

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

}  // namespace anvil::config
