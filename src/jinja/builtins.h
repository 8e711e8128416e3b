#pragma once
// What a chat template can call and apply: jinja2's filters and tests,
// attribute and item lookup as the sandbox does it, Python's operators and
// the str/dict/list methods templates use, and the globals transformers
// provides (range, namespace, dict, raise_exception, strftime_now).
// Everything throws EvalError; the evaluator adds the position.

#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace anvil::jinja {

/// raise_exception(message): the template refuses its input.
class Raised : public EvalError {
 public:
  using EvalError::EvalError;
};

Value apply_filter(const std::string& name, const Value& v, CallArgs& args);
bool apply_test(const std::string& name, const Value& v, CallArgs& args);
/// Why a filter or test of that name cannot run ("no filter named 'x'",
/// "... not supported ..."), or "" when it can.
std::string filter_problem(const std::string& name);
std::string test_problem(const std::string& name);

/// `obj.name`: Python's getattr (bound str/dict/list methods), then obj[name].
Value get_attr(const Value& obj, const std::string& name);
/// `obj[key]`: the item, then (string keys) the attribute; undefined when neither.
Value get_item(const Value& obj, const Value& key);
/// `obj[start:stop:step]` (none where left out).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
/// + - * / // % ** as Python computes them.
Value binary_op(const std::string& op, const Value& a, const Value& b);
/// Unary minus.
Value negate(const Value& v);

/// Refuses a value that is or holds a namespace, the loop object or a
/// function as the attribute `attr` of namespace `ns`: then no value can
/// contain itself (lists and dicts do not change once made), so printing,
/// comparing and freeing values ends.
void check_namespace_value(const Value& v, const std::string& ns, const std::string& attr);

/// The globals every template sees.
std::vector<std::pair<std::string, Value>> globals();

// Argument binding for builtins: positional, then by keyword, else a default.
class Args {
 public:
  /// Throws EvalError for an unknown keyword, or (unless `varargs`) too many arguments.
  Args(CallArgs& a, std::string what, std::vector<std::string> names, bool varargs = false);
  /// The argument `i` (named names[i]), or null when not given.
  const Value* get(size_t i) const;
  Value get_or(size_t i, Value def) const;
  /// Positional arguments past the named ones (map/select's).
  std::vector<Value> rest() const;
  const std::string& what() const { return what_; }

 private:
  CallArgs& a_;
  std::string what_;
  std::vector<std::string> names_;
};

/// Python's int(s, base) on a string; false when it is not one.
bool parse_py_int(const std::string& s, int base, int64_t* out);
/// Python's float(s) on a string; false when it is not one.
bool parse_py_float(const std::string& s, double* out);

/// Python's format.format(*args.pos, **args.kw) (jinja/format.cpp).
std::string str_format(const std::string& format, CallArgs& args);

/// str methods (strip, split, startswith, ...), by name, on `s`.
Value call_str_method(const std::string& s, const std::string& name, CallArgs& args);
bool is_str_method(const std::string& name);

}  // namespace anvil::jinja
