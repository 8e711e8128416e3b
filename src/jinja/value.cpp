#include "jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "anvil/core/error.h"
#include "jinja/limits.h"
#include "tokenizer/unicode.h"

namespace anvil::jinja {

// ---------------------------------------------------------------- construction

Value Value::undefined(std::string hint) {
  Value v;
  v.v_ = Undef{std::move(hint)};
  return v;
}
Value Value::none() {
  Value v;
  v.v_ = std::monostate{};
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.v_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.v_ = i;
  return v;
}
Value Value::floating(double d) {
  Value v;
  v.v_ = d;
  return v;
}
Value Value::string(std::string s) {
  check_text_size(static_cast<int64_t>(s.size()));
  Meter::text(static_cast<int64_t>(s.size()));
  Value v;
  v.v_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.markup_ = true;
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  Meter::steps(static_cast<int64_t>(items.size()));
  auto l = std::make_shared<ListObj>();
  for (const auto& x : items) {
    l->depth = std::max(l->depth, nesting(x) + 1);
    l->holds_object = l->holds_object || holds_object(x);
  }
  if (l->depth > kMaxValueDepth)
    throw EvalError(concat("lists, dicts and namespaces nested deeper than ", limit_note(kMaxValueDepth)));
  l->items = std::move(items);
  l->tuple = tuple;
  Value v;
  v.v_ = std::move(l);
  return v;
}
Value Value::lazy(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.list_obj().lazy = true;
  return v;
}
Value Value::dict(std::shared_ptr<DictObj> d) {
  Value v;
  v.v_ = std::move(d);
  return v;
}
Value Value::dict() { return dict(std::make_shared<DictObj>()); }
Value Value::ns(std::shared_ptr<NamespaceObj> n) {
  Value v;
  v.v_ = std::move(n);
  return v;
}
Value Value::function(std::string name, std::function<Value(CallArgs&)> f) {
  Value v;
  v.v_ = std::make_shared<FunctionObj>(FunctionObj{std::move(name), std::move(f)});
  return v;
}

int64_t Value::as_int() const {
  if (kind() == Kind::boolean) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_double() const {
  if (kind() == Kind::floating) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::list:
      return &list_obj();
    case Kind::dict:
      return &dict_obj();
    case Kind::ns:
      return &ns_obj();
    case Kind::function:
      return &function_obj();
    default:
      return nullptr;
  }
}

const Value* DictObj::find(const Value& key) const {
  Meter::steps(static_cast<int64_t>(items.size()));
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

const Value* DictObj::find(std::string_view key) const {
  Meter::steps(static_cast<int64_t>(items.size()));
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void DictObj::set(Value key, Value value) {
  Meter::steps(static_cast<int64_t>(items.size()));
  for (auto& [k, v] : items)
    if (equal(k, key)) {
      note(key, value);
      v = std::move(value);
      return;
    }
  add_new(std::move(key), std::move(value));
}

void DictObj::add_new(Value key, Value value) {
  note(key, value);
  items.emplace_back(std::move(key), std::move(value));
}

void DictObj::note(const Value& key, const Value& value) {
  Meter::steps(1);
  const int d = std::max(nesting(key), nesting(value)) + 1;
  if (d > kMaxValueDepth)
    throw EvalError(concat("lists, dicts and namespaces nested deeper than ", limit_note(kMaxValueDepth)));
  depth = std::max(depth, d);
  holds_object = holds_object || jinja::holds_object(key) || jinja::holds_object(value);
}

int nesting(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::list:
      return v.list_obj().depth;
    case Value::Kind::dict:
      return v.dict_obj().depth;
    case Value::Kind::ns:
      return v.ns_obj().attrs.depth;
    default:
      return 0;
  }
}

bool holds_object(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::list:
      return v.list_obj().holds_object;
    case Value::Kind::dict:
      return v.dict_obj().holds_object;
    case Value::Kind::ns:
    case Value::Kind::function:
      return true;
    default:
      return false;
  }
}

[[noreturn]] void undefined_error(const Value& v) {
  throw EvalError(v.hint().empty() ? std::string("a value is undefined") : v.hint());
}

// ---------------------------------------------------------------- UTF-8

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    const size_t n = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
    char32_t c = n == 1 ? b0 : n == 2 ? b0 & 0x1F : n == 3 ? b0 & 0x0F : b0 & 0x07;
    for (size_t k = 1; k < n && i + k < s.size(); ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(c);
    i += n;
  }
  return out;
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) tokenizer::detail::append_utf8(out, c);
  return out;
}

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_py_space(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string case_char(char32_t c, CaseMap which) {
  if (const char* full = full_case(c, which)) return full;
  const auto x = static_cast<utf8proc_int32_t>(c);
  const auto m = which == CaseMap::upper   ? utf8proc_toupper(x)
                 : which == CaseMap::title ? utf8proc_totitle(x)
                                           : utf8proc_tolower(x);
  return encode_utf8(std::u32string(1, static_cast<char32_t>(m)));
}

namespace {

bool cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool case_ignorable(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF ||
         cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK || c == '\'' || c == '.' || c == ':' || c == 0xB7 ||
         c == 0x2019;
}

// Σ at the end of a word lowercases to ς (Unicode's Final_Sigma, as CPython applies it).
bool final_sigma(const std::u32string& u, size_t i) {
  size_t j = i;
  while (j > 0 && case_ignorable(u[j - 1])) --j;
  if (j == 0 || !cased(u[j - 1])) return false;
  size_t k = i + 1;
  while (k < u.size() && case_ignorable(u[k])) ++k;
  return k == u.size() || !cased(u[k]);
}

}  // namespace

std::string py_upper(std::string_view s) {
  std::string out;
  for (char32_t c : decode_utf8(s)) out += case_char(c, CaseMap::upper);
  return out;
}

std::string py_lower(std::string_view s) {
  const auto u = decode_utf8(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i)
    out += u[i] == 0x3A3 && final_sigma(u, i) ? std::string("\xcf\x82") : case_char(u[i], CaseMap::lower);
  return out;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const auto u = decode_utf8(s);
  const auto set = chars ? decode_utf8(*chars) : std::u32string();
  const auto strip = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_py_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b])) ++b;
  if (right)
    while (e > b && strip(u[e - 1])) --e;
  return encode_utf8(std::u32string_view(u).substr(b, e - b));
}

