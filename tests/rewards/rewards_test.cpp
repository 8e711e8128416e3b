// Reward sources behind one interface (anvil/rewards/rewards.h): exact
// match, regex, registered functions, reward programs, their weighted sums,
// and the errors that name the key and the record.
#include <gtest/gtest.h>

#include <fstream>

#include "anvil/core/error.h"
#include "anvil/rewards/rewards.h"
#include "anvil/tokenizer/tokenizer.h"
#include "rewards/reward_program.h"
#include "test_util.h"

namespace anvil::rewards {
namespace {

using anvil::testing::TempDir;

// ---- the sources -----------------------------------------------------------------

chat::PromptSample at_line(const std::string& where) {
  chat::PromptSample s;
  s.where = where;
  return s;
}

std::vector<double> lengths(const std::vector<RewardQuery>& qs) {
  std::vector<double> out;
  for (const auto& q : qs) out.push_back(static_cast<double>(q.response.size()) + (q.ended ? 0.5 : 0.0));
  return out;
}

// exact_match, regex and function answer through the one interface; a
// section that sets none makes no source.
TEST(RewardSources, ExactMatchRegexAndFunctionScoreThroughOneInterface) {
  const std::vector<RewardQuery> queries = {{"add: 1+2\n", " 3 \n", {{"answer", "3"}, {"pattern", "^ ?[0-9]+$"}}, true},
                                            {"add: 2+2\n", "four", {{"answer", 4}, {"pattern", "[0-9]"}}, false},
                                            {"add: 2+2\n", "4", {{"answer", 4}, {"pattern", "^4"}}, true}};
  const auto a = at_line("t.jsonl:1"), b = at_line("t.jsonl:2"), c = at_line("t.jsonl:3");
  const std::vector<const chat::PromptSample*> prompts{&a, &b, &c};

  SourceConfig cfg;
  cfg.exact_match = "answer";
  auto exact = make_reward_source(cfg, "ppo.reward");
  ASSERT_NE(exact, nullptr);
  EXPECT_EQ(exact->kind(), "exact_match");
  // Both sides trimmed; a number field compared as JSON writes it.
  EXPECT_EQ(exact->score(prompts, queries), (std::vector<double>{1, 0, 1}));

  cfg = {};
  cfg.regex = "pattern";
  auto regex = make_reward_source(cfg, "ppo.reward");
  EXPECT_EQ(regex->kind(), "regex");
  EXPECT_EQ(regex->score(prompts, queries), (std::vector<double>{0, 0, 1}));  // "$" before " \n" fails

  register_reward_function("rewards_test_lengths", lengths);
  cfg = {};
  cfg.function = "rewards_test_lengths";
  auto fn = make_reward_source(cfg, "ppo.reward");
  EXPECT_EQ(fn->kind(), "function");
  EXPECT_EQ(fn->score(prompts, queries), (std::vector<double>{4.5, 4, 1.5}));

  EXPECT_EQ(make_reward_source({}, "ilql.reward"), nullptr);
  // A reward model or a program is loaded or started by prepare(), not before.
  cfg = {};
  cfg.model = "/nonexistent/reward-model";
  auto model = make_reward_source(cfg, "ppo.reward");
  EXPECT_EQ(model->kind(), "model");
  EXPECT_THROW(model->score(prompts, queries), Error);
  cfg = {};
  cfg.command = "cat";
  EXPECT_EQ(make_reward_source(cfg, "ppo.reward")->kind(), "command");
}

// ppo.rewards: the score is the weighted sum; each source's own rewards are
// kept under its name.
TEST(RewardSources, WeightedSourcesSumAndKeepEachSourcesRewards) {
  register_reward_function("rewards_test_weighted", lengths);
  std::vector<WeightedSourceConfig> list(2);
  list[0].exact_match = "answer";
  list[0].weight = 2;
  list[1].function = "rewards_test_weighted";
  list[1].weight = 0.5;
  list[1].name = "length";
  ResponseRewards r({}, "ppo.reward", list, "ppo.rewards", true);
  EXPECT_TRUE(r.enabled());
  EXPECT_FALSE(r.is_exact_match());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"exact_match_0", "length"}));
  r.prepare({}, "test");
  const auto tok = tokenizer::load_tokenizer("auto", anvil::testing::source_dir() + "/data/tokenizer.model");
  auto a = at_line("t.jsonl:1"), b = at_line("t.jsonl:2");
  a.record = {{"answer", "13"}};
  b.record = {{"answer", "7"}};
  std::vector<std::vector<double>> parts;
  const auto scores = r.score({&a, &b}, {tok->encode("13"), tok->encode("70")}, {true, false}, *tok, &parts);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], (std::vector<double>{1, 0}));
  EXPECT_EQ(parts[1], (std::vector<double>{2.5, 2}));
  EXPECT_EQ(scores, (std::vector<double>{2 * 1 + 0.5 * 2.5, 0.5 * 2}));
  EXPECT_EQ(r.gathered().size(), 2u);  // nothing sharded: empty holds

  // One unnamed source keeps no components, and is the exact-match one eval/exact_match reports.
  SourceConfig one;
  one.exact_match = "answer";
  ResponseRewards single(one, "ppo.reward", true);
  EXPECT_TRUE(single.is_exact_match());
  EXPECT_TRUE(single.names().empty());
  single.score({&a}, {tok->encode("13")}, {true}, *tok, &parts);
  EXPECT_TRUE(parts.empty());
  EXPECT_FALSE(ResponseRewards({}, "ilql.reward", false).enabled());
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// Errors name the key (and for a record, its file:line).
TEST(RewardSources, ErrorsNameTheKeyAndTheRecord) {
  SourceConfig two;
  two.exact_match = "answer";
  two.regex = "pattern";
  EXPECT_EQ(config_error([&] { make_reward_source(two, "ppo.rewards[1]"); }),
            "ppo.rewards[1]: expected at most one of model, command, exact_match, regex or function, got 2");
  EXPECT_EQ(config_error([&] { ResponseRewards({}, "ppo.reward", true); }),
            "ppo.reward: expected exactly one of model, command, exact_match, regex or function, got 0");
  SourceConfig unknown;
  unknown.function = "rewards_test_nobody";
  EXPECT_NE(config_error([&] {
              make_reward_source(unknown, "ilql.reward");
            }).find("ilql.reward.function: no reward function \"rewards_test_nobody\" is registered"),
            std::string::npos);
  std::vector<WeightedSourceConfig> same(2);
  same[0].exact_match = same[1].exact_match = "answer";
  same[0].name = same[1].name = "match";
  EXPECT_EQ(config_error([&] { ResponseRewards({}, "ppo.reward", same, "ppo.rewards", true); }),
            "ppo.rewards[1].name: \"match\" is also ppo.rewards[0]'s; each source needs its own");
  EXPECT_THROW(register_reward_function("", lengths), ConfigError);
  register_reward_function("rewards_test_twice", lengths);
  EXPECT_THROW(register_reward_function("rewards_test_twice", lengths), ConfigError);

  const auto b = at_line("t.jsonl:2");
  const std::vector<RewardQuery> lacking = {{"p", "3", {{"other", 1}}, true}};
  SourceConfig exact;
  exact.exact_match = "answer";
  try {
    make_reward_source(exact, "ppo.reward")->score({&b}, lacking);
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "t.jsonl:2: ppo.reward.exact_match compares the response with field \"answer\", which this record "
              "lacks");
  }
  SourceConfig regex;
  regex.regex = "pattern";
  try {
    make_reward_source(regex, "ppo.reward")->score({&b}, {{"p", "3", {{"pattern", "(["}}, true}});
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("t.jsonl:2: ppo.reward.regex: field \"pattern\" holds \"([\", which is not a "
                                         "valid regular expression"),
              std::string::npos)
        << e.what();
  }
  register_reward_function("rewards_test_short", [](const std::vector<RewardQuery>&) { return std::vector<double>{}; });
  SourceConfig short_fn;
  short_fn.function = "rewards_test_short";
  try {
    make_reward_source(short_fn, "ppo.reward")->score({&b}, lacking);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "ppo.reward.function \"rewards_test_short\" returned 0 rewards for 1 responses");
  }
}

