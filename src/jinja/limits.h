#pragma once
// How far a chat template may go. A model folder's chat_template is
// untrusted input: a template that recurses, nests or loops without end
// would otherwise exhaust the stack (a crash), memory or time. Each limit is
// far above what real templates use (they nest a handful deep and loop over
// the messages) and low enough that the interpreter stays within the default
// 8 MiB stack, a few GiB of memory and seconds of work. Reaching one is a
// SyntaxError or RenderError naming the template's line and column and the
// limit (docs/data.md, "Chat templates as written").

#include <algorithm>
#include <cstdint>
#include <string>

#include "anvil/core/error.h"
#include "jinja/value.h"

namespace anvil::jinja {

/// Parsing: expressions inside one another (parentheses, operators, lists
/// and dicts, calls, filters, attribute and item chains).
constexpr int kMaxExpressionDepth = 256;
/// Parsing: blocks ({% if %}, {% for %}, {% macro %}, ...) inside one another.
constexpr int kMaxBlockDepth = 256;
/// Rendering: macro calls inside one another (recursion).
constexpr int kMaxMacroDepth = 128;
/// Rendering: statements, expressions and macro calls in progress at once.
constexpr int kMaxRenderDepth = 512;
/// Values: lists, dicts and namespaces inside one another (messages, tools,
/// and what the template builds).
constexpr int kMaxValueDepth = 128;
/// The rendered text, any one string, and what a {% set %} block or macro writes, in bytes.
constexpr int64_t kMaxTextBytes = int64_t{64} << 20;
/// Work in one rendering: statements run, expressions evaluated, loop
/// iterations, and items of lists and dicts made, visited or compared.
constexpr int64_t kMaxSteps = 2'000'000;
/// Text in one rendering, in bytes: strings made, text written, and strings
/// scanned (compared, searched, filtered).
constexpr int64_t kMaxTextWork = int64_t{256} << 20;

/// "N, the limit for chat templates", for the messages.
inline std::string limit_note(int64_t n) { return concat(n, ", the limit for chat templates"); }

/// Refuses a string, list or output of `bytes` before it is made.
inline void check_text_size(int64_t bytes) {
  if (bytes > kMaxTextBytes)
    throw EvalError(concat("a string or output of ", bytes, " bytes, longer than ", limit_note(kMaxTextBytes)));
}

/// The work a rendering has done. One is active on a thread while a
/// Template renders there; what the interpreter and builtins charge when
/// none is (a value built from a message) counts for nothing. The charges
/// are in proportion to what an operation walks or makes, so a rendering
/// that stays within the budget ends in seconds. A Meter made while another
/// is active joins it: renderings inside a caller's Meter share its budget
/// (the chat_template fuzz target gives each input a smaller one).
class Meter {
 public:
  explicit Meter(int64_t max_steps = kMaxSteps, int64_t max_text = kMaxTextWork)
      : outer_(active()), max_steps_(max_steps), max_text_(max_text) {
    if (!outer_) active() = this;
  }
  ~Meter() {
    if (!outer_) active() = nullptr;
  }
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;

  static void steps(int64_t n) {
    Meter* m = active();
    if (!m || (m->steps_ += n) <= m->max_steps_) return;
    throw EvalError(concat("the template takes more than ", m->max_steps_,
                           " steps (statements, expressions, loop iterations and items visited), the limit for chat "
                           "templates: a loop without end?"));
  }
  /// A search of `bytes` of text for `pattern_bytes` (a substring, a set of
  /// characters): at worst every position against the whole pattern.
  static void scan(int64_t bytes, int64_t pattern_bytes) { text(bytes * std::max<int64_t>(1, pattern_bytes)); }
  /// A builtin (method, filter, test) on a string of `bytes`, given `args`:
  /// a scan for the longest string among them.
  static void scan(int64_t bytes, const CallArgs& args) {
    int64_t longest = 0;
    for (const auto& v : args.pos)
      if (v.is_string()) longest = std::max<int64_t>(longest, static_cast<int64_t>(v.str().size()));
    for (const auto& kv : args.kw)
      if (kv.second.is_string()) longest = std::max<int64_t>(longest, static_cast<int64_t>(kv.second.str().size()));
    scan(bytes, longest);
  }
  static void text(int64_t bytes) {
    Meter* m = active();
    if (!m || (m->text_ += bytes) <= m->max_text_) return;
    throw EvalError(concat("the template makes, writes and scans more than ", m->max_text_,
                           " bytes of text in all, the limit for chat templates"));
  }

 private:
  static Meter*& active() {
    static thread_local Meter* m = nullptr;
    return m;
  }
  Meter* outer_;  // the active one this joined, if any
  int64_t max_steps_, max_text_;
  int64_t steps_ = 0;
  int64_t text_ = 0;
};

}  // namespace anvil::jinja
