// Attribute and item lookup as jinja2's ImmutableSandboxedEnvironment does
// it, Python's arithmetic, the str/dict/list methods templates call, and
// the globals transformers gives a chat template.

#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>
#include <set>

#include "anvil/core/error.h"
#include "jinja/builtins.h"
#include "jinja/limits.h"

namespace anvil::jinja {

// ---------------------------------------------------------------- argument binding

Args::Args(CallArgs& a, std::string what, std::vector<std::string> names, bool varargs)
    : a_(a), what_(std::move(what)), names_(std::move(names)) {
  for (size_t i = 0; i < a_.kw.size(); ++i) {
    const auto& k = a_.kw[i].first;
    for (size_t j = 0; j < i; ++j)
      if (a_.kw[j].first == k) throw EvalError(concat(what_, ": got multiple values for argument '", k, "'"));
    const auto it = std::find(names_.begin(), names_.end(), k);
    if (it == names_.end()) throw EvalError(concat(what_, ": unexpected keyword argument '", k, "'"));
    if (static_cast<size_t>(it - names_.begin()) < a_.pos.size())
      throw EvalError(concat(what_, ": got multiple values for argument '", k, "'"));
  }
  if (!varargs && a_.pos.size() > names_.size())
    throw EvalError(concat(what_, ": takes at most ", names_.size(), " argument(s), ", a_.pos.size(), " given"));
}

const Value* Args::get(size_t i) const {
  if (i < a_.pos.size()) return &a_.pos[i];
  if (i >= names_.size()) return nullptr;
  for (const auto& [k, v] : a_.kw)
    if (k == names_[i]) return &v;
  return nullptr;
}

Value Args::get_or(size_t i, Value def) const {
  const Value* v = get(i);
  return v ? *v : def;
}

std::vector<Value> Args::rest() const {
  return a_.pos.size() > names_.size()
             ? std::vector<Value>(a_.pos.begin() + static_cast<std::ptrdiff_t>(names_.size()), a_.pos.end())
             : std::vector<Value>{};
}

// ---------------------------------------------------------------- str methods

namespace {

const std::set<std::string>& py_str_methods() {
  static const std::set<std::string> s = {
      "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
      "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
      "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
      "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
      "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
      "swapcase",   "title",        "translate",    "upper",   "zfill"};
  return s;
}
const std::set<std::string>& supported_str_methods() {
  static const std::set<std::string> s = {
      "capitalize", "center",    "count",      "endswith",  "find",         "format",       "index",      "isalnum",
      "isalpha",    "isdecimal", "isdigit",    "islower",   "isnumeric",    "isspace",      "isupper",    "join",
      "ljust",      "lower",     "lstrip",     "partition", "removeprefix", "removesuffix", "replace",    "rfind",
      "rindex",     "rjust",     "rpartition", "rsplit",    "rstrip",       "split",        "splitlines", "startswith",
      "strip",      "title",     "upper",      "zfill"};
  return s;
}

bool is_cased_upper(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LU; }
bool is_cased_lower(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LL; }
bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::string str_arg(const Args& a, size_t i, const char* what) {
  const Value* v = a.get(i);
  if (!v || !v->is_string()) throw EvalError(concat(a.what(), ": ", what, " must be a string"));
  return v->str();
}

Value splitlines(const std::u32string& u, bool keepends) {
  std::vector<Value> out;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!is_line_break(u[i])) continue;
    size_t end = i + 1;
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') end = i + 2;
    out.push_back(Value::string(encode_utf8(u.substr(start, (keepends ? end : i) - start))));
    start = end;
    i = end - 1;
  }
  if (start < u.size()) out.push_back(Value::string(encode_utf8(u.substr(start))));
  return Value::list(std::move(out));
}

