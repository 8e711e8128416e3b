// A chat template is untrusted input (a model folder's
// tokenizer_config.json): templates that recurse, nest or loop without end
// end, within seconds, in an error naming the template's line and column and
// the limit reached (src/jinja/limits.h), never in a crash; templates
// that nest as real ones do render as before. docs/data.md, "Chat templates
// as written".
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "anvil/chat/chat.h"
#include "anvil/tokenizer/tokenizer.h"
#include "chat/hf.h"
#include "jinja/jinja.h"
#include "jinja/limits.h"
#include "test_util.h"

namespace anvil::jinja {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
using anvil::testing::write_text;
using json = nlohmann::ordered_json;
using chat::json_value;  // chat_hf.h: a JSON value as the engine sees it

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// What rendering `tmpl` with one user message raises ("(no error)" if
// nothing), after checking that it took seconds, not minutes.
std::string error_of(const std::string& tmpl) {
  const auto start = std::chrono::steady_clock::now();
  std::string what = "(no error)";
  try {
    Template(tmpl).render({{"messages", json_value(json::parse(R"([{"role": "user", "content": "hi"}])"))}});
  } catch (const Error& e) {
    what = e.what();
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took.count(), 20.0) << tmpl.substr(0, 200);
  return what;
}

std::string render(const std::string& tmpl) { return Template(tmpl).render({{"messages", Value::list({})}}).text; }

const char* const kSelfRecursive = "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}";

TEST(JinjaLimits, SelfRecursiveMacroStopsAtTheMacroDepth) {
  EXPECT_EQ(error_of(kSelfRecursive),
            "chat_template line 1, column 20: macro calls nested deeper than 128, the limit for chat templates");
  // Through arguments and defaults too.
  EXPECT_EQ(error_of("{% macro f(x=f()) %}{% endmacro %}{{ f() }}"),
            "chat_template line 1, column 14: macro calls nested deeper than 128, the limit for chat templates");
}

TEST(JinjaLimits, MutuallyRecursiveMacrosStopAtTheMacroDepth) {
  EXPECT_EQ(error_of("{% macro a(n) %}{{ b(n + 1) }}{% endmacro %}\n"
                     "{% macro b(n) %}{{ a(n + 1) }}{% endmacro %}\n"
                     "{{ a(0) }}"),
            "chat_template line 2, column 20: macro calls nested deeper than 128, the limit for chat templates");
}

TEST(JinjaLimits, NestedParenthesesStopAtTheExpressionDepth) {
  const std::string tmpl = "{{ " + repeat("(", 60000) + "1" + repeat(")", 60000) + " }}";
  // The 257th expression inside another: its opening parenthesis.
  EXPECT_EQ(error_of(tmpl),
            "chat_template line 1, column 260: expressions nested deeper than 256, the limit for chat templates");
  EXPECT_THROW(Template{tmpl}, SyntaxError);
}

TEST(JinjaLimits, EveryKindOfNestedExpressionStops) {
  const std::string limit = "expressions nested deeper than 256, the limit for chat templates";
  for (const std::string& tmpl : {
           "{{ " + repeat("[", 60000) + repeat("]", 60000) + " }}",
           "{{ " + repeat("{'k': ", 60000) + "1" + repeat("}", 60000) + " }}",
           "{{ " + repeat("-", 60000) + "1 }}",
           "{{ " + repeat("not ", 60000) + "1 }}",
           "{{ 1" + repeat(" + 1", 60000) + " }}",
           "{{ 1" + repeat(" or 1", 60000) + " }}",
           "{{ x" + repeat(".a", 60000) + " }}",
           "{{ x" + repeat("[0]", 60000) + " }}",
           "{{ x" + repeat("()", 60000) + " }}",
           "{{ x" + repeat(" | trim", 60000) + " }}",
           "{{ 1" + repeat(" if 1", 60000) + " }}",
           "{{ 1" + repeat(" if 1 else 1", 60000) + " }}",
           "{{ f(" + repeat("f(", 60000) + repeat(")", 60001) + " }}",
       }) {
    const auto e = error_of(tmpl);
    EXPECT_NE(e.find("chat_template line 1, column "), std::string::npos) << e;
    EXPECT_NE(e.find(limit), std::string::npos) << tmpl.substr(0, 40) << ": " << e;
  }
}

TEST(JinjaLimits, NestedIfBlocksStopAtTheBlockDepth) {
  const std::string tmpl = repeat("{% if true %}", 20000) + "x" + repeat("{% endif %}", 20000);
  // The 257th block's opening tag, where it ends.
  EXPECT_EQ(error_of(tmpl), "chat_template line 1, column " + std::to_string(13 * 256 + 12) +
                                ": blocks ({% if %}, {% for %}, ...) nested deeper than 256, the limit for chat "
                                "templates");
  const auto loops = error_of(repeat("{% for x in [1] %}", 20000) + repeat("{% endfor %}", 20000));
  EXPECT_NE(loops.find("nested deeper than 256"), std::string::npos) << loops;
}

// Macros deep in expressions: what is in progress at once while rendering is bounded as well.
TEST(JinjaLimits, RecursionThroughDeepExpressionsStopsAtTheRenderDepth) {
  const std::string tmpl = "{% macro f(n) %}{% if n > 0 %}{{ " + repeat("[", 40) + "f(n - 1)" + repeat("]", 40) +
                           " }}{% endif %}" + "{% endmacro %}{{ f(100) }}";
  const auto e = error_of(tmpl);
  EXPECT_NE(e.find("chat_template line 1, column "), std::string::npos) << e;
  EXPECT_NE(e.find("statements, expressions and macro calls nested deeper than 512, the limit for chat templates"),
            std::string::npos)
      << e;
}

TEST(JinjaLimits, LoopsAndOutputAreBounded) {
  const auto steps = error_of("{% for a in range(100000) %}\n{% for b in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(steps.find("chat_template line 2, column "), std::string::npos) << steps;
  EXPECT_NE(
      steps.find("more than 2000000 steps (statements, expressions, loop iterations and items visited), the limit "
                 "for chat templates"),
      std::string::npos)
      << steps;
  const auto output = error_of("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
  EXPECT_NE(output.find("chat_template line 1, column "), std::string::npos) << output;
  EXPECT_NE(output.find("longer than 67108864, the limit for chat templates"), std::string::npos) << output;
  const auto huge = error_of("{{ 'x' * 1000000000000 }}");
  EXPECT_EQ(huge,
            "chat_template line 1, column 8: a string or output of 1000000000000 bytes, longer than 67108864, "
            "the limit for chat templates");
  const auto text = error_of(
      "{% set ns = namespace(s='') %}{% for a in range(100000) %}{% set ns.s = ns.s ~ 'xxxxxxxxxx' %}{% endfor %}");
  EXPECT_NE(text.find("bytes of text in all"), std::string::npos) << text;
  EXPECT_NE(error_of("{{ 1 ** 1000000000000000000 }}{{ 2 ** 1000000000000000000 }}").find("integer overflow"),
            std::string::npos);
}

// Values cannot nest without end, nor contain themselves (a namespace is the only thing that changes).
TEST(JinjaLimits, ValuesStayFiniteAndAcyclic) {
  const auto deep = error_of(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}");
  EXPECT_NE(deep.find("lists, dicts and namespaces nested deeper than 128, the limit for chat templates"),
            std::string::npos)
      << deep;
  const auto cycle = error_of("{% set ns = namespace(x=1) %}\n  {% set ns.x = [ns] %}{{ ns }}");
  EXPECT_EQ(cycle,
            "chat_template line 2, column 6: ns.x: a namespace attribute cannot hold a list that is or holds a "
            "namespace, loop object or function (Anvil keeps a template's values from containing themselves)");
  EXPECT_NE(error_of("{% set a = namespace() %}{% set b = namespace(a=a) %}").find("namespace()."), std::string::npos);
  // A message nested deeper than the stack holds is refused before it is read.
  const std::string nested = repeat("[", 100000) + repeat("]", 100000);
  try {
    json_value(json::parse(nested));
    ADD_FAILURE() << "expected an error";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(),
                 "data.template hf: a message or the tools nest lists and objects deeper than 128, the limit for "
                 "chat templates");
  }
}

TEST(JinjaLimits, TemplatesNestedAsRealOnesAreStillRendered) {
  EXPECT_EQ(render(repeat("{% if true %}a", 20) + repeat("{% endif %}", 20)), repeat("a", 20));
  EXPECT_EQ(render("{% macro count(n) %}{% if n > 0 %}{{ n }} {{ count(n - 1) }}{% endif %}{% endmacro %}"
                   "{{ count(10) }}"),
            "10 9 8 7 6 5 4 3 2 1 ");
  EXPECT_EQ(render("{{ " + repeat("(", 100) + "1 + 2" + repeat(")", 100) + " }}"), "3");
  EXPECT_EQ(render("{{ " + repeat("[", 100) + repeat("]", 100) + " | length }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}"
                   "{{ ns.x | tojson | length }}"),
            "202");
  EXPECT_EQ(render("{% for a in range(300) %}{% for b in range(300) %}{% endfor %}{% endfor %}done"), "done");
  EXPECT_EQ(render("{% set ns = namespace(s='') %}{% for a in range(1000) %}{% set ns.s = ns.s ~ 'x' %}{% endfor %}"
                   "{{ ns.s | length }}"),
            "1000");
}

// The model folder of `anvil chat` with a template that recursed until the stack ran out: an
// error message and exit status 1, not a signal.
TEST(JinjaLimits, AnvilChatRefusesARecursiveTemplate) {
  TempDir dir;
  const auto folder = dir / "tok";
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(anvil::testing::source_dir() + "/fuzz/data/chatml-tokenizer.json",
                             folder / "tokenizer.json");
  const std::string chatml =
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const auto config = [&](const std::string& tmpl) {
    return json({{"eos_token", "<|im_end|>"}, {"chat_template", tmpl}}).dump();
  };
  write_text(folder / "tokenizer_config.json", config(chatml));
  json conv = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "hello"}}}}};
  write_text(dir / "convs.jsonl", conv.dump() + "\n" + conv.dump() + "\n");
  const auto train = [&](const std::string& out, std::string* log) {
    return run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                   " --config configs/quickstart.yaml --config configs/models/gpt2-debug.yaml output_dir=" +
                   (dir / out).string() + " tokenizer.type=auto tokenizer.path=" + folder.string() +
                   " 'data.train=[{path: " + (dir / "convs.jsonl").string() +
                   "}]' data.eval=null data.template=auto data.max_length=32 train.max_steps=1 "
                   "train.micro_batch_size=2 schedule.warmup_steps=0 train.threads=1 2>&1",
               log);
  };
  std::string out;
  ASSERT_EQ(train("run", &out), 0) << out;
  const auto ckpt = dir / "run" / "checkpoint-1";
  ASSERT_TRUE(std::filesystem::exists(ckpt / "tokenizer_config.json")) << out;
  auto saved = json::parse(anvil::testing::read_text(ckpt / "tokenizer_config.json"));
  saved["chat_template"] = kSelfRecursive;
  write_text(ckpt / "tokenizer_config.json", saved.dump());
  write_text(dir / "in.txt", "hello\n");
  const int rc = run(anvil::testing::cli_bin() + " chat --model " + ckpt.string() + " --max-new-tokens 2 < " +
                         (dir / "in.txt").string() + " 2>&1",
                     &out);
  EXPECT_GT(rc, 0) << out;
  EXPECT_LT(rc, 128) << out;  // 128 + a signal's number: the crash this guards against
  EXPECT_NE(out.find("chat_template line 1, column 20: macro calls nested deeper than 128"), std::string::npos) << out;
  // The trainer on such a folder stops the same way.
  write_text(folder / "tokenizer_config.json", config(kSelfRecursive));
  const int trained = train("run2", &out);
  EXPECT_GT(trained, 0) << out;
  EXPECT_LT(trained, 128) << out;
  EXPECT_NE(out.find("macro calls nested deeper than 128"), std::string::npos) << out;
}

}  // namespace
}  // namespace anvil::jinja
