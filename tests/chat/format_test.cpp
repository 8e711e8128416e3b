// One chat rendering everywhere (docs/data.md, "Chat templates"): a run
// records its format as tokenizer_config.json's chat_template, and the ids
// the trainer trains on, the prompts `anvil chat`, `generate --chat` and
// `score` feed the model, and transformers' apply_chat_template on the
// exported folder are the same, for every built-in template.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "rewards/reward_model.h"
#include "anvil/tokenizer/tokenizer.h"
#include "test_util.h"

namespace anvil::chat {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::read_text;
using anvil::testing::run;
using anvil::testing::TempDir;
using anvil::testing::write_text;
using data::ReadOptions;
using data::SftDataset;
using nlohmann::json;

std::string in_source(const std::string& cmd) { return "cd " + anvil::testing::source_dir() + " && " + cmd; }

/// The ids the chat tools printed with --show-prompt-ids, in order.
std::vector<std::vector<int64_t>> shown_prompts(const std::string& log) {
  std::vector<std::vector<int64_t>> out;
  const std::string tag = "prompt ids: ";
  for (size_t pos = 0; (pos = log.find(tag, pos)) != std::string::npos;) {
    const auto end = log.find('\n', pos);
    out.push_back(json::parse(log.substr(pos + tag.size(), end - pos - tag.size())).get<std::vector<int64_t>>());
    pos = end;
  }
  return out;
}

/// transformers on an exported folder: a header line, then one line per conversation.
std::vector<json> transformers_view(const stdfs::path& folder, const stdfs::path& convs, json* header) {
  std::string out;
  EXPECT_EQ(run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                    "/tests/parity/chat_in_transformers.py " + folder.string() + " " + convs.string() + " 2>/dev/null",
                &out),
            0)
      << out;
  std::vector<json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') lines.push_back(json::parse(line));
  if (lines.empty()) return lines;
  *header = lines.front();
  lines.erase(lines.begin());
  return lines;
}

std::string conversation(const std::vector<std::pair<std::string, std::string>>& turns) {
  json msgs = json::array();
  for (const auto& [role, content] : turns) msgs.push_back({{"role", role}, {"content", content}});
  return json({{"messages", msgs}}).dump() + "\n";
}

/// dir/refs/tok: a byte-level BPE tokenizer with every template's markers
/// (</s> is EOS), from tests/parity/make_chat_references.py.
::testing::AssertionResult make_refs(const TempDir& dir) {
  std::string out;
  const int rc = run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                         "/tests/parity/make_chat_references.py " + (dir / "refs").string() + " 2>&1",
                     &out);
  if (rc == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << out;
}

// Each single-turn conversation's first user line is also what `anvil chat`
// gets on stdin (with --system for the system turn).
struct Chat {
  std::string system, user;
};

