// jinja2's parser (jinja2/parser.py), for the statements and expressions of
// chat templates. Precedence, loosest first: `x if c else y`, or, and, not,
// comparisons (==, !=, <, <=, >, >=, in, not in; chainable), + -, ~,
// * / // %, **, unary - +, then postfix (.attr, [item], [a:b:c], calls),
// filters (|f) and tests (is t). Nesting is bounded (jinja/limits.h):
// blocks inside blocks, and expressions inside expressions, whether by
// recursion here or by chains this builds in a loop (a.b.c..., 1+1+...),
// since the evaluator, the checks and the tree's destructor recurse as deep
// as the tree is.

#include <algorithm>
#include <set>

#include "jinja/jinja.h"
#include "jinja/limits.h"

namespace anvil::jinja {
namespace {

ExprPtr make(Expr::Kind k, Pos p) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->pos = p;
  return e;
}

std::unique_ptr<Stmt> make_stmt(Stmt::Kind k, Pos p) {
  auto s = std::make_unique<Stmt>();
  s->kind = k;
  s->pos = p;
  return s;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Token::Type::eof) fail(cur().pos, concat("unexpected ", describe(cur())));
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Token::Type::op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Token::Type::name && cur().value == n; }
  [[noreturn]] void fail(Pos p, const std::string& what) const { throw SyntaxError(located(p, what)); }

  // Puts a depth back as it was when the parse function that made it returns.
  class Restore {
   public:
    explicit Restore(int& depth) : depth_(depth), saved_(depth) {}
    ~Restore() { depth_ = saved_; }
    Restore(const Restore&) = delete;
    Restore& operator=(const Restore&) = delete;

   private:
    int& depth_;
    int saved_;
  };
  // One level deeper in the expression being parsed, until the caller's Restore.
  void deeper(Pos at) {
    if (++expr_depth_ > kMaxExpressionDepth)
      fail(at, concat("expressions nested deeper than ", limit_note(kMaxExpressionDepth)));
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Type::eof:
        return "end of template";
      case Token::Type::var_end:
        return "end of print statement '}}'";
      case Token::Type::block_end:
        return "end of statement block '%}'";
      case Token::Type::var_begin:
        return "'{{'";
      case Token::Type::block_begin:
        return "'{%'";
      case Token::Type::text:
        return "template text";
      case Token::Type::string:
        return "a string";
      case Token::Type::integer:
      case Token::Type::floating:
        return "a number";
      default:
        return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().pos, concat("expected '", op, "', got ", describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != Token::Type::name) fail(cur().pos, concat("expected a name, got ", describe(cur())));
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != Token::Type::block_end) fail(cur().pos, concat("expected '%}', got ", describe(cur())));
    next();
  }

  // ------------------------------------------------------------ statements

  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    while (cur().type != Token::Type::eof) {
      const Token& t = cur();
      if (t.type == Token::Type::text) {
        auto s = make_stmt(Stmt::Kind::text, t.pos);
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Token::Type::var_begin) {
        next();
        auto s = make_stmt(Stmt::Kind::output, t.pos);
        s->expr = parse_tuple(false, true, {}, false);
        if (cur().type != Token::Type::var_end) fail(cur().pos, concat("expected '}}', got ", describe(cur())));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Token::Type::block_begin) {
        next();
        if (cur().type == Token::Type::name && std::find(ends.begin(), ends.end(), cur().value) != ends.end())
          return body;
        body.push_back(parse_statement());
        expect_block_end();
      } else {
        fail(t.pos, concat("unexpected ", describe(t)));
      }
    }
    return body;
  }

  // The body up to one of `ends` (consumed; its name in *found).
  Body parse_statements(const std::vector<std::string>& ends, const std::string& opener, std::string* found = nullptr) {
    Restore restore(block_depth_);
    if (++block_depth_ > kMaxBlockDepth)
      fail(cur().pos, concat("blocks ({% if %}, {% for %}, ...) nested deeper than ", limit_note(kMaxBlockDepth)));
    expect_block_end();
    Body body = subparse(ends);
    if (cur().type == Token::Type::eof) {
      std::string names;
      for (const auto& e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
      fail(cur().pos, concat("unexpected end of template: '", opener, "' needs ", names));
    }
    if (found) *found = cur().value;
    next();
    return body;
  }

  std::unique_ptr<Stmt> parse_statement() {
    const Token& t = cur();
    if (t.type != Token::Type::name) fail(t.pos, concat("expected a tag name, got ", describe(t)));
    const std::string& n = t.value;
    if (n == "for") return parse_for();
    if (n == "if") return parse_if();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "generation") {
      auto s = make_stmt(Stmt::Kind::generation, next().pos);
      const int saved = loops_;
      loops_ = 0;  // its body is a function in jinja2: no break or continue
      s->body = parse_statements({"endgeneration"}, "generation");
      loops_ = saved;
      return s;
    }
    if (n == "filter") return parse_filter_block();
    if (n == "break" || n == "continue") {
      if (loops_ == 0) fail(t.pos, concat("'{% ", n, " %}' outside a for loop"));
      return make_stmt(n == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, next().pos);
    }
    if (n == "print") {
      auto s = make_stmt(Stmt::Kind::output, next().pos);
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    static const std::set<std::string> kJinja = {"block",      "extends", "include", "from", "import", "with",
                                                 "autoescape", "call",    "raw",     "do",   "trans"};
    if (kJinja.count(n)) fail(t.pos, concat("'{% ", n, " %}' is not supported by Anvil's chat templates"));
    fail(t.pos, concat("unknown tag '", n, "'"));
  }

  std::unique_ptr<Stmt> parse_for() {
    auto s = make_stmt(Stmt::Kind::for_, next().pos);
    s->target = parse_target(false);
    if (!is_name("in")) fail(cur().pos, concat("expected 'in', got ", describe(cur())));
    next();
    s->expr = parse_tuple(false, false, "recursive", false);
    if (is_name("if")) {
      next();
      s->filter = parse_expression(true);
    }
    if (is_name("recursive")) fail(cur().pos, "recursive for loops are not supported by Anvil's chat templates");
    ++loops_;
    std::string found;
    s->body = parse_statements({"endfor", "else"}, "for", &found);
    --loops_;
    if (found == "else") s->else_body = parse_statements({"endfor"}, "for");
    return s;
  }

  std::unique_ptr<Stmt> parse_if() {
    auto s = make_stmt(Stmt::Kind::if_, next().pos);
    while (true) {
      auto test = parse_tuple(false, false, {}, false);
      std::string found;
      auto body = parse_statements({"elif", "else", "endif"}, "if", &found);
      s->branches.emplace_back(std::move(test), std::move(body));
      if (found == "elif") continue;
      if (found == "else") s->else_body = parse_statements({"endif"}, "if");
      return s;
    }
  }

  std::unique_ptr<Stmt> parse_set() {
    const Pos p = next().pos;
    Target target = parse_target(true);
    if (is_op("=")) {
      next();
      auto s = make_stmt(Stmt::Kind::set, p);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = make_stmt(Stmt::Kind::set_block, p);
    if (!target.attribute.empty() || target.unpack) fail(p, "'{% set %}' blocks assign to a single name");
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter_chain(make(Expr::Kind::name, p), false);  // the name: the block's text
    s->body = parse_statements({"endset"}, "set");
    return s;
  }

  // {% filter f(args) | g %}...{% endfilter %}: the body's text through the filters.
  std::unique_ptr<Stmt> parse_filter_block() {
    auto s = make_stmt(Stmt::Kind::filter_block, next().pos);
    s->filter = parse_filter_chain(make(Expr::Kind::name, s->pos), true);
    s->body = parse_statements({"endfilter"}, "filter");
    return s;
  }

  std::unique_ptr<Stmt> parse_macro() {
    auto s = make_stmt(Stmt::Kind::macro, next().pos);
    s->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      auto name = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression(true);
      }
      s->params.emplace_back(std::move(name), std::move(def));
    }
    next();
    const int saved = loops_;
    loops_ = 0;
    s->body = parse_statements({"endmacro"}, "macro");
    loops_ = saved;
    return s;
  }

  // for/set targets: a name, names (unpacking), or namespace.attribute.
  Target parse_target(bool with_namespace) {
    Target t;
    while (true) {
      const Token& tok = cur();
      if (tok.type != Token::Type::name || tok.value == "true" || tok.value == "false" || tok.value == "none" ||
          tok.value == "True" || tok.value == "False" || tok.value == "None")
        fail(tok.pos, concat("cannot assign to ", describe(tok)));
      t.names.push_back(next().value);
      if (with_namespace && is_op(".")) {
        next();
        t.attribute = expect_name();
      }
      if (!is_op(",")) break;
      next();  // a trailing comma is refused below, as jinja2 does
      t.unpack = true;
    }
    if (t.unpack && !t.attribute.empty()) fail(cur().pos, "cannot unpack into a namespace attribute");
    return t;
  }

  // ------------------------------------------------------------ expressions

  bool tuple_end(const char* extra) const {
    return cur().type == Token::Type::var_end || cur().type == Token::Type::block_end || is_op(")") ||
           (extra && *extra && is_name(extra));
  }

  ExprPtr parse_tuple(bool /*simplified*/, bool with_condexpr, const char* extra_end, bool explicit_parens) {
    const Pos p = cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (!is_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(cur().pos, concat("expected an expression, got ", describe(cur())));
    }
    auto t = make(Expr::Kind::tuple, p);
    t->args = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Restore restore(expr_depth_);
    deeper(cur().pos);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    Restore restore(expr_depth_);
    auto e = parse_or();
    while (is_name("if")) {
      deeper(cur().pos);
      auto c = make(Expr::Kind::cond, next().pos);
      c->args.push_back(parse_or());  // condition
      c->target = std::move(e);
      if (is_name("else")) {
        next();
        c->args.push_back(parse_condexpr());
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary_chain(Expr::Kind k, const char* word, ExprPtr (Parser::*operand)()) {
    Restore restore(expr_depth_);
    auto left = (this->*operand)();
    while (is_name(word)) {
      deeper(cur().pos);
      auto e = make(k, next().pos);
      e->args.push_back(std::move(left));
      e->args.push_back((this->*operand)());
      left = std::move(e);
    }
    return left;
  }
  ExprPtr parse_or() { return binary_chain(Expr::Kind::or_, "or", &Parser::parse_and); }
  ExprPtr parse_and() { return binary_chain(Expr::Kind::and_, "and", &Parser::parse_not); }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    Restore restore(expr_depth_);
    deeper(cur().pos);
    auto e = make(Expr::Kind::not_, next().pos);
    e->args.push_back(parse_not());
    return e;
  }

  ExprPtr parse_compare() {
    const Pos p = cur().pos;
    auto first = parse_math1();
    auto e = make(Expr::Kind::compare, p);
    e->args.push_back(std::move(first));
    static const std::set<std::string> kOps = {"==", "!=", "<", "<=", ">", ">="};
    while (true) {
      if (cur().type == Token::Type::op && kOps.count(cur().value)) {
        e->ops.push_back(next().value);
      } else if (is_name("in")) {
        next();
        e->ops.push_back("in");
      } else if (is_name("not") && look().type == Token::Type::name && look().value == "in") {
        next();
        next();
        e->ops.push_back("not in");
      } else {
        break;
      }
      e->args.push_back(parse_math1());
    }
    if (e->ops.empty()) return std::move(e->args[0]);
    return e;
  }

  ExprPtr binary_ops(std::initializer_list<const char*> ops, ExprPtr (Parser::*operand)()) {
    Restore restore(expr_depth_);
    auto left = (this->*operand)();
    while (true) {
      if (std::none_of(ops.begin(), ops.end(), [&](const char* o) { return is_op(o); })) return left;
      deeper(cur().pos);
      auto e = make(Expr::Kind::binary, cur().pos);
      e->name = next().value;
      e->args.push_back(std::move(left));
      e->args.push_back((this->*operand)());
      left = std::move(e);
    }
  }
  ExprPtr parse_math1() { return binary_ops({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_math2() { return binary_ops({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return binary_ops({"**"}, &Parser::parse_unary_filtered); }

  ExprPtr parse_concat() {
    const Pos p = cur().pos;
    auto first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(Expr::Kind::concat, p);
    e->args.push_back(std::move(first));
    while (is_op("~")) {
      next();
      e->args.push_back(parse_math2());
    }
    return e;
  }

  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    Restore restore(expr_depth_);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      deeper(cur().pos);
      const auto kind = is_op("-") ? Expr::Kind::neg : Expr::Kind::pos;
      node = make(kind, next().pos);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    return with_filter ? parse_filters(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Token::Type::name: {
        auto e = make(Expr::Kind::literal, next().pos);
        if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
          e->value = Value::boolean(t.value == "true" || t.value == "True");
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::name;
          e->name = t.value;
        }
        return e;
      }
      case Token::Type::string: {
        auto e = make(Expr::Kind::literal, t.pos);
        std::string s;
        while (cur().type == Token::Type::string) s += next().value;
        try {
          e->value = Value::string(std::move(s));
        } catch (const EvalError& err) {  // longer than a string may be
          fail(t.pos, err.what());
        }
        return e;
      }
      case Token::Type::integer:
      case Token::Type::floating: {
        auto e = make(Expr::Kind::literal, next().pos);
        e->value = t.type == Token::Type::integer ? Value::integer(t.ival) : Value::floating(t.fval);
        return e;
      }
      default:
        break;
    }
    if (is_op("(")) {
      next();
      auto e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[") || is_op("{")) return parse_collection(is_op("{"));
    fail(t.pos, concat("unexpected ", describe(t)));
  }

  ExprPtr parse_collection(bool dict) {
    auto e = make(dict ? Expr::Kind::dict : Expr::Kind::list, next().pos);
    const char* close = dict ? "}" : "]";
    while (!is_op(close)) {
      if (!e->args.empty()) expect_op(",");
      if (is_op(close)) break;
      e->args.push_back(parse_expression(true));
      if (dict) {
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
    }
    next();
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    Restore restore(expr_depth_);
    while (true) {
      if (is_op(".") || is_op("[") || is_op("(")) deeper(cur().pos);
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.value == ".") {
      const Token& a = next();
      if (a.type == Token::Type::name) {
        auto e = make(Expr::Kind::attr, t.pos);
        e->name = a.value;
        e->target = std::move(node);
        return e;
      }
      if (a.type != Token::Type::integer) fail(a.pos, "expected a name or a number after '.'");
      auto e = make(Expr::Kind::item, t.pos);
      auto idx = make(Expr::Kind::literal, a.pos);
      idx->value = Value::integer(a.ival);
      e->args.push_back(std::move(idx));
      e->target = std::move(node);
      return e;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    next();
    if (args.size() == 1 && args[0]->kind == Expr::Kind::slice) {
      args[0]->target = std::move(node);
      return std::move(args[0]);
    }
    auto e = make(Expr::Kind::item, t.pos);
    e->target = std::move(node);
    if (args.size() == 1) {
      e->args.push_back(std::move(args[0]));
    } else {
      auto tup = make(Expr::Kind::tuple, t.pos);
      tup->args = std::move(args);
      e->args.push_back(std::move(tup));
    }
    return e;
  }

  // `x`, or a slice [start:stop:step] with any part left out.
  ExprPtr parse_subscribed() {
    const Pos p = cur().pos;
    ExprPtr first;
    if (!is_op(":")) {
      first = parse_expression(true);
      if (!is_op(":")) return first;
    }
    next();
    auto e = make(Expr::Kind::slice, p);
    e->args.push_back(std::move(first));
    e->args.push_back(is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression(true));
    ExprPtr step;
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(",")) step = parse_expression(true);
    }
    e->args.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    const Pos p = cur().pos;
    expect_op("(");
    bool comma = false;
    while (!is_op(")")) {
      if (comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**"))
        fail(cur().pos, "*args and **kwargs in calls are not supported by Anvil's chat templates");
      if (cur().type == Token::Type::name && look().type == Token::Type::op && look().value == "=") {
        auto key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail(p, "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
      comma = true;
    }
    next();
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::call, node->pos);  // errors point at the callee
    e->target = std::move(node);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    auto name = expect_name();
    while (is_op(".")) {
      next();
      name += '.';
      name += expect_name();
    }
    return name;
  }

  // One filter applied to `node`: the name (checked once parsed, in
  // Template::Template, as jinja2 compiles) and its arguments.
  ExprPtr parse_filter(ExprPtr node) {
    auto e = make(Expr::Kind::filter, cur().pos);
    e->name = dotted_name();
    e->target = std::move(node);
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  // jinja2's parse_filter: `| f | g(x)`, or `f | g(x)` when `start_inline`
  // (a filter block's); no tests, no calls.
  ExprPtr parse_filter_chain(ExprPtr node, bool start_inline) {
    Restore restore(expr_depth_);
    while (start_inline || is_op("|")) {
      deeper(cur().pos);
      if (!start_inline) next();
      start_inline = false;
      node = parse_filter(std::move(node));
    }
    return node;
  }

  ExprPtr parse_filters(ExprPtr node) {
    Restore restore(expr_depth_);
    while (true) {
      if (is_op("|") || is_name("is") || is_op("(")) deeper(cur().pos);
      if (is_op("|")) {
        next();
        node = parse_filter(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr node) {
    const Pos at = next().pos;
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    auto e = make(Expr::Kind::test, cur().pos);
    e->name = dotted_name();
    e->target = std::move(node);
    const auto ty = cur().type;
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((ty == Token::Type::name || ty == Token::Type::string || ty == Token::Type::integer ||
                ty == Token::Type::floating || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(cur().pos, "tests cannot be chained with 'is'");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make(Expr::Kind::not_, at);
    n->args.push_back(std::move(e));
    return n;
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int loops_ = 0;
  int expr_depth_ = 0;   // expressions being parsed inside one another
  int block_depth_ = 0;  // blocks being parsed inside one another
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace anvil::jinja
