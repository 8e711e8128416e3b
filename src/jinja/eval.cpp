// Renders a parsed chat template. Scoping follows jinja2: a for loop's body
// gets a fresh scope each iteration (assignments there do not outlive it,
// which is why templates use namespace()), and so do set and filter blocks;
// `if` gets none, a macro sees its arguments and the template's top level.
// {% generation %} spans are recorded as transformers' AssistantTracker
// does: the start is the length of the top-level output so far, the end
// that plus the block's length. The rendering keeps within jinja/limits.h:
// how deep it recurses (statements, expressions, macro calls), how much it
// writes, and its work.

#include <unordered_map>

#include "jinja/jinja.h"
#include "jinja/builtins.h"
#include "jinja/limits.h"

namespace anvil::jinja {
namespace {

enum class Flow { normal, break_, continue_ };

class Renderer {
 public:
  explicit Renderer(const std::vector<std::pair<std::string, Value>>& variables) {
    scopes_.emplace_back();
    for (auto& [k, v] : globals()) scopes_[0].vars[k] = v;
    for (const auto& [k, v] : variables) scopes_[0].vars[k] = v;
  }

  RenderResult run(const Body& body) {
    exec(body);
    RenderResult r;
    r.text = std::move(root_);
    r.generation = std::move(generation_);
    return r;
  }

 private:
  struct Scope {
    std::unordered_map<std::string, Value> vars;
    bool barrier = false;  // a macro's frame: names resolve here, then at the top level
  };

  // Counts one level of recursion (a statement, an expression or a macro
  // call in progress) until it returns; throws past `limit`.
  class Level {
   public:
    Level(int& depth, int limit, const char* what) : depth_(depth) {
      if (++depth_ > limit) {
        --depth_;
        throw EvalError(concat(what, " nested deeper than ", limit_note(limit)));
      }
    }
    ~Level() { --depth_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    int& depth_;
  };
  static constexpr const char* kNesting = "statements, expressions and macro calls";

  [[noreturn]] static void fail(Pos p, const EvalError& e) {
    RenderError err(located(p, dynamic_cast<const Raised*>(&e) ? concat("raise_exception: ", e.what()) : e.what()));
    if (dynamic_cast<const Raised*>(&e)) err.raised = e.what();
    throw err;
  }

  Value lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      const auto it = scopes_[i].vars.find(name);
      if (it != scopes_[i].vars.end()) return it->second;
      if (scopes_[i].barrier && i > 0) {
        const auto top = scopes_[0].vars.find(name);
        return top != scopes_[0].vars.end() ? top->second : Value::undefined(concat("'", name, "' is undefined"));
      }
    }
    return Value::undefined(concat("'", name, "' is undefined"));
  }

  void assign(const Target& t, const Value& v) {
    auto& vars = scopes_.back().vars;
    if (!t.attribute.empty()) {
      const Value ns = lookup(t.names[0]);
      if (ns.kind() != Value::Kind::ns || ns.ns_obj().loop)
        throw EvalError(concat("cannot assign attribute on non-namespace object '", t.names[0], "'"));
      check_namespace_value(v, t.names[0], t.attribute);
      if (t.attribute[0] == '_')
        throw EvalError(concat("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '",
                               t.attribute, "'. Please rename the attribute."));
      ns.ns_obj().attrs.set(Value::string(t.attribute), v);
      return;
    }
    if (!t.unpack) {
      vars[t.names[0]] = v;
      return;
    }
    const auto items = iterate(v);
    if (items.size() != t.names.size())
      throw EvalError(
          items.size() > t.names.size()
              ? concat("too many values to unpack (expected ", t.names.size(), ")")
              : concat("not enough values to unpack (expected ", t.names.size(), ", got ", items.size(), ")"));
    for (size_t i = 0; i < items.size(); ++i) vars[t.names[i]] = items[i];
  }