// ---------------------------------------------------------------- printing

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return "Undefined";
    case Value::Kind::none:
      return "NoneType";
    case Value::Kind::boolean:
      return "bool";
    case Value::Kind::integer:
      return "int";
    case Value::Kind::floating:
      return "float";
    case Value::Kind::string:
      return "str";
    case Value::Kind::list:
      return v.list_obj().lazy ? "generator" : v.list_obj().is_range ? "range" : v.list_obj().tuple ? "tuple" : "list";
    case Value::Kind::dict:
      return "dict";
    case Value::Kind::ns:
      return v.ns_obj().loop ? "LoopContext" : "Namespace";
    case Value::Kind::function:
      return "function";
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]xx
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const auto e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += ebuf;
  }
  return neg ? "-" + out : out;
}

namespace {

bool printable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool single = s.find('\'') == std::string::npos || s.find('"') != std::string::npos;
  const char q = single ? '\'' : '"';
  std::string out(1, q);
  char buf[16];
  for (char32_t c : decode_utf8(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (printable(c)) {
      out += encode_utf8(std::u32string(1, c));
    } else {
      std::snprintf(buf, sizeof buf,
                    c <= 0xFF     ? "\\x%02x"
                    : c <= 0xFFFF ? "\\u%04x"
                                  : "\\U%08x",
                    static_cast<unsigned>(c));
      out += buf;
    }
  }
  return out + q;
}

std::string sequence_str(const ListObj& l) {
  if (l.lazy) throw EvalError("printing a generator (the result of map, select, reverse, ...) is not supported");
  if (l.is_range)
    return l.step == 1 ? concat("range(", l.start, ", ", l.stop, ")")
                       : concat("range(", l.start, ", ", l.stop, ", ", l.step, ")");
  std::string out = l.tuple ? "(" : "[";
  for (size_t i = 0; i < l.items.size(); ++i) {
    out += (i ? ", " : "") + repr(l.items[i]);
    check_text_size(static_cast<int64_t>(out.size()));
  }
  if (l.tuple && l.items.size() == 1) out += ",";
  return out + (l.tuple ? ")" : "]");
}

std::string dict_str(const DictObj& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.items.size(); ++i) {
    out += (i ? ", " : "") + repr(d.items[i].first) + ": " + repr(d.items[i].second);
    check_text_size(static_cast<int64_t>(out.size()));
  }
  return out + "}";
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return "";
    case Value::Kind::none:
      return "None";
    case Value::Kind::boolean:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::integer:
      return std::to_string(v.as_int());
    case Value::Kind::floating:
      return float_repr(v.as_double());
    case Value::Kind::string:
      return v.str();
    case Value::Kind::list:
      return sequence_str(v.list_obj());
    case Value::Kind::dict:
      return dict_str(v.dict_obj());
    case Value::Kind::ns:
      if (v.ns_obj().loop) throw EvalError("printing the loop object is not supported");
      return "<Namespace " + dict_str(v.ns_obj().attrs) + ">";
    case Value::Kind::function:
      throw EvalError(concat("printing the function ", v.function_obj().name, " is not supported"));
  }
  return "";
}

