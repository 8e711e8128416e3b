// data.template: hf (docs/data.md, "Chat templates as written"): a
// tokenizer's own Jinja chat_template gives the token ids and trained tokens
// transformers' apply_chat_template gives, on templates of distinct
// real-world formats (tests/parity/apply_chat_template.py); constructs Anvil
// does not support are errors naming the template's line and column.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "anvil/config/config.h"
#include "anvil/chat/chat.h"
#include "data/datasets.h"
#include "anvil/checkpoint/hf_model.h"
#include "anvil/models/registry.h"
#include "anvil/tokenizer/tokenizer.h"
#include "chat/chat_references.h"
#include "chat/hf.h"
#include "jinja/jinja.h"
#include "test_util.h"

namespace anvil::chat {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::read_text;
using anvil::testing::run;
using anvil::testing::TempDir;
using anvil::testing::write_text;
using data::OnError;
using data::PreferenceDataset;
using data::PromptDataset;
using data::ReadOptions;
using data::Record;
using data::record_tools;
using data::SftDataset;
using json = nlohmann::ordered_json;
using references::messages_of;
using references::read_lines;

/// dir/refs: the templates' tokenizer folders and transformers' renderings.
::testing::AssertionResult make_refs(const TempDir& dir) {
  std::string out;
  const int rc = run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                         "/tests/parity/apply_chat_template.py " + (dir / "refs").string() + " 2>&1",
                     &out);
  if (rc == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << out;
}

std::string tools_of(const json& c) { return c.contains("tools") ? c["tools"].dump() : std::string(); }

std::vector<int64_t> mask_of(const TokenizedChat& t) {
  std::vector<int64_t> mask;
  for (auto l : t.labels) mask.push_back(l != kIgnoreIndex);
  return mask;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// The interpreter on its own: whitespace control (trim_blocks,
// lstrip_blocks, -, +), scoping, operators, filters, tests, methods,
// printing, tojson and {% generation %} spans, against jinja2 as
// transformers sets it up; where jinja2 raises, Anvil raises too.
TEST(ChatTemplateHf, JinjaRendersAsTransformersDoes) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  const auto cases = read_lines(dir / "refs" / "jinja.jsonl");
  ASSERT_GE(cases.size(), 60u);
  for (const auto& c : cases) {
    const auto tmpl = c["template"].get<std::string>();
    SCOPED_TRACE(tmpl);
    std::vector<std::pair<std::string, jinja::Value>> vars;
    for (const auto& [k, v] : c["vars"].items()) vars.emplace_back(k, json_value(v));
    if (c.contains("error")) {
      EXPECT_THROW(jinja::Template(tmpl).render(vars), Error) << c["error"];
      continue;
    }
    jinja::RenderResult r;
    ASSERT_NO_THROW(r = jinja::Template(tmpl).render(vars));
    EXPECT_EQ(r.text, c["text"].get<std::string>());
    std::vector<std::vector<int64_t>> spans;
    for (const auto& [b, e] : r.generation) spans.push_back({b, e});
    EXPECT_EQ(spans, c["generation"].get<std::vector<std::vector<int64_t>>>());
  }
}

// Ids, trained tokens, generation prompts, end of turn and replies, for every
// template and conversation, with and without {% generation %}.
TEST(ChatTemplateHf, TokenIdsAndAssistantMasksMatchTransformers) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  const auto names = json::parse(read_text(dir / "refs" / "templates.json")).get<std::vector<std::string>>();
  ASSERT_EQ(names.size(), 22u);
  const auto& hf = ChatTemplate::get("hf");
  int compared = 0;
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto folder = dir / "refs" / name;
    auto tok = tokenizer::load_tokenizer_from_model_dir(folder);
    EXPECT_EQ(recorded_chat_format(*tok).kind, RecordedChatFormat::Kind::custom);
    EXPECT_EQ(resolve_chat_template(*tok, "auto", "data.template", folder.string(), ""), "hf");
    EXPECT_EQ(hf.jinja(*tok), tok->chat_template());
    const auto meta = json::parse(read_text(dir / "refs" / (name + ".json")));
    EXPECT_EQ(hf.end_of_turn_id(*tok), meta["eot_id"].get<int64_t>());
    if (meta.contains("reply_ids")) {
      EXPECT_EQ(hf.encode_reply(*tok, meta["reply"].get<std::string>()), meta["reply_ids"].get<std::vector<int64_t>>());
    } else {
      EXPECT_NE(error_of([&] { hf.encode_reply(*tok, meta["reply"].get<std::string>()); }).find("{% generation %}"),
                std::string::npos);
    }
    for (const auto& c : read_lines(dir / "refs" / (name + ".jsonl"))) {
      SCOPED_TRACE(c["messages"].dump());
      const auto msgs = messages_of(c["messages"]);
      if (c.contains("error")) {
        const auto err = error_of([&] { hf.encode(*tok, msgs, false, tools_of(c)); });
        // jinja2's message (raise_exception's, an undefined value's), or why
        // the replies cannot be found without {% generation %}
        EXPECT_NE(
            err.find(c["error_type"] == "ValueError" ? std::string("{% generation %}") : c["error"].get<std::string>()),
            std::string::npos)
            << err;
      } else {
        const auto t = hf.encode(*tok, msgs, false, tools_of(c));
        EXPECT_EQ(t.input_ids, c["ids"].get<std::vector<int64_t>>());
        EXPECT_EQ(mask_of(t), c["mask"].get<std::vector<int64_t>>());
        std::vector<std::pair<int64_t, int64_t>> offsets;
        for (const auto& o : c["offsets"]) offsets.emplace_back(o[0].get<int64_t>(), o[1].get<int64_t>());
        EXPECT_EQ(token_offsets(*tok, c["text"].get<std::string>(), t.input_ids), offsets);
        EXPECT_EQ(hf.encode(*tok, msgs, true, tools_of(c)).labels, t.input_ids);  // train_on_prompt
        ++compared;
      }
      if (c.contains("prompt_ids"))
        EXPECT_EQ(hf.encode_prompt(*tok, messages_of(c["prompt_messages"]), tools_of(c)),
                  c["prompt_ids"].get<std::vector<int64_t>>());
      if (c.contains("prompt_error")) EXPECT_THROW(hf.encode_prompt(*tok, messages_of(c["prompt_messages"])), Error);
    }
  }
  EXPECT_GE(compared, 100);
}