TEST(ChatFormat, TrainerChatAndTransformersAgreeOnTheExportedFolderForEveryTemplate) {
  TempDir dir;
  std::string out;
  ASSERT_TRUE(make_refs(dir));
  const std::vector<Chat> chats = {
      {"", "What is 2+2?"}, {"You are terse.", "Name a colour."}, {"", "Zähle: 1, 22, 333, 4444"}};
  std::string convs =
      conversation({{"user", "What is 2+2?"}, {"assistant", "4"}}) +
      conversation({{"system", "You are terse."}, {"user", "Name a colour."}, {"assistant", " Blue, like the sky. "}}) +
      conversation({{"user", "Zähle: 1, 22, 333, 4444"}, {"assistant", "I'm counting: 10000!"}}) +
      // multi-turn, and a user turn that already ends its line
      conversation({{"user", "Name a colour."},
                    {"assistant", "Blue"},
                    {"user", "Another one?\n"},
                    {"assistant", "Grün — ein schönes Wort 🌿"}});
  write_text(dir / "convs.jsonl", convs);

  for (const std::string name : ChatTemplate::names()) {
    SCOPED_TRACE(name);
    // One training step with this template, then export the checkpoint.
    const auto run_dir = dir / ("run-" + name);
    ASSERT_EQ(run(in_source(anvil::testing::trainer_bin() +
                            " --config configs/quickstart.yaml --config configs/models/gpt2-debug.yaml output_dir=" +
                            run_dir.string() + " tokenizer.type=auto tokenizer.path=" +
                            (dir / "refs" / "tok").string() + " 'data.train=[{path: " + (dir / "convs.jsonl").string() +
                            "}]' data.eval=null data.template=" + name +
                            " data.max_length=64 train.max_steps=1 train.micro_batch_size=2 "
                            "schedule.warmup_steps=0 train.threads=1 logging.level=warn"),
                  &out),
              0)
        << out;
    const auto ckpt = run_dir / "checkpoint-1";
    const auto exported = dir / ("export-" + name);
    ASSERT_EQ(
        run(anvil::testing::cli_bin() + " export --checkpoint " + ckpt.string() + " --output " + exported.string(),
            &out),
        0)
        << out;

    // The folder records the format; Anvil reads it back as this template.
    auto tok = tokenizer::load_tokenizer_from_model_dir(exported);
    EXPECT_EQ(tok->chat_template(), ChatTemplate::get(name).jinja(*tok));
    EXPECT_EQ(resolve_chat_template(*tok, "auto", "--template", exported.string(), "--force-template"), name);

    // The trainer's ids and trained tokens (data.template: auto on this folder).
    ReadOptions o;
    o.chat = &ChatTemplate::get(name);
    const auto ds = SftDataset::load(dir / "convs.jsonl", *tok, o);
    ASSERT_EQ(ds.size(), 4);

    // transformers' apply_chat_template with the folder's own chat_template.
    json header;
    const auto hf = transformers_view(exported, dir / "convs.jsonl", &header);
    ASSERT_EQ(hf.size(), 4u) << header.dump();
    EXPECT_TRUE(header["has_chat_template"].get<bool>()) << header.dump();
    EXPECT_TRUE(header["is_fast"].get<bool>()) << header.dump();
    for (size_t i = 0; i < hf.size(); ++i) {
      SCOPED_TRACE("conversation " + std::to_string(i));
      EXPECT_EQ(ds[static_cast<int64_t>(i)].input_ids, hf[i]["ids"].get<std::vector<int64_t>>());
      std::vector<int64_t> mask;
      for (auto l : ds[static_cast<int64_t>(i)].labels) mask.push_back(l != kIgnoreIndex);
      EXPECT_EQ(mask, hf[i]["mask"].get<std::vector<int64_t>>());
      const auto& ids = ds[static_cast<int64_t>(i)].input_ids;
      EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.begin() + ds[static_cast<int64_t>(i)].prompt_tokens),
                hf[i]["prompt_ids"].get<std::vector<int64_t>>());
    }

    // plain and chatml render a tool message (what a ppo.environment appends) as their Jinja does in
    // transformers, through the whole conversation and the generation prompt after the message.
    if (name == "plain" || name == "chatml") {
      write_text(
          dir / "tool.jsonl",
          conversation({{"user", "add: 123+456"}, {"assistant", "123+456"}, {"tool", "579"}, {"assistant", "579"}}));
      const auto tool_ds = SftDataset::load(dir / "tool.jsonl", *tok, o);
      json tool_header;
      const auto tool_hf = transformers_view(exported, dir / "tool.jsonl", &tool_header);
      ASSERT_EQ(tool_ds.size(), 1);
      ASSERT_EQ(tool_hf.size(), 1u) << tool_header.dump();
      EXPECT_EQ(tool_ds[0].input_ids, tool_hf[0]["ids"].get<std::vector<int64_t>>());
      std::vector<int64_t> tool_mask;
      for (auto l : tool_ds[0].labels) tool_mask.push_back(l != kIgnoreIndex);
      EXPECT_EQ(tool_mask, tool_hf[0]["mask"].get<std::vector<int64_t>>());
      const std::vector<Message> upto = {{"user", "add: 123+456"}, {"assistant", "123+456"}, {"tool", "579"}};
      std::string gen_out;
      json gen = {{"messages", json::array()}};
      for (const auto& m : upto) gen["messages"].push_back({{"role", m.role}, {"content", m.content}});
      write_text(dir / "tool_prompt.py",
                 "import json,sys\nfrom transformers import AutoTokenizer\n"
                 "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
                 "print(json.dumps(list(t.apply_chat_template(json.loads(sys.argv[2]), tokenize=True, "
                 "add_generation_prompt=True, return_dict=True)[\"input_ids\"])))\n");
      ASSERT_EQ(run(anvil::testing::python_bin() + " " + (dir / "tool_prompt.py").string() + " " + exported.string() +
                        " '" + gen["messages"].dump() + "' 2>/dev/null",
                    &gen_out),
                0)
          << gen_out;
      EXPECT_EQ(ChatTemplate::get(name).encode_prompt(*tok, upto),
                json::parse(gen_out.substr(gen_out.rfind('['))).get<std::vector<int64_t>>());
    }

    // anvil chat and generate --chat on the folder (no --template): the same prompts.
    for (size_t i = 0; i < chats.size(); ++i) {
      SCOPED_TRACE("chat " + std::to_string(i));
      const auto sys = chats[i].system.empty() ? std::string() : " --system '" + chats[i].system + "'";
      write_text(dir / "in.txt", chats[i].user + "\n");
      ASSERT_EQ(run(anvil::testing::cli_bin() + " chat --model " + exported.string() +
                        " --no-history --show-prompt-ids --max-new-tokens 1" + sys + " < " + (dir / "in.txt").string(),
                    &out),
                0)
          << out;
      auto shown = shown_prompts(out);
      ASSERT_EQ(shown.size(), 1u) << out;
      EXPECT_EQ(shown[0], hf[i]["prompt_ids"].get<std::vector<int64_t>>());
      ASSERT_EQ(run(anvil::testing::cli_bin() + " generate --chat --model " + exported.string() + " --prompt '" +
                        chats[i].user + "' --show-prompt-ids --max-new-tokens 1" + sys,
                    &out),
                0)
          << out;
      shown = shown_prompts(out);
      ASSERT_EQ(shown.size(), 1u) << out;
      EXPECT_EQ(shown[0], hf[i]["prompt_ids"].get<std::vector<int64_t>>());
    }

    // A --template that contradicts the folder is an error; --force-template insists.
    const std::string other = name == "chatml" ? "oasst" : "chatml";
    write_text(dir / "in.txt", "hi\n");
    EXPECT_EQ(run(anvil::testing::cli_bin() + " chat --model " + exported.string() + " --template " + other +
                      " --max-new-tokens 1 < " + (dir / "in.txt").string(),
                  &out),
              2);
    EXPECT_NE(out.find("error: --template " + other + " contradicts " + exported.string() + ", which records the " +
                       name + " chat format (tokenizer_config.json's chat_template); leave --template out to use " +
                       name + ", or add --force-template to use " + other + " anyway"),
              std::string::npos)
        << out;
    EXPECT_EQ(run(anvil::testing::cli_bin() + " chat --model " + exported.string() + " --template " + other +
                      " --force-template --max-new-tokens 1 < " + (dir / "in.txt").string(),
                  &out),
              0)
        << out;
  }
}