std::string repr(const Value& v) {
  if (v.is_string()) return v.is_markup() ? "Markup(" + string_repr(v.str()) + ")" : string_repr(v.str());
  if (v.is_undefined()) return "Undefined";
  return to_str(v);
}

// ---------------------------------------------------------------- truth, equality, order

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return false;
    case Value::Kind::boolean:
      return v.as_bool();
    case Value::Kind::integer:
      return v.as_int() != 0;
    case Value::Kind::floating:
      return v.as_double() != 0.0;
    case Value::Kind::string:
      return !v.str().empty();
    case Value::Kind::list:
      return v.list_obj().lazy || !v.list_obj().items.empty();
    case Value::Kind::dict:
      return !v.dict_obj().items.empty();
    default:
      return true;
  }
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  Meter::steps(1);
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::floating || b.kind() == K::floating) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::undefined:
    case K::none:
      return true;
    case K::string:
      Meter::text(static_cast<int64_t>(std::min(a.str().size(), b.str().size())));
      return a.str() == b.str();
    case K::list: {
      const auto &x = a.list_obj(), &y = b.list_obj();
      if (x.lazy || y.lazy) return &x == &y;
      if (x.tuple != y.tuple || x.is_range != y.is_range || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case K::dict: {
      const auto &x = a.dict_obj(), &y = b.dict_obj();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const auto* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

int compare(const Value& a, const Value& b) {
  Meter::steps(1);
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::floating && b.kind() != Value::Kind::floating)
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double();
  }
  if (a.is_string() && b.is_string()) {
    Meter::text(static_cast<int64_t>(std::min(a.str().size(), b.str().size())));
    return a.str().compare(b.str()) < 0 ? -1 : a.str() != b.str();
  }
  if (a.is_list() && b.is_list() && !a.list_obj().lazy && !b.list_obj().lazy && !a.list_obj().is_range &&
      !b.list_obj().is_range && a.list_obj().tuple == b.list_obj().tuple) {
    const auto &x = a.list_obj().items, &y = b.list_obj().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return compare(x[i], y[i]);
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  throw EvalError(concat("cannot order ", type_name(a), " and ", type_name(b)));
}

std::vector<Value> iterate(const Value& v) {
  Meter::steps(v.is_list()   ? static_cast<int64_t>(v.list_obj().items.size())
               : v.is_dict() ? static_cast<int64_t>(v.dict_obj().items.size())
                             : 1);
  switch (v.kind()) {
    case Value::Kind::undefined:
      return {};
    case Value::Kind::list: {
      auto& l = v.list_obj();
      if (l.lazy) {
        if (l.consumed)
          throw EvalError(
              "a generator (the result of map, select, reverse, ...) is used a second time, where "
              "Python would see it empty; convert it with |list first");
        l.consumed = true;
      }
      return l.items;
    }
    case Value::Kind::dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict_obj().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::string: {
      std::vector<Value> chars;
      for (char32_t c : decode_utf8(v.str())) chars.push_back(Value::string(encode_utf8(std::u32string(1, c))));
      return chars;
    }
    default:
      throw EvalError(concat("'", type_name(v), "' object is not iterable"));
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return 0;
    case Value::Kind::string:
      Meter::text(static_cast<int64_t>(v.str().size()));
      return code_points(v.str());
    case Value::Kind::list:
      if (v.list_obj().lazy) throw EvalError("object of type 'generator' has no len(); convert it with |list first");
      return static_cast<int64_t>(v.list_obj().items.size());
    case Value::Kind::dict:
      return static_cast<int64_t>(v.dict_obj().items.size());
    default:
      throw EvalError(concat("object of type '", type_name(v), "' has no len()"));
  }
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      throw EvalError(concat("'in <string>' requires string as left operand, not ", type_name(item)));
    Meter::scan(static_cast<int64_t>(container.str().size()), static_cast<int64_t>(item.str().size()));
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_dict()) return container.dict_obj().find(item) != nullptr;
  for (const auto& x : iterate(container))
    if (equal(x, item)) return true;
  return false;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// ---------------------------------------------------------------- json.dumps

namespace {

void json_quote(const std::string& s, bool ascii, std::string& out) {
  out += '"';
  char buf[16];
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      out += encode_utf8(std::u32string(1, c));
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::string:
      return k.str();
    case Value::Kind::boolean:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::none:
      return "null";
    case Value::Kind::integer:
      return std::to_string(k.as_int());
    case Value::Kind::floating:
      return json_float(k.as_double());
    default:
      throw EvalError(concat("keys must be str, int, float, bool or None, not ", type_name(k)));
  }
}

void json_value(const Value& v, const JsonOptions& o, int level, std::string& out);

// Python's encoder: "[" (newline + indent) items joined by item_sep (+ newline + indent) "]".
template <class Items, class Emit>
void json_container(const Items& items, char open, char close, const JsonOptions& o, int level, Emit emit,
                    std::string& out) {
  if (items.empty()) {
    out += open;
    out += close;
    return;
  }
  std::string newline_indent;
  if (o.indent_set) {
    check_text_size(static_cast<int64_t>(o.indent.size()) * (level + 1));
    newline_indent = "\n";
    for (int i = 0; i <= level; ++i) newline_indent += o.indent;
  }
  out += open;
  out += newline_indent;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += o.item_sep + newline_indent;
    emit(items[i]);
    check_text_size(static_cast<int64_t>(out.size()));
  }
  if (o.indent_set) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += o.indent;
  }
  out += close;
}

void json_value(const Value& v, const JsonOptions& o, int level, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::none:
      out += "null";
      return;
    case Value::Kind::boolean:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::integer:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::floating:
      out += json_float(v.as_double());
      return;
    case Value::Kind::string:
      json_quote(v.str(), o.ensure_ascii, out);
      return;
    case Value::Kind::list:
      if (!v.list_obj().lazy && !v.list_obj().is_range) {
        json_container(
            v.list_obj().items, '[', ']', o, level, [&](const Value& x) { json_value(x, o, level + 1, out); }, out);
        return;
      }
      break;
    case Value::Kind::dict: {
      auto items = v.dict_obj().items;
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return compare(a.first, b.first) < 0; });
      json_container(
          items, '{', '}', o, level,
          [&](const std::pair<Value, Value>& kv) {
            json_quote(json_key(kv.first), o.ensure_ascii, out);
            out += o.key_sep;
            json_value(kv.second, o, level + 1, out);
          },
          out);
      return;
    }
    default:
      break;
  }
  throw EvalError(concat("Object of type ", type_name(v), " is not JSON serializable"));
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& o) {
  std::string out;
  json_value(v, o, 0, out);
  return out;
}

}  // namespace anvil::jinja