// data.split_turns: each reply as its own sample, the conversation before it
// as the model sees it when it writes it (transformers' rendering with the
// generation prompt), then the reply. Where the whole conversation's masks are
// defined the samples train the same tokens; where the template renders an
// earlier reply differently (the reasoning template drops the reasoning of
// replies before the last query) only the split samples can train.
TEST(ChatTemplateHf, EachReplyAsItsOwnSampleMatchesTransformersPrefixes) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  const auto names = json::parse(read_text(dir / "refs" / "templates.json")).get<std::vector<std::string>>();
  const auto& hf = ChatTemplate::get("hf");
  int compared = 0, only_split = 0;
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / name);
    // With {% generation %} the whole conversation's blocks decide what it trains, which may render earlier
    // replies otherwise than their own turn does (the reasoning template): compared by the rule's templates.
    const bool marked = json::parse(read_text(dir / "refs" / (name + ".json")))["generation"].get<bool>();
    for (const auto& c : read_lines(dir / "refs" / (name + ".jsonl"))) {
      if (!c.contains("turns")) continue;
      SCOPED_TRACE(c["messages"].dump());
      const auto msgs = messages_of(c["messages"]);
      const auto turns = hf.encode_turns(*tok, msgs, false, tools_of(c));
      ASSERT_EQ(turns.size(), c["turns"].size());
      std::vector<int64_t> trained;
      for (size_t k = 0; k < turns.size(); ++k) {
        EXPECT_EQ(turns[k].input_ids, c["turns"][k]["ids"].get<std::vector<int64_t>>());
        EXPECT_EQ(mask_of(turns[k]), c["turns"][k]["mask"].get<std::vector<int64_t>>());
        for (const auto l : turns[k].labels)
          if (l != kIgnoreIndex) trained.push_back(l);
      }
      const bool whole = !c.contains("error");
      EXPECT_EQ(hf.keeps_earlier_turns(*tok, msgs, tools_of(c)), whole);
      if (whole && !marked) {  // the same trained tokens as the whole conversation's masks
        std::vector<int64_t> expected;
        for (const auto l : hf.encode(*tok, msgs, false, tools_of(c)).labels)
          if (l != kIgnoreIndex) expected.push_back(l);
        EXPECT_EQ(trained, expected);
      } else {
        ++only_split;
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 20);
  EXPECT_GE(only_split, 2);
}