// str.split / str.rsplit.
Value split(const std::u32string& u, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::u32string> parts;
  if (sep.is_none()) {
    std::u32string s = u;
    if (from_right) std::reverse(s.begin(), s.end());
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {  // the rest, as it is
        parts.push_back(s.substr(i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(s[j])) ++j;
      parts.push_back(s.substr(i, j - i));
      i = j;
    }
    if (from_right)
      for (auto& p : parts) std::reverse(p.begin(), p.end());
  } else {
    if (!sep.is_string()) throw EvalError("split: the separator must be a string or None");
    const auto d = decode_utf8(sep.str());
    if (d.empty()) throw EvalError("split: empty separator");
    std::u32string s = u, dd = d;
    if (from_right) {
      std::reverse(s.begin(), s.end());
      std::reverse(dd.begin(), dd.end());
    }
    size_t i = 0;
    for (size_t k;
         (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) && (k = s.find(dd, i)) != std::u32string::npos;
         i = k + dd.size())
      parts.push_back(s.substr(i, k - i));
    parts.push_back(s.substr(i));
    if (from_right)
      for (auto& p : parts) std::reverse(p.begin(), p.end());
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  std::vector<Value> out;
  for (const auto& p : parts) out.push_back(Value::string(encode_utf8(p)));
  return Value::list(std::move(out));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const std::string& what) {
  const auto one = [&](const Value& a) {
    if (!a.is_string()) throw EvalError(concat(what, ": expected a string or a tuple of strings"));
    const auto& x = a.str();
    return x.size() <= s.size() &&
           (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (affix.is_list() && affix.list_obj().tuple) {
    for (const auto& a : affix.list_obj().items)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

std::string replace(const std::u32string& s, const std::u32string& old, const std::u32string& repl, int64_t count) {
  std::u32string out;
  int64_t n = 0;
  if (old.empty()) {
    for (size_t i = 0; i <= s.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < s.size()) out += s[i];
      check_text_size(static_cast<int64_t>(out.size()));
    }
    return encode_utf8(out);
  }
  size_t i = 0;
  for (size_t k; (count < 0 || n < count) && (k = s.find(old, i)) != std::u32string::npos; i = k + old.size(), ++n) {
    out += s.substr(i, k - i) + repl;
    check_text_size(static_cast<int64_t>(out.size()));
  }
  out += s.substr(i);
  return encode_utf8(out);
}

Value pad(const std::u32string& u, int64_t width, const Value* fill, int mode) {  // 0 center, 1 ljust, 2 rjust
  char32_t f = ' ';
  if (fill) {
    if (!fill->is_string() || code_points(fill->str()) != 1)
      throw EvalError("the fill character must be exactly one character long");
    f = decode_utf8(fill->str())[0];
  }
  const int64_t marg = width - static_cast<int64_t>(u.size());
  if (marg <= 0) return Value::string(encode_utf8(u));
  check_text_size(width);
  const int64_t left = mode == 1 ? 0 : mode == 2 ? marg : marg / 2 + (marg & width & 1);
  return Value::string(encode_utf8(std::u32string(static_cast<size_t>(left), f) + u +
                                   std::u32string(static_cast<size_t>(marg - left), f)));
}

Value str_predicate(const std::u32string& u, const std::string& name) {
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (char32_t c : u) {
      if (name == "islower"
              ? (is_cased_upper(c) || utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LT)
              : (is_cased_lower(c) || utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LT))
        return Value::boolean(false);
      cased = cased || is_cased(c);
    }
    return Value::boolean(cased);
  }
  if (u.empty()) return Value::boolean(false);
  for (char32_t c : u) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    const bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    const bool decimal = cat == UTF8PROC_CATEGORY_ND;
    const bool numeric = cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
    const bool ok = name == "isspace"     ? is_py_space(c)
                    : name == "isalpha"   ? letter
                    : name == "isalnum"   ? letter || numeric
                    : name == "isnumeric" ? numeric
                                          : decimal;  // isdigit, isdecimal
    if (!ok) return Value::boolean(false);
  }
  return Value::boolean(true);
}

Value str_case(const std::u32string& u, const std::string& name) {
  if (name == "capitalize")
    return Value::string(u.empty() ? "" : case_char(u[0], CaseMap::title) + py_lower(encode_utf8(u.substr(1))));
  std::string out;  // title
  bool prev_cased = false;
  for (char32_t c : u) {
    out += case_char(c, prev_cased ? CaseMap::lower : CaseMap::title);
    prev_cased = is_cased(c);
  }
  return Value::string(out);
}

Value str_search(const std::string& s, const std::u32string& u, const std::string& name, const Args& a) {
  const auto sub = decode_utf8(str_arg(a, 0, "the substring"));
  if (name == "count") {
    if (sub.empty()) return Value::integer(static_cast<int64_t>(u.size()) + 1);
    int64_t n = 0;
    for (size_t k = u.find(sub); k != std::u32string::npos; k = u.find(sub, k + sub.size())) ++n;
    return Value::integer(n);
  }
  const bool right = name == "rfind" || name == "rindex";
  const size_t k = right ? u.rfind(sub) : u.find(sub);
  if (k == std::u32string::npos && (name == "index" || name == "rindex")) throw EvalError("substring not found");
  (void)s;
  return Value::integer(k == std::u32string::npos ? -1 : static_cast<int64_t>(k));
}

Value str_partition(const std::string& s, const std::string& sep, bool right) {
  if (sep.empty()) throw EvalError("partition: empty separator");
  const size_t k = right ? s.rfind(sep) : s.find(sep);
  if (k == std::string::npos)
    return right ? Value::list({Value::string(""), Value::string(""), Value::string(s)}, true)
                 : Value::list({Value::string(s), Value::string(""), Value::string("")}, true);
  return Value::list({Value::string(s.substr(0, k)), Value::string(sep), Value::string(s.substr(k + sep.size()))},
                     true);
}

}  // namespace

bool is_str_method(const std::string& name) { return py_str_methods().count(name) > 0; }

Value call_str_method(const std::string& s, const std::string& name, CallArgs& ca) {
  Meter::scan(static_cast<int64_t>(s.size()), ca);
  const std::string what = "str." + name;
  if (!supported_str_methods().count(name))
    throw EvalError(concat(what, "() is not supported by Anvil's chat templates"));
  const auto u = decode_utf8(s);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Args a(ca, what, {"chars"});
    const Value chars = a.get_or(0, Value::none());
    if (!chars.is_none() && !chars.is_string()) throw EvalError(concat(what, ": chars must be a string or None"));
    return Value::string(py_strip(s, chars.is_none() ? nullptr : &chars.str(), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    Args a(ca, what, {"prefix"});
    const Value* p = a.get(0);
    if (!p) throw EvalError(concat(what, ": missing the prefix"));
    return Value::boolean(affix_match(s, *p, name == "startswith", what));
  }
  if (name == "split" || name == "rsplit") {
    Args a(ca, what, {"sep", "maxsplit"});
    const Value ms = a.get_or(1, Value::integer(-1));
    if (ms.kind() != Value::Kind::integer) throw EvalError(concat(what, ": maxsplit must be an integer"));
    return split(u, a.get_or(0, Value::none()), ms.as_int(), name == "rsplit");
  }
  if (name == "splitlines") {
    Args a(ca, what, {"keepends"});
    return splitlines(u, truthy(a.get_or(0, Value::boolean(false))));
  }
  if (name == "upper" || name == "lower") {
    Args a(ca, what, {});
    return Value::string(name == "upper" ? py_upper(s) : py_lower(s));
  }
  if (name == "title" || name == "capitalize") {
    Args a(ca, what, {});
    return str_case(u, name);
  }
  if (name == "replace") {
    Args a(ca, what, {"old", "new", "count"});
    const Value c = a.get_or(2, Value::integer(-1));
    if (c.kind() != Value::Kind::integer) throw EvalError(concat(what, ": count must be an integer"));
    return Value::string(replace(u, decode_utf8(str_arg(a, 0, "old")), decode_utf8(str_arg(a, 1, "new")), c.as_int()));
  }
  if (name == "format") return Value::string(str_format(s, ca));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
    return str_search(s, u, name, Args(ca, what, {"sub"}));
  if (name == "join") {
    Args a(ca, what, {"iterable"});
    const Value* it = a.get(0);
    if (!it) throw EvalError(concat(what, ": missing the iterable"));
    std::string out;
    size_t i = 0;
    for (const auto& x : iterate(*it)) {
      if (!x.is_string())
        throw EvalError(concat("sequence item ", i, ": expected str instance, ", type_name(x), " found"));
      out += (i++ ? s : "") + x.str();
      check_text_size(static_cast<int64_t>(out.size()));
    }
    return Value::string(out);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Args a(ca, what, {"affix"});
    const auto x = str_arg(a, 0, "the affix");
    if (!affix_match(s, Value::string(x), name == "removeprefix", what)) return Value::string(s);
    return Value::string(name == "removeprefix" ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
  }
  if (name == "partition" || name == "rpartition") {
    Args a(ca, what, {"sep"});
    return str_partition(s, str_arg(a, 0, "sep"), name == "rpartition");
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    Args a(ca, what, {"width", "fillchar"});
    const Value w = a.get_or(0, Value::none());
    if (w.kind() != Value::Kind::integer) throw EvalError(concat(what, ": width must be an integer"));
    if (name == "zfill") {
      const bool sign = !u.empty() && (u[0] == '+' || u[0] == '-');
      auto padded = pad(sign ? u.substr(1) : u, w.as_int() - sign, nullptr, 2).str();
      std::replace(padded.begin(), padded.end() - static_cast<std::ptrdiff_t>(s.size() - sign), ' ', '0');
      return Value::string((sign ? s.substr(0, 1) : "") + padded);
    }
    return pad(u, w.as_int(), a.get(1), name == "center" ? 0 : name == "ljust" ? 1 : 2);
  }
  Args a(ca, what, {});
  return str_predicate(u, name);
}

// ---------------------------------------------------------------- attributes and items

namespace {

// A method bound to its object; undefined arguments are refused, as by filters.
Value bound(const std::string& name, std::function<Value(CallArgs&)> f) {
  return Value::function(name, [name, f = std::move(f)](CallArgs& ca) {
    for (const auto& v : ca.pos)
      if (v.is_undefined()) throw EvalError(concat(name, ": an argument is undefined (", v.hint(), ")"));
    for (const auto& kv : ca.kw)
      if (kv.second.is_undefined()) throw EvalError(concat(name, ": the argument ", kv.first, " is undefined"));
    return f(ca);
  });
}

Value dict_method(const Value& obj, const std::string& name) {
  const auto d = obj;  // keeps the dict alive in the closure
  if (name == "get")
    return bound("dict.get", [d](CallArgs& ca) {
      Args a(ca, "dict.get", {"key", "default"});
      const Value* k = a.get(0);
      if (!k) throw EvalError("dict.get: missing the key");
      const Value* v = d.dict_obj().find(*k);
      return v ? *v : a.get_or(1, Value::none());
    });
  if (name == "items" || name == "keys" || name == "values")
    return bound("dict." + name, [d, name](CallArgs& ca) {
      Args a(ca, "dict." + name, {});
      std::vector<Value> out;
      for (const auto& [k, v] : d.dict_obj().items)
        out.push_back(name == "items" ? Value::list({k, v}, true) : name == "keys" ? k : v);
      return Value::list(std::move(out));
    });
  if (name == "copy")
    return bound("dict.copy", [d](CallArgs& ca) {
      Args a(ca, "dict.copy", {});
      return Value::dict(std::make_shared<DictObj>(d.dict_obj()));
    });
  throw EvalError(concat("dict.", name, " is not allowed in chat templates (the sandbox keeps data immutable)"));
}

Value list_method(const Value& obj, const std::string& name) {
  const auto l = obj;
  if (name == "count" || name == "index")
    return bound("list." + name, [l, name](CallArgs& ca) {
      Args a(ca, "list." + name, {"value"});
      const Value* x = a.get(0);
      if (!x) throw EvalError(concat("list.", name, ": missing the value"));
      const auto& items = l.list_obj().items;
      int64_t n = 0;
      for (size_t i = 0; i < items.size(); ++i)
        if (equal(items[i], *x)) {
          if (name == "index") return Value::integer(static_cast<int64_t>(i));
          ++n;
        }
      if (name == "index") throw EvalError(concat(repr(*x), " is not in list"));
      return Value::integer(n);
    });
  if (name == "copy")
    return bound("list.copy", [l](CallArgs& ca) {
      Args a(ca, "list.copy", {});
      return Value::list(l.list_obj().items);
    });
  throw EvalError(concat("list.", name, " is not allowed in chat templates (the sandbox keeps data immutable)"));
}

bool is_dict_method(const std::string& n) {
  static const std::set<std::string> s = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                          "pop",   "popitem", "setdefault", "update", "values"};
  return s.count(n) > 0;
}
bool is_list_method(const std::string& n) {
  static const std::set<std::string> s = {"append", "clear", "copy",   "count",   "extend", "index",
                                          "insert", "pop",   "remove", "reverse", "sort"};
  return s.count(n) > 0;
}

// jinja2's messages for a missing attribute or item.
Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(concat("'", type_name(obj), " object' has no attribute '", name, "'"));
}
Value no_element(const Value& obj, const Value& key) {
  const bool slice = key.is_list() && key.list_obj().lazy;  // see the slice case of eval.cpp
  return Value::undefined(concat(type_name(obj), " object has no element ", slice ? "(a slice)" : repr(key)));
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!name.empty() && name[0] == '_') throw EvalError(concat("access to attribute '", name, "' is unsafe"));
  switch (obj.kind()) {
    case Value::Kind::string:
      if (obj.is_markup() && is_str_method(name))  // markupsafe's methods escape their arguments
        throw EvalError(concat("str.", name,
                               " on a string marked safe (|safe, |e) is not supported by Anvil's chat "
                               "templates"));
      if (is_str_method(name))
        return bound("str." + name, [obj, name](CallArgs& ca) { return call_str_method(obj.str(), name, ca); });
      return no_attribute(obj, name);
    case Value::Kind::dict: {
      if (is_dict_method(name)) return dict_method(obj, name);
      const Value* v = obj.dict_obj().find(name);
      return v ? *v : no_attribute(obj, name);
    }
    case Value::Kind::list:
      if (!obj.list_obj().lazy && !obj.list_obj().tuple && is_list_method(name)) return list_method(obj, name);
      if (!obj.list_obj().lazy && obj.list_obj().tuple && (name == "count" || name == "index"))
        return list_method(obj, name);
      return no_attribute(obj, name);
    case Value::Kind::ns: {
      const Value* v = obj.ns_obj().attrs.find(name);
      return v ? *v : no_attribute(obj, name);
    }
    default:
      return no_attribute(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);  // jinja2's Undefined.__getitem__ raises
  const bool int_key = key.kind() == Value::Kind::integer || key.kind() == Value::Kind::boolean;
  if ((obj.is_list() && !obj.list_obj().lazy) || obj.is_string()) {
    if (int_key) {
      const int64_t n = length(obj);
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return no_element(obj, key);
      if (obj.is_string()) return Value::string(encode_utf8(decode_utf8(obj.str()).substr(static_cast<size_t>(i), 1)));
      return obj.list_obj().items[static_cast<size_t>(i)];
    }
  } else if (obj.is_dict()) {
    if (const Value* v = obj.dict_obj().find(key)) return *v;
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return no_element(obj, key);
}

// jinja2 compiles slices to Python's own subscript (not the sandbox's
// getitem), so every failure is an error.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) throw EvalError("unhashable type: 'slice'");
  if (!(obj.is_string() || (obj.is_list() && !obj.list_obj().lazy)))
    throw EvalError(concat("'", type_name(obj), "' object is not subscriptable"));
  for (const Value* v : {&start, &stop, &step})
    if (!v->is_none() && v->kind() != Value::Kind::integer && v->kind() != Value::Kind::boolean)
      throw EvalError("slice indices must be integers or None or have an __index__ method");
  const auto index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    return v.as_int();
  };
  const int64_t n = length(obj);
  const int64_t st = index(step).value_or(1);
  if (st == 0) throw EvalError("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  const auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0)
      x = std::max<int64_t>(x + n, st < 0 ? -1 : 0);
    else if (x >= n)
      x = st < 0 ? n - 1 : n;
    return x;
  };
  const int64_t b = adjust(index(start), st < 0 ? n - 1 : 0);
  const int64_t e = adjust(index(stop), st < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    const auto u = decode_utf8(obj.str());
    std::u32string out;
    for (auto i : picks) out += u[i];
    return Value::string(encode_utf8(out));
  }
  std::vector<Value> out;
  for (auto i : picks) out.push_back(obj.list_obj().items[i]);
  Value r = Value::list(std::move(out), obj.list_obj().tuple);
  if (const auto& src = obj.list_obj(); src.is_range) {  // a slice of a range is a range
    auto& l = r.list_obj();
    l.is_range = true;
    l.start = src.start + b * src.step;
    l.stop = src.start + e * src.step;
    l.step = src.step * st;
  }
  return r;
}

// ---------------------------------------------------------------- operators

namespace {

int64_t checked(bool overflow, int64_t v) {
  if (overflow) throw EvalError("integer overflow (beyond 64 bits)");
  return v;
}

Value repeat(const Value& seq, int64_t n) {
  const auto unit = static_cast<int64_t>(seq.is_string() ? seq.str().size() : seq.list_obj().items.size());
  if (n > 0 && unit > 0) {  // refused before it is made
    int64_t total = 0;
    if (__builtin_mul_overflow(n, unit, &total)) total = std::numeric_limits<int64_t>::max();
    if (seq.is_string())
      check_text_size(total);
    else
      Meter::steps(std::min(total, kMaxSteps + 1));
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(out);
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list_obj().items.begin(), seq.list_obj().items.end());
  return Value::list(std::move(out), seq.list_obj().tuple);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool f = a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating;
  int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    if (f) {
      const double x = a.as_double(), y = b.as_double();
      return Value::floating(op == "+" ? x + y : op == "-" ? x - y : x * y);
    }
    const bool overflow = op == "+"   ? __builtin_add_overflow(a.as_int(), b.as_int(), &r)
                          : op == "-" ? __builtin_sub_overflow(a.as_int(), b.as_int(), &r)
                                      : __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
    return Value::integer(checked(overflow, r));
  }
  if (op == "**") {
    if (!f && b.as_int() >= 0) {
      const int64_t base = a.as_int(), exp = b.as_int();
      // Only these never overflow: answered at once, not by `exp` multiplications.
      if (base >= -1 && base <= 1) return Value::integer(exp == 0 ? 1 : base == -1 ? (exp % 2 ? -1 : 1) : base);
      int64_t acc = 1;
      for (int64_t i = 0; i < exp; ++i) {
        const bool overflow = __builtin_mul_overflow(acc, a.as_int(), &acc);
        checked(overflow, acc);
      }
      return Value::integer(acc);
    }
    return Value::floating(std::pow(a.as_double(), b.as_double()));
  }
  if (f ? b.as_double() == 0.0 : b.as_int() == 0)
    throw EvalError(op == "/"    ? "division by zero"
                    : op == "//" ? "integer division or modulo by zero"
                                 : "modulo by zero");
  if (op == "/") return Value::floating(a.as_double() / b.as_double());
  if (f) {  // CPython's float_divmod
    const double x = a.as_double(), y = b.as_double();
    double m = std::fmod(x, y);
    double div = (x - m) / y;
    if (m != 0) {
      if ((y < 0) != (m < 0)) {
        m += y;
        div -= 1.0;
      }
    } else {
      m = std::copysign(0.0, y);
    }
    if (op == "%") return Value::floating(m);
    double floordiv = std::copysign(0.0, x / y);
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    }
    return Value::floating(floordiv);
  }
  const int64_t x = a.as_int(), y = b.as_int();
  if (x == std::numeric_limits<int64_t>::min() && y == -1) {  // the one quotient beyond 64 bits
    if (op == "%") return Value::integer(0);
    checked(true, 0);
  }
  int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    --q;
    m += y;
  }
  return Value::integer(op == "%" ? m : q);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+" && a.is_string() && b.is_string()) {
    if (!a.is_markup() && !b.is_markup()) return Value::string(a.str() + b.str());
    // Markup + str escapes the str (markupsafe).
    return Value::markup((a.is_markup() ? a.str() : html_escape(a.str())) +
                         (b.is_markup() ? b.str() : html_escape(b.str())));
  }
  const auto plain = [](const Value& v) { return v.is_list() && !v.list_obj().lazy && !v.list_obj().is_range; };
  if (op == "+" && plain(a) && plain(b) && a.list_obj().tuple == b.list_obj().tuple) {
    auto items = a.list_obj().items;
    items.insert(items.end(), b.list_obj().items.begin(), b.list_obj().items.end());
    return Value::list(std::move(items), a.list_obj().tuple);
  }
  const auto seq = [&](const Value& v) { return v.is_string() || plain(v); };
  const auto count = [](const Value& v) {
    return v.kind() == Value::Kind::integer || v.kind() == Value::Kind::boolean;
  };
  if (op == "*" && seq(a) && count(b)) return repeat(a, b.as_int());
  if (op == "*" && count(a) && seq(b)) return repeat(b, a.as_int());
  if (op == "%" && a.is_string())
    throw EvalError("string formatting with % is not supported by Anvil's chat templates (use ~ or the format filter)");
  if (op == "+" && a.is_string())
    throw EvalError(concat("can only concatenate str (not \"", type_name(b), "\") to str"));
  throw EvalError(concat("unsupported operand type(s) for ", op, ": '", type_name(a), "' and '", type_name(b), "'"));
}

