// --dry-run starts every program a config names (PPO's reward programs and
// environment, ILQL's reward program) as the run would, asks it the line it
// would get for the first prompt, and stops it: a program that is not there,
// cannot run, exits, hangs or answers the wrong thing fails the dry run,
// naming the key, the command and what went wrong. Tiny models from scratch
// (no checkpoint needed).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

/// The trainer on `config` from the source folder, with a fresh tiny GPT-2 in place of its model.from.
int dry_run(const TempDir& dir, const std::string& config, const std::string& extra, std::string* log) {
  const auto cmd =
      "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() + " --config " + config +
      " output_dir=" + (dir / "out").string() +
      " model.from= model.family=gpt2 model.hidden_size=32 model.num_hidden_layers=1 model.num_attention_heads=2"
      " model.max_position_embeddings=32 tokenizer.path=data/tokenizer.model train.threads=1 --dry-run " +
      extra + " 2>&1";
  return run(cmd, log);
}

/// A Python program at dir/`name` with `body`; returns the command that runs it.
std::string program(const TempDir& dir, const std::string& name, const std::string& body) {
  anvil::testing::write_text(dir / name, "import json, sys, time\n" + body);
  return anvil::testing::python_bin() + " -u " + (dir / name).string();
}

bool has(const std::string& log, const std::string& s) { return log.find(s) != std::string::npos; }

TEST(DryRunPrograms, EveryRewardProgramIsStartedAskedAndStopped) {
  TempDir dir;
  const auto good = program(dir, "good.py",
                            "for line in sys.stdin:\n"
                            "  r = json.loads(line)\n"
                            "  open(sys.argv[0] + '.seen', 'a').write(line)\n"
                            "  print(json.dumps({'reward': 0.25}), flush=True)\n");
  const auto ppo = [&](const std::string& command, const std::string& extra, std::string* log) {
    return dry_run(dir, "configs/ppo_tiny.yaml",
                   "ppo.reward.exact_match= 'ppo.reward.command=" + command + "' " + extra, log);
  };
  std::string log;
  ASSERT_EQ(ppo(good, "", &log), 0) << log;
  EXPECT_TRUE(has(log, "program: ppo.reward.command \"" + good + "\" started, answered {\"reward\": 0.25} to " +
                           "data/sft_add_train.jsonl:1 with an empty reply and stopped"))
      << log;
  // It got the line a rollout sends: the record as written and the sample, with an empty completion.
  const auto seen = nlohmann::json::parse(anvil::testing::read_text(dir / "good.py.seen"));
  EXPECT_TRUE(seen.contains("prompt") && seen.contains("response")) << seen.dump();
  EXPECT_EQ(seen["sample"]["completion"], "") << seen.dump();
  EXPECT_EQ(seen["sample"]["ended"], true) << seen.dump();

  struct Bad {
    std::string command, extra, expected;
  };
  const auto missing = (dir / "no_such_program").string();
  anvil::testing::write_text(dir / "not_executable.sh", "echo '{\"reward\": 1}'\n");
  const std::vector<Bad> bad = {
      {missing, "", "exited with status 127 (the shell found no such program: check its name, path and PATH)"},
      {(dir / "not_executable.sh").string(), "",
       "exited with status 126 (the shell found the program but could not run it: is it executable?)"},
      {program(dir, "exits.py", "sys.stderr.write('reward: cannot load the judge\\n'); sys.exit(3)\n"), "",
       "exited with status 3"},
      {program(dir, "word.py", "for line in sys.stdin: print('fine', flush=True)\n"), "",
       "answered \"fine\"; expected a line {\"reward\": <finite number>}"},
      {program(dir, "no_reward.py", "for line in sys.stdin: print(json.dumps({'score': 1}), flush=True)\n"), "",
       "answered {\"score\":1}; expected a line {\"reward\": <finite number>}"},
      {program(dir, "slow.py", "for line in sys.stdin: time.sleep(30)\n"), "ppo.reward.timeout_s=1",
       "no answer within 1 s (ppo.reward.timeout_s)"},
  };
  for (const auto& b : bad) {
    EXPECT_NE(ppo(b.command, b.extra, &log), 0) << b.command;
    EXPECT_TRUE(has(log, "ppo.reward.command \"" + b.command + "\": ")) << b.command << "\n" << log;
    EXPECT_TRUE(has(log, b.expected)) << b.expected << "\n" << log;
    EXPECT_FALSE(has(log, "dry run: nothing is trained")) << log;  // no plan: the run's config is not sound
  }
  // The stderr of the one that exited is quoted.
  EXPECT_NE(ppo(bad[2].command, "", &log), 0);
  EXPECT_TRUE(has(log, "the end of its stderr:\nreward: cannot load the judge")) << log;

  // Each program of a list, named by its place in it.
  const auto list = "'ppo.rewards=[{exact_match: response}, {command: \"" + good + "\"}, {command: \"" + missing +
                    "\", name: judge}]'";
  EXPECT_NE(dry_run(dir, "configs/ppo_tiny.yaml", "ppo.reward.exact_match= " + list, &log), 0);
  EXPECT_TRUE(has(log, "ppo.rewards[2].command \"" + missing + "\": ")) << log;
  EXPECT_TRUE(has(log, "exited with status 127")) << log;
  // A field an exact-match reward compares with, missing from the records, is found too.
  EXPECT_NE(dry_run(dir, "configs/ppo_tiny.yaml", "ppo.reward.exact_match=answer", &log), 0);
  EXPECT_TRUE(has(log,
                  "data/sft_add_train.jsonl:1: ppo.reward.exact_match compares the response with field "
                  "\"answer\", which this record lacks"))
      << log;

  // ILQL's reward program scores its eval samples: asked with the first eval prompt.
  const auto ilql = [&](const std::string& command, std::string* out) {
    return dry_run(dir, "configs/ilql_tiny.yaml", "ilql.reward.exact_match= 'ilql.reward.command=" + command + "'",
                   out);
  };
  ASSERT_EQ(ilql(good, &log), 0) << log;
  EXPECT_TRUE(has(log, "program: ilql.reward.command \"" + good + "\" started, answered {\"reward\": 0.25} to " +
                           "data/ilql_eval.jsonl:1"))
      << log;
  EXPECT_NE(ilql(missing, &log), 0);
  EXPECT_TRUE(has(log, "ilql.reward.command \"" + missing + "\": ")) << log;
  EXPECT_TRUE(has(log, "exited with status 127")) << log;
}

