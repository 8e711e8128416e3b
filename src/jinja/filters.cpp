// jinja2's filters (jinja2/filters.py) and tests (jinja2/tests.py), with
// transformers' tojson (json.dumps, ensure_ascii=False). map, select,
// reject, selectattr, rejectattr, unique, items and reverse give generators
// as in jinja2 (always true, no length, usable once).

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "anvil/core/error.h"
#include "jinja/builtins.h"
#include "jinja/limits.h"

namespace anvil::jinja {
namespace {

const std::set<std::string>& supported_filters() {
  static const std::set<std::string> s = {
      "abs",     "attr",  "capitalize", "center", "count",      "d",    "default", "dictsort",   "e",
      "escape",  "first", "float",      "format", "indent",     "int",  "items",   "join",       "last",
      "length",  "list",  "lower",      "map",    "max",        "min",  "reject",  "rejectattr", "replace",
      "reverse", "round", "safe",       "select", "selectattr", "sort", "string",  "sum",        "title",
      "tojson",  "trim",  "unique",     "upper",  "wordcount"};
  return s;
}
const std::set<std::string>& jinja_only_filters() {
  static const std::set<std::string> s = {"batch",  "filesizeformat", "forceescape", "groupby",  "pprint",
                                          "random", "slice",          "striptags",   "truncate", "urlencode",
                                          "urlize", "wordwrap",       "xmlattr"};
  return s;
}
// Tests without an argument; the others take one.
const std::set<std::string>& unary_tests() {
  static const std::set<std::string> s = {"odd",    "even",    "defined", "undefined", "none",     "boolean",
                                          "false",  "true",    "integer", "float",     "lower",    "upper",
                                          "string", "mapping", "number",  "sequence",  "iterable", "callable"};
  return s;
}
const std::set<std::string>& binary_tests() {
  static const std::set<std::string> s = {"divisibleby", "sameas", "in", "==", "eq", "equalto",  "!=", "ne", ">", "gt",
                                          "greaterthan", "ge",     ">=", "<",  "lt", "lessthan", "<=", "le"};
  return s;
}

// An undefined value handed to a filter or test: jinja2 passes it on and
// Python mostly refuses it (as an int, a bool, a key); Anvil always does.
void check_defined(const std::string& what, const CallArgs& ca) {
  for (const auto& v : ca.pos)
    if (v.is_undefined()) throw EvalError(concat(what, ": an argument is undefined (", v.hint(), ")"));
  for (const auto& [k, v] : ca.kw)
    if (v.is_undefined()) throw EvalError(concat(what, ": the argument ", k, " is undefined (", v.hint(), ")"));
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value attribute_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value v = item;
  std::string_view path = attribute.str();
  while (true) {
    const auto dot = path.find('.');
    const std::string part(path.substr(0, dot));
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    int64_t index = 0;
    if (digits && std::from_chars(part.data(), part.data() + part.size(), index).ec != std::errc())
      v = Value::undefined(concat(type_name(v), " object has no element ", part));  // beyond 64 bits: no such item
    else
      v = get_item(v, digits ? Value::integer(index) : Value::string(part));
    if (dot == std::string_view::npos) return v;
    path.remove_prefix(dot + 1);
  }
}

// sorted()'s reverse: an int or a bool (Python refuses anything else).
bool reverse_flag(const Args& a, size_t i) {
  const Value* v = a.get(i);
  if (!v) return false;
  if (v->kind() != Value::Kind::integer && v->kind() != Value::Kind::boolean)
    throw EvalError(concat(a.what(), ": reverse must be an integer or a boolean, not ", type_name(*v)));
  return v->as_int() != 0;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py_lower(v.str())) : v; }

std::string str_of(const Value& v) { return to_str(v); }

// Python's int() of a float; beyond 64 bits (Python's ints have no bound) is an error.
int64_t float_to_int(double d) {
  if (std::isnan(d)) throw EvalError("cannot convert float NaN to integer");
  if (!(d >= -0x1p63 && d < 0x1p63)) throw EvalError("integer overflow (beyond 64 bits)");
  return static_cast<int64_t>(d);
}

int64_t int_arg(const Args& a, size_t i, int64_t def) {
  const Value* v = a.get(i);
  if (!v) return def;
  if (v->kind() != Value::Kind::integer && v->kind() != Value::Kind::boolean)
    throw EvalError(concat(a.what(), ": expected an integer argument, got ", type_name(*v)));
  return v->as_int();
}

// The item predicate of select/reject (test name + args) or selectattr/rejectattr (attribute first).
std::function<bool(const Value&)> predicate(const Args& a, bool by_attr) {
  auto rest = a.rest();
  Value attr;
  if (by_attr) {
    if (rest.empty()) throw EvalError(concat(a.what(), ": missing the attribute name"));
    attr = rest[0];
    rest.erase(rest.begin());
  }
  const auto transform = [attr, by_attr](const Value& item) { return by_attr ? attribute_path(item, attr) : item; };
  if (rest.empty()) return [transform](const Value& item) { return truthy(transform(item)); };
  if (!rest[0].is_string()) throw EvalError(concat(a.what(), ": the test name must be a string"));
  const std::string test = rest[0].str();
  std::vector<Value> targs(rest.begin() + 1, rest.end());
  return [transform, test, targs](const Value& item) {
    CallArgs ca{targs, {}};
    return apply_test(test, transform(item), ca);
  };
}

Value select_filter(const Value& v, const Args& a, bool by_attr, bool keep) {
  std::vector<Value> out;
  if (!truthy(v)) return Value::lazy({});
  const auto pred = predicate(a, by_attr);
  for (const auto& item : iterate(v))
    if (pred(item) == keep) out.push_back(item);
  return Value::lazy(std::move(out));
}

Value map_filter(const Value& v, CallArgs& ca) {
  std::vector<Value> out;
  if (!truthy(v)) return Value::lazy({});
  const Value* attribute = nullptr;
  Value def;
  for (const auto& [k, val] : ca.kw) {
    if (k == "attribute")
      attribute = &val;
    else if (k == "default")
      def = val;
    else
      throw EvalError(concat("map: unexpected argument '", k, "'"));
  }
  if (attribute) {
    if (!ca.pos.empty()) throw EvalError("map: a filter name and attribute= cannot be combined");
    for (const auto& item : iterate(v)) {
      Value x = attribute_path(item, *attribute);
      out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
    }
    return Value::lazy(std::move(out));
  }
  if (ca.pos.empty() || !ca.pos[0].is_string()) throw EvalError("map: expected a filter name or attribute=");
  const std::string name = ca.pos[0].str();
  std::vector<Value> fargs(ca.pos.begin() + 1, ca.pos.end());
  for (const auto& item : iterate(v)) {
    CallArgs sub{fargs, {}};
    out.push_back(apply_filter(name, item, sub));
  }
  return Value::lazy(std::move(out));
}

// Python's sorted(key=...) with jinja2's case folding.
std::vector<Value> sorted_items(std::vector<Value> items, const Value* attribute, bool case_sensitive, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items) {
    Value key = attribute && !attribute->is_none() ? attribute_path(item, *attribute) : item;
    keyed.emplace_back(case_sensitive ? key : ignore_case(key), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value min_max(const Value& v, const Args& a, bool max) {
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool cs = truthy(a.get_or(0, Value::boolean(false)));
  const Value* attr = a.get(1);
  size_t best = 0;
  const auto key = [&](const Value& x) {
    Value k = attr && !attr->is_none() ? attribute_path(x, *attr) : x;
    return cs ? k : ignore_case(k);
  };
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(key(items[i]), key(items[best]));
    if (max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

// jinja2's indent: Python splitlines on the text + "\n".
std::string indent_filter(const std::string& s, const Value& width, bool first, bool blank) {
  if (!width.is_string() && width.kind() != Value::Kind::integer && width.kind() != Value::Kind::boolean)
    throw EvalError(concat("indent: width must be an integer or a string, got ", type_name(width)));
  if (!width.is_string()) check_text_size(width.as_int());
  const std::string ind =
      width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  CallArgs none;
  const auto lines = call_str_method(s + "\n", "splitlines", none).list_obj().items;
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].str();
    if (i == 0) {
      rv = line;
      continue;
    }
    rv += "\n";
    rv += (blank || !line.empty()) ? ind + line : line;
    check_text_size(static_cast<int64_t>(rv.size()));
  }
  return first ? ind + rv : rv;
}

std::string title_filter(const std::string& s) {
  // re.split(r"([-\s({\[<]+)", s): separators stay, each piece capitalised as item[0].upper() + rest.lower().
  const auto u = decode_utf8(s);
  const auto sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
  };
  std::string out;
  for (size_t i = 0; i < u.size();) {
    size_t j = i;
    const bool is_sep = sep(u[i]);
    while (j < u.size() && sep(u[j]) == is_sep) ++j;
    const auto piece = encode_utf8(std::u32string_view(u).substr(i, j - i));
    const auto first = encode_utf8(std::u32string_view(u).substr(i, 1));
    out += py_upper(first) + py_lower(piece.substr(first.size()));
    i = j;
  }
  return out;
}

std::string format_filter(const std::string& fmt, const std::vector<Value>& args) {
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    const char c = i + 1 < fmt.size() ? fmt[++i] : 0;
    if (c == '%') {
      out += '%';
    } else if (c == 's' || c == 'd' || c == 'i') {
      if (k >= args.size()) throw EvalError("format: not enough arguments for format string");
      const Value& a = args[k++];
      if (c == 's') {
        out += to_str(a);
        check_text_size(static_cast<int64_t>(out.size()));
      } else if (a.is_number())
        out += std::to_string(a.kind() == Value::Kind::floating ? float_to_int(a.as_double()) : a.as_int());
      else
        throw EvalError(concat("format: %", c, " format: a real number is required, not ", type_name(a)));
    } else {
      throw EvalError(concat("format: the conversion '%", c, "' is not supported by Anvil's chat templates"));
    }
  }
  if (k != args.size()) throw EvalError("format: not all arguments converted during string formatting");
  return out;
}

Value round_filter(const Value& v, const Args& a) {
  const int64_t precision = int_arg(a, 0, 0);
  const Value method = a.get_or(1, Value::string("common"));
  if (!method.is_string() || (method.str() != "common" && method.str() != "ceil" && method.str() != "floor"))
    throw EvalError("round: method must be common, ceil or floor");
  if (!v.is_number()) throw EvalError(concat("round: expected a number, got ", type_name(v)));
  if (method.str() == "common") {  // Python's round(): half to even, on the exact binary value
    if (v.kind() != Value::Kind::floating) {
      if (precision >= 0) return Value::integer(v.as_int());
      throw EvalError("round: a negative precision on an integer is not supported by Anvil's chat templates");
    }
    if (precision < 0) {
      const double scale = std::pow(10.0, static_cast<double>(-precision));
      return Value::floating(std::nearbyint(v.as_double() / scale) * scale);
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), v.as_double());
    return Value::floating(precision == 0 ? std::nearbyint(v.as_double()) : std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value::floating((method.str() == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value tojson_filter(const Value& v, const Args& a) {
  JsonOptions o;
  o.ensure_ascii = truthy(a.get_or(0, Value::boolean(false)));
  const Value indent = a.get_or(1, Value::none());
  const Value separators = a.get_or(2, Value::none());
  o.sort_keys = truthy(a.get_or(3, Value::boolean(false)));
  if (!indent.is_none()) {
    o.indent_set = true;
    if (indent.is_string()) {
      o.indent = indent.str();
    } else if (indent.kind() == Value::Kind::integer) {
      check_text_size(indent.as_int());
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
    } else {
      throw EvalError(concat("tojson: indent must be an integer or a string, got ", type_name(indent)));
    }
    o.item_sep = ",";
  }
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.list_obj().items.size() != 2 ||
        !separators.list_obj().items[0].is_string() || !separators.list_obj().items[1].is_string())
      throw EvalError("tojson: separators must be a pair of strings");
    o.item_sep = separators.list_obj().items[0].str();
    o.key_sep = separators.list_obj().items[1].str();
  }
  return Value::string(to_json(v, o));
}

Value reverse_filter(const Value& v) {
  if (v.is_string()) {
    auto u = decode_utf8(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(encode_utf8(u));
  }
  if ((v.is_list() && v.list_obj().lazy) || v.is_undefined()) {  // reversed() fails: jinja2 makes a list
    auto items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::lazy(std::move(items));
}

Value number_filter(const Value& v, const Args& a, bool integer) {
  if (integer) {
    const Value def = a.get_or(0, Value::integer(0));
    const int64_t base = int_arg(a, 1, 10);
    int64_t i = 0;
    double d = 0;
    if (v.kind() == Value::Kind::integer || v.kind() == Value::Kind::boolean) return Value::integer(v.as_int());
    if (v.kind() == Value::Kind::floating && std::isfinite(v.as_double()))
      return Value::integer(float_to_int(v.as_double()));
    if (v.is_string() && parse_py_int(v.str(), static_cast<int>(base), &i)) return Value::integer(i);
    if (v.is_string() && parse_py_float(v.str(), &d) && std::isfinite(d)) return Value::integer(float_to_int(d));
    return def;
  }
  double d = 0;
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string() && parse_py_float(v.str(), &d)) return Value::floating(d);
  return a.get_or(0, Value::floating(0.0));
}

Value string_filter(const std::string& name, const Value& v, CallArgs& ca) {
  if (name == "upper" || name == "lower") {
    Args a(ca, name, {});
    return Value::string(name == "upper" ? py_upper(str_of(v)) : py_lower(str_of(v)));
  }
  if (name == "capitalize") {
    Args a(ca, name, {});
    return call_str_method(str_of(v), "capitalize", ca);
  }
  if (name == "title") {
    Args a(ca, name, {});
    return Value::string(title_filter(str_of(v)));
  }
  if (name == "trim") {
    Args a(ca, name, {"chars"});
    const Value chars = a.get_or(0, Value::none());
    if (!chars.is_none() && !chars.is_string()) throw EvalError("trim: chars must be a string");
    return Value::string(py_strip(str_of(v), chars.is_none() ? nullptr : &chars.str(), true, true));
  }
  if (name == "replace") {
    Args a(ca, name, {"old", "new", "count"});
    if (!a.get(0) || !a.get(1)) throw EvalError("replace: expected the old and the new string");
    CallArgs sub{
        {Value::string(str_of(a.get_or(0, Value::string("")))), Value::string(str_of(a.get_or(1, Value::string(""))))},
        {}};
    if (const Value* c = a.get(2); c && !c->is_none()) sub.pos.push_back(*c);
    return call_str_method(str_of(v), "replace", sub);
  }
  if (name == "center") {
    Args a(ca, name, {"width"});
    CallArgs sub{{Value::integer(int_arg(a, 0, 80))}, {}};
    return call_str_method(str_of(v), "center", sub);
  }
  if (name == "indent") {
    Args a(ca, name, {"width", "first", "blank"});
    return Value::string(indent_filter(str_of(v), a.get_or(0, Value::integer(4)),
                                       truthy(a.get_or(1, Value::boolean(false))),
                                       truthy(a.get_or(2, Value::boolean(false)))));
  }
  if (name == "format") {
    if (!ca.kw.empty()) throw EvalError("format: keyword arguments are not supported by Anvil's chat templates");
    return Value::string(format_filter(str_of(v), ca.pos));
  }
  if (name == "e" || name == "escape") {
    Args a(ca, name, {});
    return v.is_markup() ? v : Value::markup(html_escape(str_of(v)));
  }
  Args a(ca, name, {});  // wordcount
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : decode_utf8(str_of(v))) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    const bool w = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                   (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    words += w && !in_word;
    in_word = w;
  }
  return Value::integer(words);
}

Value sequence_filter(const std::string& name, const Value& v, CallArgs& ca) {
  if (name == "length" || name == "count") {
    Args a(ca, name, {});
    return Value::integer(length(v));
  }
  if (name == "first") {
    Args a(ca, name, {});
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    Args a(ca, name, {});
    if (v.is_list() && v.list_obj().lazy)
      throw EvalError("last: a generator cannot be reversed; convert it with |list first");
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") {
    Args a(ca, name, {});
    return Value::list(iterate(v));
  }
  if (name == "join") {
    Args a(ca, name, {"d", "attribute"});
    const std::string sep = str_of(a.get_or(0, Value::string("")));
    const Value* attr = a.get(1);
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      out += (first ? "" : sep) + str_of(attr && !attr->is_none() ? attribute_path(item, *attr) : item);
      check_text_size(static_cast<int64_t>(out.size()));
      first = false;
    }
    return Value::string(out);
  }
  if (name == "reverse") {
    Args a(ca, name, {});
    return reverse_filter(v);
  }
  if (name == "sort") {
    Args a(ca, name, {"reverse", "case_sensitive", "attribute"});
    return Value::list(
        sorted_items(iterate(v), a.get(2), truthy(a.get_or(1, Value::boolean(false))), reverse_flag(a, 0)));
  }
  if (name == "unique") {
    Args a(ca, name, {"case_sensitive", "attribute"});
    const bool cs = truthy(a.get_or(0, Value::boolean(false)));
    const Value* attr = a.get(1);
    std::vector<Value> seen, out;
    for (const auto& item : iterate(v)) {
      Value key = attr && !attr->is_none() ? attribute_path(item, *attr) : item;
      if (!cs) key = ignore_case(key);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::lazy(std::move(out));
  }
  if (name == "min" || name == "max") return min_max(v, Args(ca, name, {"case_sensitive", "attribute"}), name == "max");
  if (name == "sum") {
    Args a(ca, name, {"attribute", "start"});
    Value total = a.get_or(1, Value::integer(0));
    const Value* attr = a.get(0);
    for (const auto& item : iterate(v))
      total = binary_op("+", total, attr && !attr->is_none() ? attribute_path(item, *attr) : item);
    return total;
  }
  if (name == "map") return map_filter(v, ca);
  if (name == "select" || name == "reject") return select_filter(v, Args(ca, name, {}, true), false, name == "select");
  return select_filter(v, Args(ca, name, {}, true), true, name == "selectattr");  // selectattr, rejectattr
}

Value mapping_filter(const std::string& name, const Value& v, CallArgs& ca) {
  if (name == "items") {
    Args a(ca, name, {});
    if (v.is_undefined()) return Value::lazy({});
    if (!v.is_dict()) throw EvalError(concat("items: expected a mapping, got ", type_name(v)));
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict_obj().items) out.push_back(Value::list({k, x}, true));
    return Value::lazy(std::move(out));
  }
  // dictsort
  Args a(ca, name, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw EvalError(concat("dictsort: expected a mapping, got ", type_name(v)));
  const Value by = a.get_or(1, Value::string("key"));
  if (!by.is_string() || (by.str() != "key" && by.str() != "value"))
    throw EvalError("dictsort: You can only sort by either \"key\" or \"value\"");
  std::vector<Value> pairs;
  for (const auto& [k, x] : v.dict_obj().items) pairs.push_back(Value::list({k, x}, true));
  const Value pos = Value::integer(by.str() == "key" ? 0 : 1);
  return Value::list(
      sorted_items(std::move(pairs), &pos, truthy(a.get_or(0, Value::boolean(false))), reverse_flag(a, 2)));
}

}  // namespace

// ---------------------------------------------------------------- number parsing (Python's int() and float())

bool parse_py_int(const std::string& s, int base, int64_t* out) {
  std::string t = py_strip(s, nullptr, true, true);
  bool neg = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    neg = t[0] == '-';
    t.erase(0, 1);
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    const char p = t.size() > 1 && t[0] == '0' ? static_cast<char>(std::tolower(static_cast<unsigned char>(t[1]))) : 0;
    const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == 0 || base == pb)) {
      base = pb;
      t.erase(0, 2);
      if (!t.empty() && t[0] == '_') t.erase(0, 1);
    } else if (base == 0) {
      base = 10;
    }
  }
  if (t.empty() || t[0] == '_' || t.back() == '_' || t.find("__") != std::string::npos) return false;
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  for (char c : t) {
    const int d = std::isdigit(static_cast<unsigned char>(c))   ? c - '0'
                  : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                                : 99;
    if (d >= base) return false;
  }
  try {
    const int64_t v = std::stoll(t, nullptr, base);
    *out = neg ? -v : v;
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

bool parse_py_float(const std::string& s, double* out) {
  std::string t = py_strip(s, nullptr, true, true);
  if (t.empty() || t.find("__") != std::string::npos || t[0] == '_' || t.back() == '_') return false;
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  std::string lower = py_lower(t);
  const std::string body = !lower.empty() && (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = body == "nan" ? NAN : (lower[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  if (body.find_first_not_of("0123456789.e+-") != std::string::npos ||
      body.find_first_of("0123456789") == std::string::npos || body.find('x') != std::string::npos)
    return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

std::string filter_problem(const std::string& name) {
  if (supported_filters().count(name)) return "";
  if (jinja_only_filters().count(name))
    return concat("the filter '", name, "' is not supported by Anvil's chat templates");
  return concat("no filter named '", name, "'");
}

std::string test_problem(const std::string& name) {
  if (unary_tests().count(name) || binary_tests().count(name)) return "";
  if (name == "escaped" || name == "filter" || name == "test")
    return concat("the test '", name, "' is not supported by Anvil's chat templates");
  return concat("no test named '", name, "'");
}

Value apply_filter(const std::string& name, const Value& v, CallArgs& ca) {
  if (const auto problem = filter_problem(name); !problem.empty()) throw EvalError(problem);
  if (v.is_string()) Meter::scan(static_cast<int64_t>(v.str().size()), ca);
  if (name != "default" && name != "d") check_defined("filter " + name, ca);
  if (v.is_undefined() && (name == "int" || name == "float")) undefined_error(v);  // int(Undefined) raises
  if (name == "default" || name == "d") {
    Args a(ca, name, {"default_value", "boolean"});
    const bool boolean = truthy(a.get_or(1, Value::boolean(false)));
    return v.is_undefined() || (boolean && !truthy(v)) ? a.get_or(0, Value::string("")) : v;
  }
  if (name == "tojson") return tojson_filter(v, Args(ca, name, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  if (name == "string" || name == "safe") {
    Args a(ca, name, {});
    if (v.is_markup()) return v;
    return name == "safe" ? Value::markup(str_of(v)) : Value::string(str_of(v));
  }
  if (name == "int") return number_filter(v, Args(ca, name, {"default", "base"}), true);
  if (name == "float") return number_filter(v, Args(ca, name, {"default"}), false);
  if (name == "abs") {
    Args a(ca, name, {});
    if (v.kind() == Value::Kind::floating) return Value::floating(std::fabs(v.as_double()));
    if (v.is_number() && v.as_int() == std::numeric_limits<int64_t>::min())
      throw EvalError("integer overflow (beyond 64 bits)");
    if (v.is_number()) return Value::integer(std::llabs(v.as_int()));
    throw EvalError(concat("bad operand type for abs(): '", type_name(v), "'"));
  }
  if (name == "round") return round_filter(v, Args(ca, name, {"precision", "method"}));
  if (name == "attr") {
    Args a(ca, name, {"name"});
    const Value n = a.get_or(0, Value::none());
    if (!n.is_string()) throw EvalError("attr: the attribute name must be a string");
    if (v.is_dict() || v.is_list()) {  // attributes only: methods, never items
      Value m = get_attr(v, n.str());
      return m.kind() == Value::Kind::function
                 ? m
                 : Value::undefined(concat("'", type_name(v), " object' has no attribute '", n.str(), "'"));
    }
    return get_attr(v, n.str());
  }
  if (name == "items" || name == "dictsort") return mapping_filter(name, v, ca);
  static const char* const kSequence[] = {"length",  "count",  "first",  "last",       "list",      "join",
                                          "reverse", "sort",   "unique", "min",        "max",       "sum",
                                          "map",     "select", "reject", "selectattr", "rejectattr"};
  for (const char* s : kSequence)
    if (name == s) return sequence_filter(name, v, ca);
  return string_filter(name, v, ca);
}

bool apply_test(const std::string& name, const Value& v, CallArgs& ca) {
  using K = Value::Kind;
  if (const auto problem = test_problem(name); !problem.empty()) throw EvalError(problem);
  if (v.is_string()) Meter::scan(static_cast<int64_t>(v.str().size()), ca);
  check_defined("test " + name, ca);
  Args a(ca, "test " + name,
         unary_tests().count(name) ? std::vector<std::string>{} : std::vector<std::string>{"other"});
  const auto other = [&]() {
    const Value* o = a.get(0);
    if (!o) throw EvalError(concat("the test '", name, "' needs an argument"));
    return *o;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::boolean;
  if (name == "false") return v.kind() == K::boolean && !v.as_bool();
  if (name == "true") return v.kind() == K::boolean && v.as_bool();
  if (name == "integer") return v.kind() == K::integer;
  if (name == "float") return v.kind() == K::floating;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "callable") return v.kind() == K::function || v.is_undefined();  // jinja2's Undefined has __call__
  if (name == "sequence") return v.is_string() || v.is_dict() || (v.is_list() && !v.list_obj().lazy);
  if (name == "iterable") return v.is_string() || v.is_dict() || v.is_list() || v.is_undefined();
  if (name == "lower" || name == "upper") {
    CallArgs none;
    return truthy(call_str_method(str_of(v), name == "lower" ? "islower" : "isupper", none));
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const Value d = name == "divisibleby" ? other() : Value::integer(2);
    const Value r = binary_op("%", v, d);
    return name == "odd" ? equal(r, Value::integer(1)) : equal(r, Value::integer(0));
  }
  if (name == "sameas") {
    const Value o = other();
    if (v.identity() || o.identity()) return v.identity() == o.identity();
    return v.kind() == o.kind() && equal(v, o);
  }
  if (name == "in") return contains(other(), v);
  if (name == "==" || name == "eq" || name == "equalto") return equal(v, other());
  if (name == "!=" || name == "ne") return !equal(v, other());
  const int c = compare(v, other());
  if (name == ">" || name == "gt" || name == "greaterthan") return c > 0;
  if (name == ">=" || name == "ge") return c >= 0;
  if (name == "<" || name == "lt" || name == "lessthan") return c < 0;
  return c <= 0;  // <=, le
}

}  // namespace anvil::jinja