// data.split_turns through the SFT reader: auto splits only the conversations
// the template re-renders, always splits every one, never keeps the error,
// which names the record's line.
TEST(ChatTemplateHf, SftReaderSplitsTurnsAsDataSplitTurnsSays) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  const auto reasoning = dir / "refs" / "reasoning-nogen", chatml = dir / "refs" / "chatml-nogen";
  ASSERT_TRUE(stdfs::exists(reasoning) && stdfs::exists(chatml)) << "the templates without {% generation %}";
  // The reasoning template (Qwen3's rule) renders every reply before the last query without its think block.
  const std::string rerendered =
      R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "reasoning_content": "Two and two.", "content": "4"}, {"role": "user", "content": "3+3?"}, {"role": "assistant", "reasoning_content": "Three and three.", "content": "6"}, {"role": "user", "content": "4+4?"}, {"role": "assistant", "reasoning_content": "Four and four.", "content": "8"}]})";
  const std::string plain =
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]})";
  const auto file = dir / "conversations.jsonl";
  write_text(file, rerendered + "\n" + plain + "\n");
  ReadOptions o;
  o.chat = &ChatTemplate::get("hf");
  auto with_reasoning = tokenizer::load_tokenizer_from_model_dir(reasoning);
  const auto split = SftDataset::load(file, *with_reasoning, o);  // auto: both re-render
  ASSERT_EQ(split.size(), 3 + 2);
  EXPECT_EQ(split[0].response, "4");
  EXPECT_EQ(split[2].response, "8");
  EXPECT_EQ(split[4].response, "Bye!");
  auto chatml_tok = tokenizer::load_tokenizer_from_model_dir(chatml);
  const auto plain_file = dir / "plain.jsonl";
  write_text(plain_file, plain + "\n");
  EXPECT_EQ(SftDataset::load(plain_file, *chatml_tok, o).size(), 1);  // auto: ChatML renders turns as written
  o.split_turns = ReadOptions::SplitTurns::always;
  EXPECT_EQ(SftDataset::load(plain_file, *chatml_tok, o).size(), 2);
  o.split_turns = ReadOptions::SplitTurns::never;
  const auto err = error_of([&] { SftDataset::load(file, *with_reasoning, o); });
  EXPECT_NE(err.find("data.split_turns"), std::string::npos) << err;
  EXPECT_NE(err.find("conversations.jsonl:1"), std::string::npos) << err;
  // A record's error, so data.on_error: skip counts it and goes on (a one-reply record still trains).
  write_text(file,
             rerendered + "\n" +
                 R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})" +
                 "\n");
  o.on_error = OnError::skip;
  const auto kept = SftDataset::load(file, *with_reasoning, o);
  EXPECT_EQ(kept.size(), 1);
  EXPECT_EQ(kept.stats().skipped_errors, 1);
}