  // ------------------------------------------------------------ statements

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec_one(*s);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec_one(const Stmt& s) {
    try {
      const Level level(depth_, kMaxRenderDepth, kNesting);
      Meter::steps(1);
      switch (s.kind) {
        case Stmt::Kind::text:
          emit(s.text);
          return Flow::normal;
        case Stmt::Kind::output:
          emit(to_str(eval(*s.expr)));
          return Flow::normal;
        case Stmt::Kind::if_:
          for (const auto& [test, body] : s.branches)
            if (truthy(eval(*test))) return exec(body);
          return exec(s.else_body);
        case Stmt::Kind::for_:
          exec_for(s);
          return Flow::normal;
        case Stmt::Kind::set:
          assign(s.target, eval(*s.expr));
          return Flow::normal;
        case Stmt::Kind::set_block:
          exec_set_block(s);
          return Flow::normal;
        case Stmt::Kind::filter_block:
          return exec_filter_block(s);
        case Stmt::Kind::generation:
          exec_generation(s);
          return Flow::normal;
        case Stmt::Kind::break_:
          return Flow::break_;
        case Stmt::Kind::continue_:
          return Flow::continue_;
        case Stmt::Kind::macro:
          define_macro(s);
          return Flow::normal;
      }
    } catch (const EvalError& e) {
      fail(s.pos, e);
    }
    return Flow::normal;
  }

  // Writes to the output (the template's, or a block's or macro's being captured).
  void emit(const std::string& text) {
    check_text_size(static_cast<int64_t>(out_->size() + text.size()));
    Meter::text(static_cast<int64_t>(text.size()));
    if (out_ == &root_) root_chars_ += code_points(text);
    *out_ += text;
  }

  std::string capture(const Body& body) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    exec(body);
    out_ = saved;
    return buf;
  }

  // A block's text through its filter chain, whose subject is the name "" (one no template can write).
  Value filtered(const Expr& chain, Value text) {
    scopes_.push_back({});
    scopes_.back().vars[""] = std::move(text);
    Value v = eval(chain);
    scopes_.pop_back();
    return v;
  }

  // Set and filter blocks are scopes of their own in jinja2: what they assign stays inside.
  void exec_set_block(const Stmt& s) {
    scopes_.push_back({});
    Value text = Value::string(capture(s.body));
    scopes_.pop_back();
    assign(s.target, s.filter ? filtered(*s.filter, std::move(text)) : text);
  }

  // A break or continue in the body leaves the loop iteration, the block's text unwritten, as in jinja2.
  Flow exec_filter_block(const Stmt& s) {
    scopes_.push_back({});
    std::string text;
    std::string* saved = out_;
    out_ = &text;
    const Flow f = exec(s.body);
    out_ = saved;
    scopes_.pop_back();
    if (f != Flow::normal) return f;
    const Value v = filtered(*s.filter, Value::string(std::move(text)));
    if (!v.is_string())  // jinja2 joins the output's strings: anything else is a TypeError
      throw EvalError(concat("a {% filter %} block's filters give a ", type_name(v), ", where a string is written"));
    emit(v.str());
    return Flow::normal;
  }

  void exec_generation(const Stmt& s) {
    const int64_t start = root_chars_;
    const std::string body = capture(s.body);
    generation_.emplace_back(start, start + code_points(body));
    emit(body);
  }

