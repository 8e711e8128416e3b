// Python's str.format (PEP 3101) as jinja2's sandbox runs it
// (SandboxedFormatter): replacement fields {}, {0}, {name}, with .attribute
// and [index] looked up as the template's own `x.attr` and `x[i]` are,
// conversions !s, !r and !a, and the standard format spec
// [[fill]align][sign][#][0][width][,|_][.precision][type] for str, int, bool
// and float, with replacement fields inside a spec ({:{width}}) as deep as
// Python takes them. What Python refuses is an EvalError, never a different
// text.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "anvil/core/error.h"
#include "jinja/builtins.h"
#include "jinja/limits.h"

namespace anvil::jinja {
namespace {

constexpr const char* kWhat = "str.format";

[[noreturn]] void fail(const std::string& what) { throw EvalError(concat(kWhat, ": ", what)); }

struct Spec {
  std::u32string fill = U" ";
  char align = 0;  // < > ^ =, or 0 for the type's default
  char sign = 0;   // + - ' '
  bool alternate = false;
  bool zero = false;  // the 0 flag
  int64_t width = 0;
  char grouping = 0;  // , or _
  int64_t precision = -1;
  char type = 0;
};

int64_t digits_at(const std::u32string& s, size_t& i) {
  int64_t n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    n = n * 10 + (s[i++] - '0');
    if (n > kMaxTextBytes) fail("a width or precision beyond what a chat template may write");
  }
  return n;
}

// CPython's parse_internal_render_format_spec.
Spec parse_spec(const std::string& text, const Value& v) {
  const auto s = decode_utf8(text);
  const auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  Spec spec;
  size_t i = 0;
  bool fill_given = false;
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s.substr(0, 1), spec.align = static_cast<char>(s[1]), i = 2, fill_given = true;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = static_cast<char>(s[0]), i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '#') spec.alternate = true, ++i;
  if (i < s.size() && s[i] == '0' && !fill_given) spec.zero = true, ++i;
  spec.width = digits_at(s, i);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) fail("Cannot specify both ',' and '_'.");
  if (i < s.size() && s[i] == '.') {
    const size_t start = ++i;
    spec.precision = digits_at(s, i);
    if (i == start) fail("Format specifier missing precision");
  }
  if (s.size() - i > 1 || (i < s.size() && s[i] > 0x7f))
    fail(concat("Invalid format specifier '", text, "' for object of type '", type_name(v), "'"));
  if (i < s.size()) spec.type = static_cast<char>(s[i]);
  return spec;
}

// `body` (sign, prefix and digits: `lead` bytes of sign and prefix) padded to the width.
std::string pad(const std::string& body, size_t lead, const Spec& spec, char default_align) {
  const int64_t n = code_points(body);
  if (n >= spec.width) return body;
  check_text_size(spec.width * 4);
  const char align = spec.align ? spec.align : default_align;
  const auto fill = [&](int64_t k) {
    std::u32string f;
    for (int64_t j = 0; j < k; ++j) f += spec.fill;
    return encode_utf8(f);
  };
  const int64_t m = spec.width - n;
  switch (align) {
    case '<':
      return body + fill(m);
    case '^':
      return fill(m / 2) + body + fill(m - m / 2);
    case '=':
      return body.substr(0, lead) + fill(m) + body.substr(lead);
    default:
      return fill(m) + body;
  }
}

std::string format_str(const std::string& s, Spec spec) {
  if (spec.sign) fail("Sign not allowed in string format specifier");
  if (spec.alternate) fail("Alternate form (#) not allowed in string format specifier");
  if (spec.grouping) fail(concat("Cannot specify '", spec.grouping, "' with 's'."));
  if (spec.align == '=') fail("'=' alignment not allowed in string format specifier");
  if (spec.type && spec.type != 's') fail(concat("Unknown format code '", spec.type, "' for object of type 'str'"));
  if (spec.zero) spec.fill = U"0";
  std::string body = s;
  if (spec.precision >= 0 && code_points(s) > spec.precision)
    body = encode_utf8(decode_utf8(s).substr(0, static_cast<size_t>(spec.precision)));
  return pad(body, 0, spec, '<');
}