// ---- the reward program ------------------------------------------------------------

std::string py(const std::string& code) { return anvil::testing::python_bin() + " -u -c '" + code + "'"; }

TEST(RewardProgram, RoundTripsRecordsInOrder) {
  RewardProgram p(py("import json,sys\n"
                     "for l in sys.stdin:\n"
                     "  r = json.loads(l)\n"
                     "  print(json.dumps({\"reward\": len(r[\"response\"]) + r.get(\"bonus\", 0)}))"),
                  30);
  const auto out =
      p.score({{{"prompt", "p"}, {"response", "abc"}}, {{"prompt", "q"}, {"response", ""}, {"bonus", 2.5}}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], 3.0);
  EXPECT_EQ(out[1], 2.5);
  EXPECT_EQ(p.score({{{"prompt", "p"}, {"response", "xy"}}}).at(0), 2.0);  // still alive
}

// A reward program gets the record as written, and the sample in an object of
// its own: a record's `response` (a reference answer) and `prompt` survive.
TEST(RewardProgram, GetsTheRecordAsWrittenAndTheSampleUnderItsOwnNames) {
  TempDir dir;
  const auto seen = (dir / "seen.jsonl").string();
  SourceConfig c;
  c.command =
      py("import json,sys\n"
         "out = open(\"" +
         seen +
         "\", \"a\")\n"
         "for l in sys.stdin:\n"
         "  r = json.loads(l)\n"
         "  out.write(l); out.flush()\n"
         "  s = r[\"sample\"]\n"
         "  print(json.dumps({\"reward\": float(s[\"completion\"].strip() == r.get(\"answer\", r[\"response\"]))}))");
  c.timeout_s = 30;
  ResponseRewards rewards(c, "ppo.reward", true);
  rewards.prepare({}, "test");
  const auto tok = tokenizer::load_tokenizer("auto", anvil::testing::source_dir() + "/data/tokenizer.model");
  chat::PromptSample text, chat;
  text.prompt = "add: 1+2\n";
  text.record = {{"prompt", "add: 1+2\n"}, {"response", "3"}, {"id", 7}};
  text.where = "a.jsonl:1";
  chat.prompt = "be brief\nsay yo";
  chat.messages = {{"system", "be brief"}, {"user", "say yo"}};
  chat.record = {
      {"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "say yo"}}}},
      {"answer", "yo"}};
  chat.where = "b.jsonl:4";
  const auto scores = rewards.score({&text, &chat, &text}, {tok->encode("3"), tok->encode("yo"), tok->encode("4")},
                                    {true, false, true}, *tok);
  EXPECT_EQ(scores, (std::vector<double>{1.0, 1.0, 0.0}));
  std::ifstream in(seen);
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["response"], "3");  // the record's own field, not the sample
  EXPECT_EQ(lines[0]["prompt"], "add: 1+2\n");
  EXPECT_EQ(lines[0]["id"], 7);
  EXPECT_EQ(lines[0]["sample"], nlohmann::json({{"completion", "3"}, {"prompt_text", "add: 1+2\n"}, {"ended", true}}));
  EXPECT_EQ(lines[2]["response"], "3");
  EXPECT_EQ(lines[2]["sample"]["completion"], "4");
  EXPECT_EQ(lines[1]["messages"], chat.record["messages"]);  // a conversation as written
  EXPECT_EQ(lines[1]["sample"],
            nlohmann::json({{"completion", "yo"}, {"prompt_text", "be brief\nsay yo"}, {"ended", false}}));
  // Where the record has neither, `prompt` and `response` are the prompt's text and the sample.
  EXPECT_EQ(lines[1]["prompt"], "be brief\nsay yo");
  EXPECT_EQ(lines[1]["response"], "yo");
  // A record that already uses one of the sample's names is refused, naming its line.
  chat::PromptSample clash = text;
  clash.record["sample"] = "x";
  try {
    rewards.score({&clash}, {tok->encode("3")}, {true}, *tok);
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("a.jsonl:1: the record has a field \"sample\", which ppo.reward.command"),
              std::string::npos)
        << e.what();
  }
}