TEST(DryRunPrograms, TheEnvironmentIsAskedTheFirstTurn) {
  TempDir dir;
  // Answers a tool message unless the turn is final; writes what it was sent.
  const auto env = program(dir, "env.py",
                           "for line in sys.stdin:\n"
                           "  open(sys.argv[0] + '.seen', 'a').write(line)\n"
                           "  e = json.loads(line)['episode']\n"
                           "  print(json.dumps({'done': True, 'reward': 1.0} if e['final'] else "
                           "{'role': 'tool', 'content': 'ok'}), flush=True)\n");
  const auto with_env = [&](const std::string& command, const std::string& extra, std::string* log) {
    return dry_run(dir, "configs/ppo_tiny.yaml", "'ppo.environment.command=" + command + "' " + extra, log);
  };
  std::string log;
  ASSERT_EQ(with_env(env, "ppo.max_turns=2", &log), 0) << log;
  EXPECT_TRUE(has(log, "program: ppo.environment.command \"" + env +
                           "\" started, answered a tool message to turn 1 of data/sft_add_train.jsonl:1 (an empty "
                           "reply, final false) and stopped"))
      << log;
  const auto seen = nlohmann::json::parse(anvil::testing::read_text(dir / "env.py.seen"));
  EXPECT_EQ(seen["episode"]["turn"], 1) << seen.dump();
  EXPECT_EQ(seen["episode"]["ended"], true) << seen.dump();
  ASSERT_EQ(seen["episode"]["messages"].size(), 2u) << seen.dump();
  EXPECT_EQ(seen["episode"]["messages"][0]["content"], seen["prompt"]) << seen.dump();
  EXPECT_EQ(seen["episode"]["messages"][1], nlohmann::json({{"role", "assistant"}, {"content", ""}}));
  // One turn: the first turn is the last, so the answer must end the episode.
  ASSERT_EQ(with_env(env, "ppo.max_turns=1", &log), 0) << log;
  EXPECT_TRUE(has(log,
                  "answered done with reward 1 to turn 1 of data/sft_add_train.jsonl:1 (an empty reply, final "
                  "true)"))
      << log;
  const auto chatty = program(dir, "chatty.py",
                              "for line in sys.stdin: print(json.dumps({'role': 'tool', 'content': 'ok'}), "
                              "flush=True)\n");
  EXPECT_NE(with_env(chatty, "ppo.max_turns=1", &log), 0);
  EXPECT_TRUE(has(log, "ppo.environment.command \"" + chatty +
                           "\": answered {\"content\":\"ok\",\"role\":\"tool\"} "
                           "(no more turns may be taken)"))
      << log;
  const auto missing = (dir / "no_such_env").string();
  EXPECT_NE(with_env(missing, "", &log), 0);
  EXPECT_TRUE(has(log, "ppo.environment.command \"" + missing + "\": ")) << log;
  EXPECT_TRUE(has(log, "exited with status 127")) << log;
}

}  // namespace
}  // namespace anvil::train