TEST(ChatFormat, RewardModelsAreScoredInTheFormatTheyWereTrainedIn) {
  TempDir dir;
  std::string out;
  ASSERT_TRUE(make_refs(dir));
  write_text(dir / "pref.jsonl",
             "{\"prompt\": \"What is 2+2?\", \"chosen\": \"4\", \"rejected\": \"5\"}\n"
             "{\"prompt\": [{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", "
             "\"content\": \"Name a colour.\"}], \"chosen\": \"Blue\", \"rejected\": \"I do not know\"}\n");
  ASSERT_EQ(
      run(in_source(
              anvil::testing::trainer_bin() +
              " --config configs/rm_tiny.yaml --config configs/models/gpt2-debug.yaml model.from=null "
              "output_dir=" +
              (dir / "rm").string() + " tokenizer.type=auto tokenizer.path=" + (dir / "refs" / "tok").string() +
              " 'data.train=[{path: " + (dir / "pref.jsonl").string() +
              "}]' data.eval=null data.template=chatml data.max_length=64 train.max_steps=1 train.micro_batch_size=2 "
              "schedule.warmup_steps=0 train.threads=1 logging.level=warn"),
          &out),
      0)
      << out;
  const auto ckpt = dir / "rm" / "checkpoint-1";
  // No --template: the checkpoint's chatml, prompts rendered as in training.
  ASSERT_EQ(run(anvil::testing::cli_bin() + " score --model " + ckpt.string() + " --input " +
                    (dir / "pref.jsonl").string() + " --show-prompt-ids",
                &out),
            0)
      << out;
  const auto shown = shown_prompts(out);
  ASSERT_EQ(shown.size(), 2u) << out;
  std::vector<std::vector<double>> cli_rewards;
  {
    std::istringstream lines(out);
    std::string l;
    while (std::getline(lines, l))
      if (!l.empty() && l[0] == '{') cli_rewards.push_back(json::parse(l)["rewards"].get<std::vector<double>>());
  }
  ASSERT_EQ(cli_rewards.size(), 2u) << out;
  // The library call anvil score makes gives the same rewards.
  const auto rm = rewards::RewardModel::load(ckpt);
  EXPECT_EQ(rm.chat_template().name(), "chatml");
  const auto lib =
      rm.score({rm.encode({{"user", "What is 2+2?"}}, true, "4"), rm.encode({{"user", "What is 2+2?"}}, true, "5")});
  ASSERT_EQ(lib.size(), 2u);
  EXPECT_NEAR(lib[0], cli_rewards[0][0], 1e-6);
  EXPECT_NEAR(lib[1], cli_rewards[0][1], 1e-6);
  write_text(dir / "convs.jsonl",
             conversation({{"user", "What is 2+2?"}, {"assistant", "4"}}) +
                 conversation({{"system", "You are terse."}, {"user", "Name a colour."}, {"assistant", "Blue"}}));
  json header;
  const auto hf = transformers_view(ckpt, dir / "convs.jsonl", &header);
  ASSERT_EQ(hf.size(), 2u);
  EXPECT_EQ(shown[0], hf[0]["prompt_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(shown[1], hf[1]["prompt_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(run(anvil::testing::cli_bin() + " score --model " + ckpt.string() + " --input " +
                    (dir / "pref.jsonl").string() + " --template plain",
                &out),
            2);
  EXPECT_NE(out.find("--template plain contradicts"), std::string::npos) << out;
}

TEST(ChatFormat, HfFolderWithItsOwnJinjaTemplateIsRenderedAsWritten) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  const auto tokdir = dir / "refs" / "tok";
  auto cfg = json::parse(read_text(tokdir / "tokenizer_config.json"));
  cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
  write_text(tokdir / "tokenizer_config.json", cfg.dump());
  auto tok = tokenizer::load_tokenizer("auto", tokdir);
  EXPECT_EQ(recorded_chat_format(*tok).kind, RecordedChatFormat::Kind::custom);
  // auto renders it as written (tests/chat/template_hf_test.cpp), as does hf.
  EXPECT_EQ(resolve_chat_template(*tok, "auto", "data.template", tokdir.string(), ""), "hf");
  EXPECT_EQ(resolve_chat_template(*tok, "hf", "data.template", tokdir.string(), ""), "hf");
  EXPECT_EQ(ChatTemplate::get("hf").encode_prompt(*tok, {{"user", "ab"}, {"assistant", "c"}}), tok->encode("abc"));
  // Naming a built-in format is an explicit choice, and what the run's checkpoints record.
  EXPECT_EQ(resolve_chat_template(*tok, "chatml", "data.template", tokdir.string(), ""), "chatml");
  // A tokenizer that records nothing: plain.
  const auto sp = tokenizer::load_tokenizer("auto", anvil::testing::source_dir() + "/data/tokenizer.model");
  EXPECT_EQ(resolve_chat_template(*sp, "auto", "data.template", "data", ""), "plain");
}

// The issue this closes: the quickstart model (trained on {"prompt": "upper:
// apple\n", ...}) scored 0 on the same eval written as messages, and chat
// answered differently from generate. Needs the quickstart fixture.
TEST(ChatFormatOnQuickstart, MessagesTextChatAndTransformersGiveTheSamePrompt) {
  const auto run_dir = anvil::testing::fixture_dir() / "quickstart-sft";
  const auto ckpt = run_dir / "checkpoint-1500";
  ASSERT_TRUE(stdfs::exists(ckpt)) << ckpt;
  TempDir dir;
  std::string out;
  // The checkpoint records plain, and its SentencePiece export loads in AutoTokenizer.
  const auto exported = dir / "export";
  ASSERT_EQ(
      run(anvil::testing::cli_bin() + " export --checkpoint " + ckpt.string() + " --output " + exported.string(), &out),
      0)
      << out;
  auto tok = tokenizer::load_tokenizer_from_model_dir(exported);
  EXPECT_EQ(recorded_chat_format(*tok).name, "plain");

  // The first 100 eval lines as text and as messages (user turn without its newline).
  std::ifstream in(anvil::testing::source_dir() + "/data/sft_eval.jsonl");
  std::string line, text, msgs;
  for (int i = 0; i < 100 && std::getline(in, line); ++i) {
    const auto j = json::parse(line);
    text += line + "\n";
    auto prompt = j["prompt"].get<std::string>();
    ASSERT_EQ(prompt.back(), '\n');
    prompt.pop_back();
    msgs += conversation({{"user", prompt}, {"assistant", j["response"].get<std::string>()}});
  }
  write_text(dir / "text.jsonl", text);
  write_text(dir / "msgs.jsonl", msgs);
  ReadOptions o;
  o.chat = &chat::ChatTemplate::get("plain");
  const auto a = SftDataset::load(dir / "text.jsonl", *tok, o);
  const auto b = SftDataset::load(dir / "msgs.jsonl", *tok, o);
  ASSERT_EQ(a.size(), 100);
  ASSERT_EQ(b.size(), 100);
  for (int64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(a[i].input_ids, b[i].input_ids) << i;
    EXPECT_EQ(a[i].labels, b[i].labels) << i;
  }
  json header;
  const auto hf = transformers_view(exported, dir / "msgs.jsonl", &header);
  ASSERT_EQ(hf.size(), 100u);
  EXPECT_EQ(header["class"], "SentencePieceBackend") << header.dump();
  for (int64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(b[i].input_ids, hf[static_cast<size_t>(i)]["ids"].get<std::vector<int64_t>>()) << i;
    EXPECT_EQ(std::vector<int64_t>(b[i].input_ids.begin(), b[i].input_ids.begin() + b[i].prompt_tokens),
              hf[static_cast<size_t>(i)]["prompt_ids"].get<std::vector<int64_t>>())
        << i;
  }

  // Held-out exact match is the same whichever way the eval data is written.
  double em[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    const auto out_dir = dir / (k ? "eval-msgs" : "eval-text");
    ASSERT_EQ(run(in_source(anvil::testing::trainer_bin() +
                            " --eval-only --config configs/quickstart.yaml model.from=" + ckpt.string() +
                            " output_dir=" + out_dir.string() +
                            " data.eval[0].path=" + (dir / (k ? "msgs.jsonl" : "text.jsonl")).string() +
                            " data.template=auto eval.generate_samples=100 train.threads=1"),
                  &out),
              0)
        << out;
    for (const auto& e : stdfs::directory_iterator(out_dir))
      if (e.path().filename().string().rfind("eval-step-", 0) == 0)
        em[k] = json::parse(read_text(e.path()))["metrics"]["eval/exact_match"].get<double>();
  }
  EXPECT_EQ(em[0], em[1]);
  anvil::testing::record_figure("fixture held-out exact match (100 prompts)", em[1], 0.0, 0.5);
  EXPECT_GE(em[1], 0.5) << "the quickstart fixture reaches about 0.9";

  // anvil chat on "upper: apple" answers as generate does on "upper: apple\n".
  write_text(dir / "in.txt", "upper: apple\nsort: dcba\n");
  ASSERT_EQ(run(anvil::testing::cli_bin() + " chat --model " + ckpt.string() + " --no-history --max-new-tokens 12 < " +
                    (dir / "in.txt").string() + " 2>/dev/null",
                &out),
            0)
      << out;
  std::string gen;
  ASSERT_EQ(run(anvil::testing::cli_bin() + " generate --model " + ckpt.string() +
                    " --prompt 'upper: apple\\n' --prompt 'sort: dcba\\n' --max-new-tokens 12 2>/dev/null",
                &gen),
            0)
      << gen;
  std::istringstream gl(gen);
  std::string expected;
  while (std::getline(gl, line))
    if (!line.empty()) expected += json::parse(line)["generated"].get<std::string>() + "\n";
  EXPECT_EQ(out, expected);
  // --system is a line before the user's under plain; it is rendered the same in chat and training.
  std::vector<Message> conv{{"system", "hi"}, {"user", "upper: abc"}};
  const auto ids = ChatTemplate::get("plain").encode_prompt(*tok, conv);
  EXPECT_EQ(tok->decode(ids), "hi\nupper: abc\n");
}

}  // namespace
}  // namespace anvil::chat