  // Made for every iteration, so from keys made once and without searching them.
  static Value loop_object(const std::vector<Value>& items, size_t i) {
    static const auto keys = [] {
      std::vector<Value> k;
      for (const char* name : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                               "previtem", "nextitem", "cycle", "changed"})
        k.push_back(Value::string(name));
      return k;
    }();
    static const Value changed = Value::function("loop.changed", [](CallArgs&) -> Value {
      throw EvalError("loop.changed() is not supported by Anvil's chat templates");
    });
    auto loop = std::make_shared<NamespaceObj>();
    loop->loop = true;
    const auto n = static_cast<int64_t>(items.size());
    const auto k = static_cast<int64_t>(i);
    const Value values[] = {Value::integer(k + 1),
                            Value::integer(k),
                            Value::integer(n - k),
                            Value::integer(n - k - 1),
                            Value::boolean(k == 0),
                            Value::boolean(k == n - 1),
                            Value::integer(n),
                            Value::integer(1),
                            Value::integer(0),
                            k > 0 ? items[i - 1] : Value::undefined("there is no previous item"),
                            k + 1 < n ? items[i + 1] : Value::undefined("there is no next item"),
                            Value::function("loop.cycle",
                                            [k](CallArgs& ca) {
                                              if (ca.pos.empty()) throw EvalError("no items for cycling given");
                                              return ca.pos[static_cast<size_t>(k) % ca.pos.size()];
                                            }),
                            changed};
    loop->attrs.items.reserve(keys.size());
    for (size_t j = 0; j < keys.size(); ++j) loop->attrs.add_new(keys[j], values[j]);
    return Value::ns(loop);
  }

  void exec_for(const Stmt& s) {
    std::vector<Value> items = iterate(eval(*s.expr));
    if (s.filter) {
      std::vector<Value> kept;
      for (auto& item : items) {
        scopes_.push_back({});
        assign(s.target, item);
        const bool keep = truthy(eval(*s.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      scopes_.push_back({});
      exec(s.else_body);
      scopes_.pop_back();
      return;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      Meter::steps(1);
      scopes_.push_back({});
      assign(s.target, items[i]);
      scopes_.back().vars["loop"] = loop_object(items, i);
      const Flow f = exec(s.body);
      scopes_.pop_back();
      if (f == Flow::break_) break;
    }
  }

  void define_macro(const Stmt& s) {
    const Stmt* m = &s;
    scopes_.back().vars[s.text] = Value::function(s.text, [this, m](CallArgs& ca) { return call_macro(*m, ca); });
  }

  Value call_macro(const Stmt& m, CallArgs& ca) {
    const Level level(macro_depth_, kMaxMacroDepth, "macro calls");
    if (ca.pos.size() > m.params.size())
      throw EvalError(concat("macro '", m.text, "' takes not more than ", m.params.size(), " argument(s)"));
    Scope frame;
    frame.barrier = true;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      const Value* given = i < ca.pos.size() ? &ca.pos[i] : nullptr;
      for (const auto& [k, v] : ca.kw)
        if (k == name) given = &v;
      frame.vars[name] = given ? *given : def ? eval(*def) : Value::undefined(concat("'", name, "' is undefined"));
    }
    for (const auto& kw : ca.kw)  // (not a structured binding: clang 14 cannot capture one)
      if (std::none_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == kw.first; }))
        throw EvalError(concat("macro '", m.text, "' takes no keyword argument '", kw.first, "'"));
    scopes_.push_back(std::move(frame));
    std::string out;
    try {
      out = capture(m.body);
    } catch (...) {
      scopes_.pop_back();
      throw;
    }
    scopes_.pop_back();
    return Value::string(out);
  }

  // ------------------------------------------------------------ expressions

  Value eval(const Expr& e) {
    try {
      const Level level(depth_, kMaxRenderDepth, kNesting);
      Meter::steps(1);
      return eval_inner(e);
    } catch (const EvalError& err) {
      fail(e.pos, err);
    }
  }

  CallArgs call_args(const Expr& e) {
    CallArgs ca;
    for (const auto& a : e.args) ca.pos.push_back(eval(*a));
    for (const auto& [k, a] : e.kwargs) {
      for (const auto& prev : ca.kw)
        if (prev.first == k) throw EvalError(concat("keyword argument repeated: ", k));
      ca.kw.emplace_back(k, eval(*a));
    }
    return ca;
  }

  Value eval_inner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::literal:
        return e.value;
      case K::name:
        return lookup(e.name);
      case K::list:
      case K::tuple: {
        std::vector<Value> items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::list(std::move(items), e.kind == K::tuple);
      }
      case K::dict: {
        auto d = std::make_shared<DictObj>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) d->set(eval(*e.args[i]), eval(*e.args[i + 1]));
        return Value::dict(d);
      }
      case K::attr:
        return get_attr(eval(*e.target), e.name);
      case K::item: {
        const Value obj = eval(*e.target);
        return get_item(obj, eval(*e.args[0]));
      }
      case K::slice: {
        // A slice among several subscripts (x[1:, 2]) is a slice object, which no index or key equals.
        if (!e.target) return Value::lazy({});
        const Value obj = eval(*e.target);
        const auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value::none(); };
        return get_slice(obj, part(0), part(1), part(2));
      }
      case K::call:
        return eval_call(e);
      case K::filter: {
        const Value v = eval(*e.target);
        auto ca = call_args(e);
        return apply_filter(e.name, v, ca);
      }
      case K::test: {
        const Value v = eval(*e.target);
        auto ca = call_args(e);
        return Value::boolean(apply_test(e.name, v, ca));
      }
      case K::neg:
        return negate(eval(*e.args[0]));
      case K::pos: {
        Value v = eval(*e.args[0]);
        if (!v.is_number()) throw EvalError(concat("bad operand type for unary +: '", type_name(v), "'"));
        return v.kind() == Value::Kind::boolean ? Value::integer(v.as_int()) : v;
      }
      case K::not_:
        return Value::boolean(!truthy(eval(*e.args[0])));
      case K::and_: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case K::or_: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case K::binary: {
        const Value a = eval(*e.args[0]);
        return binary_op(e.name, a, eval(*e.args[1]));
      }
      case K::compare:
        return eval_compare(e);
      case K::concat: {
        std::string out;
        for (const auto& a : e.args) out += to_str(eval(*a));
        return Value::string(out);
      }
      case K::cond:
        if (truthy(eval(*e.args[0]))) return eval(*e.target);
        return e.args.size() > 1 ? eval(*e.args[1]) : Value::undefined("the condition of an inline if was false");
    }
    return Value();
  }

  Value eval_call(const Expr& e) {
    const Value f = eval(*e.target);
    auto ca = call_args(e);
    if (f.is_undefined()) undefined_error(f);
    if (f.kind() != Value::Kind::function) throw EvalError(concat("'", type_name(f), "' object is not callable"));
    return f.function_obj().call(ca);
  }

  Value eval_compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1]);
      const auto& op = e.ops[i];
      bool r;
      if (op == "==")
        r = equal(left, right);
      else if (op == "!=")
        r = !equal(left, right);
      else if (op == "in")
        r = contains(right, left);
      else if (op == "not in")
        r = !contains(right, left);
      else {
        const int c = compare(left, right);
        r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      }
      if (!r) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }

  Meter meter_;  // first: active for everything the rendering makes
  std::vector<Scope> scopes_;
  std::string root_;
  int64_t root_chars_ = 0;  // code points of root_
  std::string* out_ = &root_;
  std::vector<std::pair<int64_t, int64_t>> generation_;
  int depth_ = 0;        // statements and expressions in progress
  int macro_depth_ = 0;  // macro calls in progress
};