Value negate(const Value& v) {
  if (v.is_undefined()) undefined_error(v);
  if (v.kind() == Value::Kind::floating) return Value::floating(-v.as_double());
  if (v.is_number()) return Value::integer(checked(v.as_int() == std::numeric_limits<int64_t>::min(), -v.as_int()));
  throw EvalError(concat("bad operand type for unary -: '", type_name(v), "'"));
}

// ---------------------------------------------------------------- globals

void check_namespace_value(const Value& v, const std::string& ns, const std::string& attr) {
  if (holds_object(v))
    throw EvalError(concat(ns, ".", attr, ": a namespace attribute cannot hold a ", type_name(v),
                           " that is or holds a namespace, loop object or function (Anvil keeps a template's "
                           "values from containing themselves)"));
}

namespace {

Value range_fn(CallArgs& ca) {
  if (!ca.kw.empty()) throw EvalError("range() takes no keyword arguments");
  if (ca.pos.empty() || ca.pos.size() > 3) throw EvalError("range expected 1 to 3 arguments");
  for (const auto& v : ca.pos)
    if (v.kind() != Value::Kind::integer && v.kind() != Value::Kind::boolean)
      throw EvalError(concat("'", type_name(v), "' object cannot be interpreted as an integer"));
  const int64_t start = ca.pos.size() == 1 ? 0 : ca.pos[0].as_int();
  const int64_t stop = ca.pos.size() == 1 ? ca.pos[0].as_int() : ca.pos[1].as_int();
  const int64_t step = ca.pos.size() == 3 ? ca.pos[2].as_int() : 1;
  if (step == 0) throw EvalError("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000)
      throw EvalError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    out.push_back(Value::integer(i));
  }
  Value r = Value::list(std::move(out));
  auto& l = r.list_obj();
  l.is_range = true;
  l.start = start;
  l.stop = stop;
  l.step = step;
  return r;
}

// dict(mapping or pairs, **kwargs), as namespace() takes its attributes too.
std::shared_ptr<DictObj> dict_from(CallArgs& ca, const char* what) {
  auto d = std::make_shared<DictObj>();
  if (ca.pos.size() > 1) throw EvalError(concat(what, " expected at most 1 positional argument"));
  if (!ca.pos.empty()) {
    const Value& src = ca.pos[0];
    if (src.is_undefined()) undefined_error(src);  // dict() asks it for .keys, which raises
    if (src.is_dict()) {
      *d = src.dict_obj();
    } else {
      for (const auto& item : iterate(src)) {
        if (!item.is_list() || item.list_obj().lazy || item.list_obj().items.size() != 2)
          throw EvalError(concat(what, ": expected a mapping or a sequence of pairs"));
        d->set(item.list_obj().items[0], item.list_obj().items[1]);
      }
    }
  }
  for (const auto& [k, v] : ca.kw) d->set(Value::string(k), v);
  return d;
}

Value strftime_now(CallArgs& ca) {
  Args a(ca, "strftime_now", {"format"});
  const Value* f = a.get(0);
  if (!f || !f->is_string()) throw EvalError("strftime_now: the format must be a string");
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  check_text_size(static_cast<int64_t>(f->str().size()) * 8);
  std::string buf(256 + f->str().size() * 8, '\0');
  buf.resize(std::strftime(buf.data(), buf.size(), f->str().c_str(), &tm));
  return Value::string(buf);
}

}  // namespace

std::vector<std::pair<std::string, Value>> globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", range_fn));
  g.emplace_back("dict", Value::function("dict", [](CallArgs& ca) { return Value::dict(dict_from(ca, "dict")); }));
  g.emplace_back("namespace", Value::function("namespace", [](CallArgs& ca) {
                   auto ns = std::make_shared<NamespaceObj>();
                   ns->attrs = *dict_from(ca, "namespace");
                   for (const auto& [k, v] : ns->attrs.items) {
                     if (k.is_string() && !k.str().empty() && k.str()[0] == '_')
                       throw EvalError(
                           concat("Chat templates cannot store underscore-prefixed attributes on a namespace, but got ",
                                  repr(k), ". Please rename the attribute."));
                     if (holds_object(v)) check_namespace_value(v, "namespace()", k.is_string() ? k.str() : repr(k));
                   }
                   return Value::ns(ns);
                 }));
  g.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& ca) -> Value {
                   Args a(ca, "raise_exception", {"message"});
                   throw Raised(to_str(a.get_or(0, Value::string(""))));
                 }));
  g.emplace_back("strftime_now", Value::function("strftime_now", strftime_now));
  return g;
}

}  // namespace anvil::jinja