// A record's chat_template_kwargs (TRL's) reach the template as variables, as
// apply_chat_template(..., enable_thinking=False) passes them; built-in
// templates and the standard variables refuse them.
TEST(ChatTemplateHf, RecordChatTemplateKwargsAreTemplateVariables) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / "reasoning");
  const auto& hf = ChatTemplate::get("hf");
  int compared = 0;
  for (const auto& c : read_lines(dir / "refs" / "reasoning-kwargs.jsonl")) {
    SCOPED_TRACE(c["messages"].dump());
    const auto line = json{{"messages", c["messages"]}, {"chat_template_kwargs", c["chat_template_kwargs"]}}.dump();
    const auto parsed = nlohmann::json::parse(line);
    const Record rec(parsed, "data.jsonl:1", line);
    const auto ids = hf.encode_prompt(*tok, messages_of(c["messages"]), record_tools(rec));
    EXPECT_EQ(ids, c["prompt_ids"].get<std::vector<int64_t>>());
    EXPECT_NE(ids, hf.encode_prompt(*tok, messages_of(c["messages"]))) << "enable_thinking=false changes the prompt";
    ++compared;
  }
  EXPECT_EQ(compared, 5);
  const auto error = [](const std::string& line) {
    const auto parsed = nlohmann::json::parse(line);
    return error_of([&] { record_tools(Record(parsed, "data.jsonl:3", line)); });
  };
  EXPECT_NE(error(R"({"chat_template_kwargs": [1]})").find("chat_template_kwargs"), std::string::npos);
  EXPECT_NE(error(R"({"chat_template_kwargs": {"add_generation_prompt": true}})")
                .find("chat_template_kwargs.add_generation_prompt"),
            std::string::npos);
  // `anvil generate --chat --template-kwargs` renders the same prompt (a tiny random model saved with the
  // template's tokenizer; only the prompt is compared).
  {
    config::ModelConfig mc;
    mc.family = "gpt2", mc.vocab_size = tok->vocab_size(), mc.hidden_size = 32, mc.num_hidden_layers = 1,
    mc.num_attention_heads = 2;
    auto model = models::family_by_name("gpt2").from_config(mc);
    const auto folder = dir / "model";
    std::filesystem::create_directories(folder);
    checkpoint::save_model_dir(folder, *model, tok.get());
    const auto last = read_lines(dir / "refs" / "reasoning-kwargs.jsonl").back();  // one user turn
    ASSERT_EQ(last["messages"].size(), 1u);
    std::string out;
    ASSERT_EQ(run(anvil::testing::cli_bin() + " generate --chat --model " + folder.string() + " --prompt '" +
                      last["messages"][0]["content"].get<std::string>() +
                      "' --template-kwargs '{\"enable_thinking\": false}' --show-prompt-ids --max-new-tokens 1 2>&1",
                  &out),
              0)
        << out;
    EXPECT_NE(out.find("prompt ids: " + json(last["prompt_ids"]).dump()), std::string::npos) << out;
    EXPECT_NE(run(anvil::testing::cli_bin() + " generate --chat --model " + folder.string() +
                      " --prompt hi --template-kwargs '{\"messages\": 1}' 2>&1",
                  &out),
              0);
    EXPECT_NE(out.find("--template-kwargs: \"messages\" is set by Anvil itself"), std::string::npos) << out;
  }
  const auto plain = json{{"chat_template_kwargs", {{"enable_thinking", false}}}}.dump();
  const auto parsed = nlohmann::json::parse(plain);
  const auto kwargs = record_tools(Record(parsed, "data.jsonl:4", plain));
  EXPECT_NE(error_of([&] {
              ChatTemplate::get("chatml").encode_prompt(*tok, {{"user", "hi"}}, kwargs);
            }).find("chat_template_kwargs"),
            std::string::npos);
}