// Digits with a separator every `every` of them, from the right, and, to
// make `min_width` characters, zeros before them, grouped too (CPython's
// zero padding of a grouped number: "0,000,001"; never a separator first).
std::string grouped(const std::string& digits, char sep, int every, int64_t min_width = 0) {
  if (!sep) return digits;
  std::string out;  // reversed
  int in_group = 0;
  const auto add = [&](char digit) {
    if (in_group == every) out += sep, in_group = 0;
    out += digit, ++in_group;
  };
  for (size_t i = digits.size(); i-- > 0;) add(digits[i]);
  while (static_cast<int64_t>(out.size()) < min_width) add('0');
  return std::string(out.rbegin(), out.rend());
}

// The sign, (prefix,) digits and the rest (a fraction, an exponent, '%'),
// padded: what int and float formatting share. `every`: the digits of a
// group (0: not grouped).
std::string numeric(bool negative, const std::string& prefix, const std::string& digits, const std::string& rest,
                    int every, Spec spec) {
  if (spec.zero) {
    spec.fill = U"0";
    if (!spec.align) spec.align = '=';
  }
  const std::string sign = negative ? "-" : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
  const size_t lead = sign.size() + prefix.size();
  int64_t min_width = 0;  // zeros padding a grouped number are grouped with it
  if (spec.fill == U"0" && spec.align == '=') min_width = spec.width - static_cast<int64_t>(lead) - code_points(rest);
  check_text_size(min_width * 2);
  const std::string number = every ? grouped(digits, spec.grouping, every, min_width) : digits;
  return pad(sign + prefix + number + rest, lead, spec, '>');
}

std::string format_float(double d, Spec spec);