std::string error_of(const std::string& program, double timeout_s) {
  try {
    RewardProgram p(program, timeout_s);
    p.score({{{"prompt", "p1"}, {"response", "first"}}, {{"prompt", "p2"}, {"response", "second"}}});
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RewardProgram, ACrashAMalformedReplyAndATimeoutNameTheCommandAndTheRecord) {
  // Answers the first record, then dies.
  auto e = error_of(py("import sys\nsys.stdin.readline()\nprint(\"{\\\"reward\\\": 1}\")\nsys.exit(3)"), 30);
  EXPECT_NE(e.find("ppo.reward.command"), std::string::npos) << e;
  EXPECT_NE(e.find("exited with status 3"), std::string::npos) << e;
  EXPECT_NE(e.find("\"second\""), std::string::npos) << e;
  e = error_of(py("import sys\nfor l in sys.stdin: print(\"ok\")"), 30);
  EXPECT_NE(e.find("answered \"ok\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"first\""), std::string::npos) << e;
  e = error_of(py("import sys\nfor l in sys.stdin: print(\"{\\\"score\\\": 1}\")"), 30);
  EXPECT_NE(e.find("expected a line {\"reward\": <finite number>}"), std::string::npos) << e;
  e = error_of(py("import sys,time\nfor l in sys.stdin: time.sleep(30)"), 0.5);
  EXPECT_NE(e.find("no answer within 0.5 s"), std::string::npos) << e;
  EXPECT_NE(e.find("\"first\""), std::string::npos) << e;
  e = error_of("/nonexistent/reward-program", 30);
  EXPECT_NE(e.find("exited with status 127"), std::string::npos) << e;
}

}  // namespace
}  // namespace anvil::rewards