// A template error names the template's line and column; raise_exception's message surfaces.
TEST(ChatTemplateHf, TemplateErrorsNameLineAndColumn) {
  const auto error = [](const std::string& tmpl) {
    return error_of([&] { jinja::Template(tmpl).render({{"messages", jinja::Value::list({})}}); });
  };
  EXPECT_EQ(error("{% for m in messages %}\n  {{ m.content }\n{% endfor %}"),
            "chat_template line 2, column 16: unexpected '}'");
  EXPECT_EQ(error("{% if messages %}\nhello"),
            "chat_template line 2, column 6: unexpected end of template: 'if' needs 'elif' or 'else' or 'endif'");
  EXPECT_EQ(error("{{ messages }}\n{% include 'other.jinja' %}"),
            "chat_template line 2, column 4: '{% include %}' is not supported by Anvil's chat templates");
  EXPECT_EQ(error("{% for m in messages %}\n    {{ m.content | truncate(10) }}\n{% endfor %}"),
            "chat_template line 2, column 20: the filter 'truncate' is not supported by Anvil's chat templates");
  EXPECT_EQ(error("{{ messages | wordwrap }}{{ x | nosuchfilter }}"),
            "chat_template line 1, column 15: the filter 'wordwrap' is not supported by Anvil's chat templates");
  EXPECT_EQ(error("{{ 'x'.encode() }}"),
            "chat_template line 1, column 7: str.encode() is not supported by Anvil's chat templates");
  EXPECT_EQ(error("{% for m in messages recursive %}{% endfor %}"),
            "chat_template line 1, column 22: recursive for loops are not supported by Anvil's chat templates");
  EXPECT_EQ(error("{% set g = [1, 2] | map('string') %}{{ g | first }}{{ g | list }}"),
            "chat_template line 1, column 59: a generator (the result of map, select, reverse, ...) is used a second "
            "time, where Python would see it empty; convert it with |list first");
  EXPECT_EQ(error("\n\n   {{ raise_exception('System role not supported') }}"),
            "chat_template line 3, column 7: raise_exception: System role not supported");
  try {
    jinja::Template("{{ raise_exception('bad ' ~ messages | length) }}").render({{"messages", jinja::Value::list({})}});
    ADD_FAILURE() << "expected an error";
  } catch (const jinja::RenderError& e) {
    EXPECT_EQ(e.raised, "bad 0");
  }
  EXPECT_THROW(jinja::Template("{% for %}"), ConfigError);  // syntax errors are configuration errors

  // Through a tokenizer: the template is checked when first used.
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / "chatml");
  tok->set_chat_template("{{ bos_token }}\n{% for m in messages %}{{ m.content }}{% endfo %}");
  EXPECT_EQ(error_of([&] {
              ChatTemplate::get("hf").encode(*tok, {{"user", "hi"}}, false);
            }),
            "chat_template line 2, column 42: unknown tag 'endfo'");
  tok->set_chat_template("{{ unk_token }}{{ messages[0].content }}");
  EXPECT_EQ(error_of([&] {
              ChatTemplate::get("hf").encode_prompt(*tok, {{"user", "hi"}});
            }),
            "chat_template: the template reads unk_token, which Anvil does not give templates (it gives bos_token, "
            "eos_token and pad_token)");
  // A tokenizer that would read a special token the template writes as other ids than transformers.
  auto sp = tokenizer::load_tokenizer("auto", anvil::testing::source_dir() + "/data/tokenizer.model");
  sp->set_chat_template("{% for m in messages %}{{ m.content + eos_token }}{% endfor %}");
  EXPECT_EQ(error_of([&] {
              ChatTemplate::get("hf").encode(*sp, {{"user", "hi"}}, false);
            }),
            "data.template hf: the chat template writes \"</s>\" (a special token) as text, and this tokenizer does "
            "not read it back as that token, as transformers would (a bare SentencePiece model?); use the model's "
            "tokenizer.json, or a built-in data.template");
  // hf needs a template to render.
  tok->set_chat_template("");
  EXPECT_EQ(error_of([&] { resolve_chat_template(*tok, "hf", "data.template", "tok", ""); }),
            "data.template hf: tok records no chat_template (tokenizer_config.json's chat_template, or "
            "chat_template.jinja) to render; name a built-in format (plain, chatml, llama3, oasst) instead");
}

