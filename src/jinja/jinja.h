#pragma once
// A Jinja interpreter for chat templates (tokenizer_config.json's
// chat_template), rendering them as transformers' apply_chat_template does:
// jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with loop controls, {% generation %} (its
// AssistantTracker), {% filter %} blocks, raise_exception, namespace, and
// tojson as json.dumps (ensure_ascii=False). A construct outside that subset
// is an error naming the template's line and column, never a different
// rendering.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "anvil/core/error.h"
#include "jinja/value.h"

namespace anvil::jinja {

/// The template is not valid Jinja, or uses what Anvil does not support.
class SyntaxError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// Rendering failed: raise_exception, an undefined value used, a type error.
class RenderError : public DataError {
 public:
  using DataError::DataError;
  std::string raised;  // raise_exception's message, when that was the cause
};

struct Pos {
  int line = 1, col = 1;
};
/// "chat_template line L, column C: what".
std::string located(Pos p, const std::string& what);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,
    name,
    list,
    tuple,
    dict,
    attr,
    item,
    slice,
    call,
    filter,
    test,
    neg,
    pos,
    not_,
    and_,
    or_,
    binary,
    compare,
    concat,
    cond
  };
  Kind kind;
  Pos pos;
  Value value;                // literal
  std::string name;           // name, attr, filter, test, binary operator
  std::vector<ExprPtr> args;  // operands; list/tuple items; dict k0 v0 k1 v1 ...; call/filter/test arguments
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // compare: one operator per operand after the first
  ExprPtr target;                // attr/item/slice/call/filter/test subject; cond: the value when true
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

/// An assignment target: a name, names to unpack, or namespace.attribute.
struct Target {
  std::vector<std::string> names;
  std::string attribute;  // set when names[0] is a namespace
  bool unpack = false;
};

struct Stmt {
  enum class Kind { text, output, if_, for_, set, set_block, filter_block, generation, break_, continue_, macro };
  Kind kind;
  Pos pos;
  std::string text;                                     // text; macro name
  ExprPtr expr;                                         // output; for's iterable; set's value
  ExprPtr filter;                                       // for's `if`; set/filter block's filters (on a name)
  Target target;                                        // for, set, set block
  std::vector<std::pair<ExprPtr, Body>> branches;       // if/elif
  Body body, else_body;                                 // for, generation, set/filter block, macro; if's, for's else
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

/// A lexed token: text between tags, a tag delimiter, or a token of an expression.
struct Token {
  enum class Type { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Type type;
  std::string value;  // text, name, string contents, operator
  int64_t ival = 0;
  double fval = 0;
  Pos pos;
};

/// jinja2's lexer with trim_blocks and lstrip_blocks: newlines normalized to
/// "\n", one trailing newline dropped, comments removed, whitespace control
/// applied to the text tokens.
std::vector<Token> lex(const std::string& source);
/// The statements of a template. Throws SyntaxError.
Body parse(const std::vector<Token>& tokens);

struct RenderResult {
  std::string text;
  /// {% generation %} spans as transformers' AssistantTracker records them:
  /// (start, end) in characters (code points) of `text`.
  std::vector<std::pair<int64_t, int64_t>> generation;
};

class Template {
 public:
  /// Throws SyntaxError naming the line and column.
  explicit Template(const std::string& source);
  RenderResult render(const std::vector<std::pair<std::string, Value>>& variables) const;
  bool has_generation() const { return has_generation_; }
  /// Whether the template reads variable `name` anywhere.
  bool uses(const std::string& name) const;

 private:
  Body body_;
  bool has_generation_ = false;
  std::vector<std::string> names_;
};

}  // namespace anvil::jinja