void collect(const Expr* e, std::vector<std::string>& names) {
  if (!e) return;
  if (e->kind == Expr::Kind::name) names.push_back(e->name);
  for (const auto& a : e->args) collect(a.get(), names);
  for (const auto& kv : e->kwargs) collect(kv.second.get(), names);
  collect(e->target.get(), names);
}

void collect(const Body& body, std::vector<std::string>& names, bool& generation) {
  for (const auto& s : body) {
    generation = generation || s->kind == Stmt::Kind::generation;
    collect(s->expr.get(), names);
    collect(s->filter.get(), names);
    for (const auto& [test, b] : s->branches) {
      collect(test.get(), names);
      collect(b, names, generation);
    }
    for (const auto& p : s->params) collect(p.second.get(), names);
    collect(s->body, names, generation);
    collect(s->else_body, names, generation);
  }
}

// jinja2 refuses an unknown filter or test when compiling, except in the
// branches of an if or an inline if (its "soft" frames), where only using it
// fails; Anvil's unsupported ones count as unknown.
void check_names(const Expr* e, bool soft) {
  if (!e) return;
  soft = soft || e->kind == Expr::Kind::cond;
  if (e->kind == Expr::Kind::filter || e->kind == Expr::Kind::test) {
    const auto problem = e->kind == Expr::Kind::filter ? filter_problem(e->name) : test_problem(e->name);
    if (!problem.empty() && !soft) throw SyntaxError(located(e->pos, problem));
  }
  for (const auto& a : e->args) check_names(a.get(), soft);
  for (const auto& kv : e->kwargs) check_names(kv.second.get(), soft);
  check_names(e->target.get(), soft);
}

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::if_:
        for (const auto& [test, b] : s->branches) {
          check_names(test.get(), true);
          check_names(b, true);
        }
        check_names(s->else_body, true);
        break;
      case Stmt::Kind::for_:
        check_names(s->expr.get(), soft);
        check_names(s->filter.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, soft);
        break;
      default:  // a loop, macro, set or generation body is a frame of its own: not soft
        check_names(s->expr.get(), soft);
        check_names(s->filter.get(), false);
        for (const auto& p : s->params) check_names(p.second.get(), false);
        check_names(s->body, false);
    }
  }
}

}  // namespace

Template::Template(const std::string& source) : body_(parse(lex(source))) {
  check_names(body_, false);
  collect(body_, names_, has_generation_);
}

RenderResult Template::render(const std::vector<std::pair<std::string, Value>>& variables) const {
  return Renderer(variables).run(body_);
}

bool Template::uses(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

}  // namespace anvil::jinja