// data.template: hf through the dataset reader: the folder's template, its
// trained tokens, and a record the template refuses named by file and line.
TEST(ChatTemplateHf, DatasetReaderRendersTheTemplate) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / "llama2");
  const auto refs = read_lines(dir / "refs" / "llama2.jsonl");
  std::string data;
  std::vector<json> expected;
  for (const auto& c : refs) {
    data += json({{"messages", c["messages"]}}).dump() + "\n";
    if (!c.contains("error") && std::count(c["mask"].begin(), c["mask"].end(), 1) > 0) expected.push_back(c);
  }
  write_text(dir / "convs.jsonl", data);
  ReadOptions o;
  const auto name = resolve_chat_template(*tok, "auto", "data.template", "llama2", "");
  ASSERT_EQ(name, "hf");
  o.chat = &ChatTemplate::get(name);
  // The assistant-first conversation is refused by the template's raise_exception.
  const auto err = error_of([&] { SftDataset::load(dir / "convs.jsonl", *tok, o); });
  EXPECT_EQ(err, (dir / "convs.jsonl").string() +
                     ":6: chat_template line 1, column 314: raise_exception: "
                     "Conversation roles must alternate user/assistant/user/assistant/...")
      << err;
  o.on_error = OnError::skip;
  const auto ds = SftDataset::load(dir / "convs.jsonl", *tok, o);
  EXPECT_EQ(ds.stats().skipped_errors, 1);
  EXPECT_EQ(ds.stats().dropped_no_target, 2);  // conversations without a reply
  ASSERT_EQ(ds.size(), static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(ds[i].input_ids, expected[static_cast<size_t>(i)]["ids"].get<std::vector<int64_t>>());
    std::vector<int64_t> mask;
    for (auto l : ds[i].labels) mask.push_back(l != kIgnoreIndex);
    EXPECT_EQ(mask, expected[static_cast<size_t>(i)]["mask"].get<std::vector<int64_t>>());
  }
  // Preference data: the prompt's generation prompt, then each reply as the template renders it.
  write_text(dir / "pref.jsonl",
             "{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"chosen\": \" Blue, like the "
             "sky. 🌿\", \"rejected\": \"no\"}\n");
  const auto pref = PreferenceDataset::load(dir / "pref.jsonl", *tok, o);
  ASSERT_EQ(pref.size(), 1);
  EXPECT_EQ(pref[0].chosen_ids(),
            json::parse(read_text(dir / "refs" / "llama2.json"))["reply_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(pref[0].prompt_ids, ChatTemplate::get("hf").encode_prompt(*tok, {{"user", "Hi"}}));
}

// TRL's tool-use records ({"messages" with tool_calls and tool turns,
// "tools"}) train as transformers renders them; prompts carry the tools;
// what a template cannot render is named by file, line and field.
TEST(ChatTemplateHf, ToolUseRecordsTrainAsTransformersRendersThem) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  for (const std::string name : {"tools", "tools-nogen"}) {
    SCOPED_TRACE(name);
    auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / name);
    const auto refs = read_lines(dir / "refs" / (name + ".jsonl"));
    ASSERT_EQ(refs.size(), 5u);
    std::string data, prompts;
    for (const auto& c : refs) {
      json line = {{"messages", c["messages"]}};
      if (c.contains("tools")) line["tools"] = c["tools"];
      data += line.dump() + "\n";  // the references' key order, which tojson keeps
      json prompt = {{"prompt", c["prompt_messages"]}};
      if (c.contains("tools")) prompt["tools"] = c["tools"];
      prompts += prompt.dump() + "\n";
    }
    write_text(dir / "tools.jsonl", data);
    write_text(dir / "prompts.jsonl", prompts);
    ReadOptions o;
    o.chat = &chat::ChatTemplate::get("hf");
    const auto ds = SftDataset::load(dir / "tools.jsonl", *tok, o);
    ASSERT_EQ(ds.size(), 5);
    for (int64_t i = 0; i < ds.size(); ++i) {
      const auto& c = refs[static_cast<size_t>(i)];
      EXPECT_EQ(ds[i].input_ids, c["ids"].get<std::vector<int64_t>>()) << i;
      std::vector<int64_t> mask;
      for (auto l : ds[i].labels) mask.push_back(l != kIgnoreIndex);
      EXPECT_EQ(mask, c["mask"].get<std::vector<int64_t>>()) << i;
    }
    const auto ps = PromptDataset::load(dir / "prompts.jsonl", *tok, o);
    ASSERT_EQ(ps.size(), 5);
    for (int64_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(ps[i].prompt_ids, refs[static_cast<size_t>(i)]["prompt_ids"].get<std::vector<int64_t>>()) << i;
      EXPECT_EQ(ps[i].tools, tools_of(refs[static_cast<size_t>(i)])) << i;  // for a reward model's prompt
    }
  }
  // A built-in template refuses tool use; malformed tool fields are named.
  auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / "chatml");
  ReadOptions o;
  o.chat = &chat::ChatTemplate::get("chatml");
  const auto error = [&](const std::string& line) {
    write_text(dir / "bad.jsonl", line + "\n");
    return error_of([&] { SftDataset::load(dir / "bad.jsonl", *tok, o); });
  };
  const auto where = (dir / "bad.jsonl").string() + ":1: ";
  const std::string user = R"({"role": "user", "content": "Hi"})";
  const std::string call =
      R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]})";
  EXPECT_EQ(error(R"({"messages": [)" + user + ", " + call + "]}"),
            where +
                "data.template chatml: an assistant message has tool_calls (tool use renders only with a "
                "model's own chat_template: data.template hf)");
  EXPECT_EQ(error(R"({"messages": [)" + user + R"(, {"role": "assistant", "content": "x"}], "tools": [{"a": 1}]})"),
            where +
                "data.template chatml: the conversation has tools (tool use renders only with a model's own "
                "chat_template: data.template hf)");
  // A tool message without tool_calls renders in chatml (and plain) as their Jinja renders any role: what a
  // ppo.environment appends. oasst has no form for it.
  const std::string tool_turn =
      R"({"messages": [)" + user + R"(, {"role": "tool", "content": "5"}, {"role": "assistant", "content": "x"}]})";
  EXPECT_EQ(error(tool_turn), "(no error)");
  {
    write_text(dir / "tool.jsonl", tool_turn + "\n");
    const auto ds = SftDataset::load(dir / "tool.jsonl", *tok, o);
    ASSERT_EQ(ds.size(), 1);
    EXPECT_NE(tok->decode(ds[0].input_ids, false).find("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\nx"),
              std::string::npos)
        << tok->decode(ds[0].input_ids, false);
  }
  o.chat = &chat::ChatTemplate::get("oasst");
  EXPECT_EQ(error(tool_turn), where +
                                  "message role \"tool\": expected system, user or assistant (tool messages render "
                                  "only with data.template plain, chatml or hf)");
  o.chat = &chat::ChatTemplate::get("chatml");
  o.chat = &chat::ChatTemplate::get("hf");
  EXPECT_EQ(error(R"({"messages": [)" + user + R"(, {"role": "assistant", "content": "x"}], "tools": {"a": 1}})"),
            where + "field \"tools\": expected a list of tool schemas (JSON objects), got object");
  EXPECT_EQ(error(R"({"messages": [)" + user + R"(, {"role": "assistant"}]})"),
            where + "field \"messages[1].content\": missing (only a message with tool_calls may leave it out)");
  EXPECT_EQ(error(R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": []}]})"),
            where +
                "field \"messages[1].tool_calls\": expected a non-empty list of {type, function: {name, "
                "arguments}}, got array");
  EXPECT_EQ(error(R"({"messages": [)" + user + R"(, {"role": "bot", "content": "x"}]})"),
            where + "field \"messages[1].role\": expected system, user, assistant or tool, got \"bot\"");
  // Other fields of a message are not rendered by the built-in templates, as
  // before, and an empty tools list has nothing to render.
  o.chat = &chat::ChatTemplate::get("chatml");
  write_text(dir / "extra.jsonl", R"({"messages": [)" + user +
                                      R"(, {"role": "assistant", "content": "x", "weight": 1}], "tools": []})"
                                      "\n");
  EXPECT_EQ(SftDataset::load(dir / "extra.jsonl", *tok, o)[0].input_ids,
            ChatTemplate::get("chatml").encode(*tok, {{"user", "Hi"}, {"assistant", "x"}}, false).input_ids);
}