std::string format_int(int64_t i, const Spec& spec) {
  const char t = spec.type ? spec.type : 'd';
  if (std::string("eEfFgG%").find(t) != std::string::npos) return format_float(static_cast<double>(i), spec);
  if (spec.precision >= 0) fail("Precision not allowed in integer format specifier");
  if (t == 'c') {  // chr(i), padded as a number is
    if (spec.sign || spec.alternate || spec.grouping)
      fail("Sign, alternate form (#) and grouping are not allowed with integer format specifier 'c'");
    if (i < 0 || i > 0x10FFFF || (i >= 0xD800 && i <= 0xDFFF))
      fail("%c arg not in range(0x110000), or a surrogate (which UTF-8 cannot hold)");
    return numeric(false, "", encode_utf8(std::u32string(1, static_cast<char32_t>(i))), "", 0, spec);
  }
  const int base = t == 'b' ? 2 : t == 'o' ? 8 : t == 'x' || t == 'X' ? 16 : 10;
  if (base == 10 && t != 'd' && t != 'n') fail(concat("Unknown format code '", t, "' for object of type 'int'"));
  if ((base != 10 && spec.grouping == ',') || (t == 'n' && spec.grouping))
    fail(concat("Cannot specify '", spec.grouping, "' with '", t, "'."));
  uint64_t u = i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  std::string digits;
  do {
    digits.insert(digits.begin(), "0123456789abcdef"[u % static_cast<uint64_t>(base)]);
    u /= static_cast<uint64_t>(base);
  } while (u);
  std::string prefix = spec.alternate && base != 10 ? std::string("0") + (base == 2 ? 'b' : base == 8 ? 'o' : 'x') : "";
  if (t == 'X')
    for (auto* s : {&digits, &prefix})
      for (auto& c : *s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return numeric(i < 0, prefix, digits, "", base == 10 ? 3 : 4, spec);
}

// A finite non-negative double through printf's `format` (%.*e, %.*f, ...) at `precision`.
std::string printed(const std::string& format, int64_t precision, double a) {
  check_text_size(precision + 400);  // 309 digits before the point at most, and the exponent
  std::string buf(static_cast<size_t>(precision) + 400, '\0');
  buf.resize(
      static_cast<size_t>(std::snprintf(buf.data(), buf.size(), format.c_str(), static_cast<int>(precision), a)));
  return buf;
}

// No type with a precision: 'g', but in exponent form from one digit fewer
// before the point and with a ".0" kept (CPython's Py_DTSF_ADD_DOT_0); with
// '#', trailing zeros and the point kept as '#g' keeps them.
std::string general_with_dot(double a, int64_t precision, bool alternate) {
  const int p = static_cast<int>(std::max<int64_t>(precision, 1));
  const std::string sci = printed(alternate ? "%#.*e" : "%.*e", p - 1, a);
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  if (exp < -4 || exp >= p - 1) {
    std::string mantissa = sci.substr(0, e);
    if (!alternate && mantissa.find('.') != std::string::npos) {
      mantissa.erase(mantissa.find_last_not_of('0') + 1);
      if (mantissa.back() == '.') mantissa.pop_back();
    }
    return mantissa + sci.substr(e);
  }
  const std::string fixed = printed(alternate ? "%#.*g" : "%.*g", p, a);
  return fixed.find('.') == std::string::npos ? fixed + ".0" : fixed;
}

// repr(), with '#' a point even in exponent form ("1.e+16").
std::string repr_form(double a, bool alternate) {
  std::string r = float_repr(a);
  if (alternate && std::isfinite(a) && r.find('.') == std::string::npos) r.insert(std::min(r.find('e'), r.size()), ".");
  return r;
}

// CPython's format_float_internal: no type is repr() without a precision;
// '%' is 'f' of 100 times the value.
std::string format_float(double d, Spec spec) {
  char t = spec.type ? spec.type : 'r';
  if (std::string("eEfFgGn%r").find(t) == std::string::npos)
    fail(concat("Unknown format code '", t, "' for object of type 'float'"));
  if (t == 'n' && spec.grouping) fail(concat("Cannot specify '", spec.grouping, "' with 'n'."));
  if (t == 'n') t = 'g';
  const bool percent = t == '%';
  if (percent) t = 'f', d *= 100;
  const bool negative = std::signbit(d) && !std::isnan(d);
  const double a = std::fabs(d);
  std::string body;
  if (t == 'r') {
    body = spec.precision < 0 || !std::isfinite(a) ? repr_form(a, spec.alternate)
                                                   : general_with_dot(a, spec.precision, spec.alternate);
  } else {
    body = printed(std::string(spec.alternate ? "%#.*" : "%.*") + t, spec.precision < 0 ? 6 : spec.precision, a);
  }
  if (percent) body += '%';
  const size_t int_end = std::min(body.find_first_of(".eE%"), body.size());
  return numeric(negative, "", body.substr(0, int_end), body.substr(int_end), std::isfinite(a) ? 3 : 0, spec);
}

// Python's ascii() of a repr: what is not ASCII as \xhh, \uhhhh or \Uhhhhhhhh.
std::string ascii(const std::string& repr_text) {
  std::string out;
  for (const char32_t c : decode_utf8(repr_text)) {
    if (c < 0x80) {
      out += static_cast<char>(c);
      continue;
    }
    char buf[16];
    std::snprintf(buf, sizeof buf,
                  c < 0x100     ? "\\x%02x"
                  : c < 0x10000 ? "\\u%04x"
                                : "\\U%08x",
                  static_cast<unsigned>(c));
    out += buf;
  }
  return out;
}

// Python's format(v, spec).
std::string format_value(const Value& v, const std::string& spec_text) {
  switch (v.kind()) {
    case Value::Kind::string:
      return spec_text.empty() ? v.str() : format_str(v.str(), parse_spec(spec_text, v));
    case Value::Kind::integer:
      return format_int(v.as_int(), parse_spec(spec_text, v));
    case Value::Kind::boolean:
      return spec_text.empty() ? to_str(v) : format_int(v.as_int(), parse_spec(spec_text, v));
    case Value::Kind::floating:
      return format_float(v.as_double(), parse_spec(spec_text, v));
    default:  // object.__format__
      if (!spec_text.empty()) fail(concat("unsupported format string passed to ", type_name(v), ".__format__"));
      return to_str(v);
  }
}

// The replacement fields of one format string (and of the specs nested in it), numbered as CPython does.
class Formatter {
 public:
  explicit Formatter(CallArgs& args) : args_(args) {}

  std::string run(const std::string& f, int depth) {
    if (depth > 2) fail("Max string recursion exceeded");
    std::string out;
    for (size_t i = 0; i < f.size(); ++i) {
      const char c = f[i];
      if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {
        out += c, ++i;
      } else if (c == '}') {
        fail("Single '}' encountered in format string");
      } else if (c == '{') {
        size_t end = i + 1;
        for (int open = 1; end < f.size(); ++end) {
          open += f[end] == '{' ? 1 : f[end] == '}' ? -1 : 0;
          if (open == 0) break;
        }
        if (end >= f.size()) fail("expected '}' before end of string");
        out += field(f.substr(i + 1, end - i - 1), depth);
        i = end;
      } else {
        out += c;
      }
      check_text_size(static_cast<int64_t>(out.size()));
    }
    return out;
  }

 private:
  // "name[.attr|[key]]...[!conversion][:spec]".
  std::string field(const std::string& f, int depth) {
    size_t k = 0;
    while (k < f.size() && f[k] != '!' && f[k] != ':') {
      if (f[k] == '{') fail("unexpected '{' in field name");
      if (f[k] == '[') k = std::min(f.find(']', k), f.size() - 1);
      ++k;
    }
    const std::string name = f.substr(0, k);
    char conversion = 0;
    if (k < f.size() && f[k] == '!') {
      if (k + 1 >= f.size()) fail("end of string while looking for conversion specifier");
      conversion = f[k + 1];
      k += 2;
      if (k < f.size() && f[k] != ':') fail("expected ':' after conversion specifier");
    }
    Value v = lookup(name);  // before the spec's own fields, which number after it
    const std::string spec = k < f.size() ? run(f.substr(k + 1), depth + 1) : "";
    if (conversion == 'r')
      v = Value::string(repr(v));
    else if (conversion == 's')
      v = Value::string(to_str(v));
    else if (conversion == 'a')
      v = Value::string(ascii(repr(v)));
    else if (conversion)
      fail(concat("Unknown conversion specifier ", conversion));
    return format_value(v, spec);
  }

  Value argument(const std::string& first) {
    const bool numbered = !first.empty() && first.find_first_not_of("0123456789") == std::string::npos;
    if (first.empty() || numbered) {
      if (first.empty() ? numbering_ == Numbering::manual : numbering_ == Numbering::automatic)
        fail(first.empty() ? "cannot switch from manual field specification to automatic field numbering"
                           : "cannot switch from automatic field numbering to manual field specification");
      numbering_ = first.empty() ? Numbering::automatic : Numbering::manual;
      const size_t i = first.empty() ? next_++ : std::stoul(first.substr(0, 9));
      if (i >= args_.pos.size()) fail(concat("Replacement index ", i, " out of range for positional args tuple"));
      return args_.pos[i];
    }
    for (const auto& [k, v] : args_.kw)
      if (k == first) return v;
    fail(concat("no argument named '", first, "'"));
  }

  // The argument, then each .attribute and [index] looked up as the sandbox does.
  Value lookup(const std::string& name) {
    size_t k = std::min(name.find_first_of(".["), name.size());
    Value v = argument(name.substr(0, k));
    while (k < name.size()) {
      const bool attr = name[k] == '.';
      const size_t end = attr ? std::min(name.find_first_of(".[", k + 1), name.size()) : name.find(']', k);
      if (end == std::string::npos) fail("Missing ']' in format string");
      const std::string part = name.substr(k + 1, end - k - 1);
      if (part.empty()) fail("Empty attribute in format string");
      const bool index = !attr && part.find_first_not_of("0123456789") == std::string::npos;
      v = attr ? get_attr(v, part)
               : get_item(v, index ? Value::integer(std::stoll(part.substr(0, 18))) : Value::string(part));
      k = attr ? end : end + 1;
      if (k < name.size() && name[k] != '.' && name[k] != '[')
        fail("Only '.' or '[' may follow ']' in format field specifier");
    }
    return v;
  }

  enum class Numbering { none, automatic, manual };
  CallArgs& args_;
  Numbering numbering_ = Numbering::none;
  size_t next_ = 0;
};

}  // namespace

std::string str_format(const std::string& format, CallArgs& args) { return Formatter(args).run(format, 0); }

}  // namespace anvil::jinja
