#pragma once
// The values a chat template computes with, as Jinja (on Python) sees them:
// undefined, none, bool, int, float, str, list/tuple, dict (ordered),
// namespace and callables, with Python's printing, truthiness, equality,
// ordering and json.dumps. Strings are UTF-8; lengths, indices and slices
// count code points, as Python's do.

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace anvil::jinja {

/// A failure while evaluating, without a position yet; the evaluator adds
/// the template's line and column.
class EvalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;

struct ListObj {
  std::vector<Value> items;
  bool tuple = false;
  /// A Python generator (what map, select, reverse ... return): always true,
  /// no length, usable once. A second use is an error rather than the empty
  /// sequence Python would silently give.
  bool lazy = false;
  bool consumed = false;
  /// A Python range (from range() or a slice of one): printed as
  /// "range(start, stop[, step])", not JSON, unequal to lists, not added to
  /// or repeated.
  bool is_range = false;
  int64_t start = 0, stop = 0, step = 1;
  /// How deep lists, dicts and namespaces nest in it (1 for none inside),
  /// and whether it holds a namespace, the loop object or a function: found
  /// when it is made (its items do not change after).
  int depth = 1;
  bool holds_object = false;
};

struct DictObj {
  std::vector<std::pair<Value, Value>> items;  // insertion order
  /// As ListObj's, kept by set(): a dict only grows through it.
  int depth = 1;
  bool holds_object = false;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  /// Throws EvalError when the value would nest deeper than kMaxValueDepth.
  void set(Value key, Value value);
  /// set() for a key known not to be there: no search.
  void add_new(Value key, Value value);

 private:
  void note(const Value& key, const Value& value);  // checks and records what `value` nests
};

/// namespace(...) objects (attributes settable by {% set ns.x = ... %}), and
/// the read-only `loop` object.
struct NamespaceObj {
  DictObj attrs;
  bool loop = false;
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct FunctionObj {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, function };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  // Strings, lists and dicts made while a template renders count against its
  // budget (jinja/limits.h); one longer than kMaxTextBytes, or values
  // nested deeper than kMaxValueDepth, are an EvalError.
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double d);
  static Value string(std::string s);
  /// A string marked safe (jinja2's Markup, from |safe and |e): escaping it
  /// again does nothing, and adding a plain string to it escapes that string.
  static Value markup(std::string s);
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value lazy(std::vector<Value> items);
  static Value dict(std::shared_ptr<DictObj> d);
  static Value dict();
  static Value ns(std::shared_ptr<NamespaceObj> n);
  static Value function(std::string name, std::function<Value(CallArgs&)> f);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::undefined; }
  bool is_none() const { return kind() == Kind::none; }
  bool is_string() const { return kind() == Kind::string; }
  bool is_markup() const { return markup_; }
  bool is_list() const { return kind() == Kind::list; }
  bool is_dict() const { return kind() == Kind::dict; }
  bool is_number() const { return kind() == Kind::integer || kind() == Kind::floating || kind() == Kind::boolean; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;    // bool or int
  double as_double() const;  // bool, int or float
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  ListObj& list_obj() const { return *std::get<std::shared_ptr<ListObj>>(v_); }
  DictObj& dict_obj() const { return *std::get<std::shared_ptr<DictObj>>(v_); }
  NamespaceObj& ns_obj() const { return *std::get<std::shared_ptr<NamespaceObj>>(v_); }
  FunctionObj& function_obj() const { return *std::get<std::shared_ptr<FunctionObj>>(v_); }
  const void* identity() const;  // for `is sameas` on objects
  /// What an undefined value stood for ("'x' is undefined").
  const std::string& hint() const { return std::get<Undef>(v_).hint; }

 private:
  struct Undef {
    std::string hint;
  };
  // Strings are shared, as Python's are: a copy of a value costs no more for a long one.
  std::variant<Undef, std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<ListObj>, std::shared_ptr<DictObj>, std::shared_ptr<NamespaceObj>,
               std::shared_ptr<FunctionObj>>
      v_;
  bool markup_ = false;
};

/// How deep lists, dicts and namespaces nest in `v` (0 for a scalar).
int nesting(const Value& v);
/// Whether `v` is or holds a namespace, the loop object or a function: what
/// a namespace attribute may not hold, so that no value contains itself.
bool holds_object(const Value& v);

/// Python's type name ("str", "int", "NoneType", "list", "tuple", ...).
std::string type_name(const Value& v);
/// Python's bool(v).
bool truthy(const Value& v);
/// Python's str(v): what {{ v }} prints ("" for undefined).
std::string to_str(const Value& v);
/// Python's repr(v).
std::string repr(const Value& v);
/// Python's float repr ("1.0", "1e+16", "0.0001").
std::string float_repr(double d);
/// Python's ==.
bool equal(const Value& a, const Value& b);
/// Python's ordering: <0, 0, >0; EvalError for types Python cannot order.
int compare(const Value& a, const Value& b);
/// Python's `a in b`.
bool contains(const Value& container, const Value& item);
/// The items a for loop visits: list items, dict keys, string characters
/// (undefined: none). Marks a generator used; EvalError for a second use.
std::vector<Value> iterate(const Value& v);
/// Python's len(); EvalError where Python has none.
int64_t length(const Value& v);
/// An undefined value used where Jinja raises UndefinedError.
[[noreturn]] void undefined_error(const Value& v);

struct JsonOptions {
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool indent_set = false;
  std::string indent;  // the indent string, when set
  std::string item_sep = ", ", key_sep = ": ";
};
/// markupsafe's escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view s);

/// Python's json.dumps with `o` (transformers' tojson).
std::string to_json(const Value& v, const JsonOptions& o);

// ---------------------------------------------------------------- strings as Python sees them

std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
int64_t code_points(std::string_view s);
/// str.isspace for one character.
bool is_py_space(char32_t c);
/// str.upper / str.lower, with Python's full mappings ("ß" -> "SS") and final sigma.
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
enum class CaseMap { upper, title, lower };
/// One character's case mapping as UTF-8, where it is several characters
/// (Python's SpecialCasing); null where it is one (utf8proc's).
const char* full_case(char32_t c, CaseMap which);
/// One character upper-, title- or lower-cased as Python does.
std::string case_char(char32_t c, CaseMap which);
/// str.strip / lstrip / rstrip: whitespace when `chars` is null.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace anvil::jinja