// Each token's characters as tokenizers' offsets, and transformers' mask rule.
TEST(ChatTemplateHf, TokenOffsetsAndMaskFollowTransformers) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "refs" / "chatml");
  // 🌿 and é are split over byte-level tokens (4 and 2): each of them holds
  // the character (tokenizers' offset_mapping for this text).
  const std::string text = "a🌿b é<|im_end|>x";
  const auto ids = tok->encode(text);
  ASSERT_EQ(ids, (std::vector<int64_t>{82, 190, 271, 252, 141, 83, 238, 145, 120, 3, 105}));
  using Offsets = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(token_offsets(*tok, text, ids),
            (Offsets{{0, 1}, {1, 2}, {1, 2}, {1, 2}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {4, 5}, {5, 15}, {15, 16}}));
  // transformers' rule (5.24 on): every token whose characters overlap a span.
  const Offsets offsets = {{0, 1}, {1, 2}, {1, 2}, {2, 4}, {4, 4}, {4, 6}};
  EXPECT_EQ(assistant_mask(offsets, {{1, 2}}), (std::vector<int64_t>{0, 1, 1, 0, 0, 0}));  // a split character
  EXPECT_EQ(assistant_mask(offsets, {{3, 5}}), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));  // straddled ends
  EXPECT_EQ(assistant_mask(offsets, {{0, 1}, {4, 6}}), (std::vector<int64_t>{1, 0, 0, 0, 0, 1}));
  EXPECT_EQ(assistant_mask(offsets, {{6, 9}}), (std::vector<int64_t>(6, 0)));  // past the end
}

// A run on a folder with its own template trains with it (data.template:
// auto), its checkpoints record it unchanged, and `anvil chat` / `generate
// --chat` on a checkpoint prompt with the template's generation prompt.
TEST(ChatTemplateHf, TrainerRecordsTheTemplateAndAnvilChatUsesIt) {
  TempDir dir;
  ASSERT_TRUE(make_refs(dir));
  const auto folder = dir / "refs" / "chatml";
  const auto refs = read_lines(dir / "refs" / "chatml.jsonl");
  std::string data;
  for (const auto& c : refs)
    if (!c.contains("error")) data += json({{"messages", c["messages"]}}).dump() + "\n";
  write_text(dir / "convs.jsonl", data);
  std::string out;
  ASSERT_EQ(run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                    " --config configs/quickstart.yaml --config configs/models/gpt2-debug.yaml output_dir=" +
                    (dir / "run").string() + " tokenizer.type=auto tokenizer.path=" + folder.string() +
                    " 'data.train=[{path: " + (dir / "convs.jsonl").string() +
                    "}]' data.eval=null data.template=auto "
                    "data.max_length=64 train.max_steps=1 train.micro_batch_size=2 schedule.warmup_steps=0 "
                    "train.threads=1 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("data.template: hf, the chat_template of " + folder.string() + " rendered as written"),
            std::string::npos)
      << out;
  const auto ckpt = dir / "run" / "checkpoint-1";
  const auto saved = json::parse(read_text(ckpt / "tokenizer_config.json"));
  EXPECT_EQ(saved["chat_template"], json::parse(read_text(folder / "tokenizer_config.json"))["chat_template"]);

  const auto& sys_conv = refs[1];  // system + user + reply
  ASSERT_EQ(sys_conv["prompt_messages"].size(), 2u);
  write_text(dir / "in.txt", sys_conv["prompt_messages"][1]["content"].get<std::string>() + "\n");
  ASSERT_EQ(run(anvil::testing::cli_bin() + " chat --model " + ckpt.string() + " --system '" +
                    sys_conv["prompt_messages"][0]["content"].get<std::string>() +
                    "' --no-history --show-prompt-ids --max-new-tokens 2 < " + (dir / "in.txt").string() + " 2>&1",
                &out),
            0)
      << out;
  const std::string tag = "prompt ids: ";
  EXPECT_NE(out.find(tag + json(sys_conv["prompt_ids"]).dump()), std::string::npos) << out;
  // --template hf names the same thing.
  ASSERT_EQ(run(anvil::testing::cli_bin() + " generate --chat --model " + ckpt.string() +
                    " --template hf --prompt 'What is 2+2?' --show-prompt-ids --max-new-tokens 1 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find(tag + json(refs[0]["prompt_ids"]).dump()), std::string::npos) << out;
}

}  // namespace
}  // namespace anvil::chat
