// data.template: hf on the chat templates real model folders ship: llama.cpp's
// corpus (models/templates of the llama-cpp-python sdist, which
// scripts/setup.sh extracts into .venv/llama-cpp-templates). Each template,
// in a tokenizer folder's tokenizer_config.json, goes through the trainer's
// entry points (ChatTemplate::get("hf"): encode, encode_prompt,
// end_of_turn_id) on conversations with tools, tool calls, null and empty
// content, reasoning under each of its names, system turns first, late and
// twice, and template variables (enable_thinking, reasoning_effort, ...);
// ids, trained tokens and generation prompts are those transformers'
// apply_chat_template gives (tests/parity/chat_template_corpus.py), and what
// transformers refuses Anvil refuses, naming why. The families Anvil trains
// have tests of their own.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "anvil/chat/chat.h"
#include "anvil/tokenizer/tokenizer.h"
#include "chat/chat_references.h"
#include "chat/hf.h"
#include "jinja/jinja.h"
#include "test_util.h"

namespace anvil::chat {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::read_text;
using anvil::testing::ReferenceFolder;
using json = nlohmann::ordered_json;
using references::messages_of;
using references::read_lines;

constexpr size_t kCorpusTemplates = 70;  // llama-cpp-python 0.3.36's models/templates

// The references, made once per ctest run (ParityReferences.ChatTemplates),
// else here. Some templates print strftime_now's date: references made on
// another day (a run across midnight) are made again.
const ReferenceFolder& references() {
  static const std::unique_ptr<ReferenceFolder> refs = [] {
    auto r = std::make_unique<ReferenceFolder>("ANVIL_CHAT_TEMPLATE_REFERENCES", "chat_template_corpus.py");
    const auto today = jinja::Template("{{ strftime_now('%Y-%m-%d') }}").render({}).text;
    if (r->ok() && json::parse(read_text(*r / "templates.json"))["today"] != today)
      r = std::make_unique<ReferenceFolder>("", "chat_template_corpus.py");  // no variable: made here
    return r;
  }();
  return *refs;
}

// What encode takes beside the messages: the tools, or an object of them and
// the template variables (a record's chat_template_kwargs).
std::string inputs_of(const json& c) {
  if (!c.contains("kwargs")) return c.contains("tools") ? c["tools"].dump() : std::string();
  json o = c["kwargs"];
  if (c.contains("tools")) o["tools"] = c["tools"];
  return o.dump();
}

constexpr const char* kNoError = "(no error)";

// The anvil::Error `f` throws; anything else is named as not one.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an anvil::Error: ") + e.what();
  }
  return kNoError;
}

// What Anvil's error says where transformers raised `type`: `message`: its
// own words for the sandbox's refusals, raise_exception's message and
// Python's otherwise, and for the trained-token rule docs/data.md's remedy.
std::string expected_error(const std::string& type, const std::string& message) {
  if (type == "NotAPrefix") return "{% generation %}";
  std::smatch m;
  if (std::regex_search(message, m, std::regex("access to attribute '(\\w+)' of '(\\w+)' object is unsafe")))
    return m[2].str() + "." + m[1].str() + " is not allowed in chat templates";
  if (std::regex_search(message, m, std::regex("No filter named '(\\w+)'")))
    return "no filter named '" + m[1].str() + "'";
  if (message == "Can only get item pairs from a mapping.") return "items: expected a mapping";
  return message;
}

struct Counts {
  int rendered = 0;  // conversations whose text and ids were compared
  int masked = 0;    // ... and trained tokens, through encode
  int refused = 0;   // conversations transformers refuses, or whose trained tokens the rule cannot find
  int prompts = 0;   // generation prompts compared
  int split = 0;     // conversations whose data.split_turns samples were compared
};

// Every conversation of template `name` that `pick` selects, as transformers renders it.
Counts expect_matches(const std::string& name, const std::function<bool(const json&)>& pick = nullptr) {
  SCOPED_TRACE(name);
  const auto& refs = references();
  Counts n;
  EXPECT_TRUE(refs.ok()) << refs.log();
  if (!refs.ok()) return n;
  const auto tok = tokenizer::load_tokenizer_from_model_dir(refs / name);
  const auto& hf = ChatTemplate::get("hf");
  EXPECT_EQ(resolve_chat_template(*tok, "auto", "data.template", name, ""), "hf");
  EXPECT_EQ(hf.end_of_turn_id(*tok), json::parse(read_text(refs / (name + ".json")))["eot_id"].get<int64_t>());
  for (const auto& c : read_lines(refs / (name + ".jsonl"))) {
    if (pick && !pick(c)) continue;
    SCOPED_TRACE(c["case"].get<std::string>());
    const auto msgs = messages_of(c["messages"]);
    const auto inputs = inputs_of(c);
    if (c.contains("ids")) {  // transformers renders it (its trained tokens may still be undefined)
      std::string text;
      EXPECT_EQ(error_of([&] { text = render_chat(*tok, msgs, false, inputs).text; }), kNoError);
      EXPECT_EQ(text, c["text"].get<std::string>());
      EXPECT_EQ(tok->encode(text), c["ids"].get<std::vector<int64_t>>());
      ++n.rendered;
    }
    if (c.contains("error")) {
      const auto err = error_of([&] { hf.encode(*tok, msgs, false, inputs); });
      EXPECT_NE(err.find(expected_error(c["error_type"], c["error"])), std::string::npos)
          << err << "\n  transformers: " << c["error_type"].get<std::string>() << ": " << c["error"];
      ++n.refused;
    } else {
      TokenizedChat t;
      EXPECT_EQ(error_of([&] { t = hf.encode(*tok, msgs, false, inputs); }), kNoError);
      EXPECT_EQ(t.input_ids, c["ids"].get<std::vector<int64_t>>());
      std::vector<int64_t> mask;
      for (const auto l : t.labels) mask.push_back(l != kIgnoreIndex);
      EXPECT_EQ(mask, c["mask"].get<std::vector<int64_t>>());
      ++n.masked;
    }
    if (c.contains("turns")) {  // data.split_turns: each reply in the context transformers renders before it
      std::vector<TokenizedChat> turns;
      EXPECT_EQ(error_of([&] { turns = hf.encode_turns(*tok, msgs, false, inputs); }), kNoError);
      EXPECT_EQ(turns.size(), c["turns"].size());
      for (size_t k = 0; k < std::min(turns.size(), c["turns"].size()); ++k) {
        EXPECT_EQ(turns[k].input_ids, c["turns"][k]["ids"].get<std::vector<int64_t>>()) << "reply " << k;
        std::vector<int64_t> mask;
        for (const auto l : turns[k].labels) mask.push_back(l != kIgnoreIndex);
        EXPECT_EQ(mask, c["turns"][k]["mask"].get<std::vector<int64_t>>()) << "reply " << k;
      }
      // data.split_turns: auto splits exactly the conversations whose whole rendering cannot be trained.
      EXPECT_EQ(hf.keeps_earlier_turns(*tok, msgs, inputs), c.value("error_type", "") != "NotAPrefix");
      ++n.split;
    }
    if (c.contains("prompt_ids")) {
      std::vector<int64_t> ids;
      EXPECT_EQ(error_of([&] { ids = hf.encode_prompt(*tok, messages_of(c["prompt_messages"]), inputs); }), kNoError);
      EXPECT_EQ(ids, c["prompt_ids"].get<std::vector<int64_t>>());
      ++n.prompts;
    } else if (c.contains("prompt_error")) {
      const auto err = error_of([&] { hf.encode_prompt(*tok, messages_of(c["prompt_messages"]), inputs); });
      EXPECT_NE(err.find(expected_error(c["prompt_error_type"], c["prompt_error"])), std::string::npos) << err;
    }
  }
  return n;
}

bool thinking_off(const json& c) { return c.contains("kwargs") && c["kwargs"].value("enable_thinking", true) == false; }

// ------------------------------------------------------------ the families Anvil trains

// At least `rendered` conversations rendered, `masked` of them with trained tokens.
void expect_family(const std::string& name, int rendered, int masked,
                   const std::function<bool(const json&)>& pick = nullptr) {
  const auto n = expect_matches(name, pick);
  EXPECT_GE(n.rendered, rendered);
  EXPECT_GE(n.masked, masked);
  EXPECT_GE(n.prompts, rendered);
}

TEST(ChatTemplateCorpus, Qwen25) { expect_family("Qwen-Qwen2.5-7B-Instruct", 22, 22); }

// Qwen3 with thinking: reasoning_content (and its other names) kept after the
// last query, <think> in the content, enable_thinking unset or true. A reply
// before the last query loses its reasoning in later renderings, so the
// rule for templates without {% generation %} cannot find its tokens: refused.
TEST(ChatTemplateCorpus, Qwen3Thinking) {
  expect_family("Qwen-Qwen3-0.6B", 15, 10, [](const json& c) { return !thinking_off(c); });
}

// enable_thinking=false: the generation prompt gets an empty think block.
TEST(ChatTemplateCorpus, Qwen3WithoutThinking) {
  expect_family("Qwen-Qwen3-0.6B", 1, 1, thinking_off);
  const auto tok = tokenizer::load_tokenizer_from_model_dir(references() / "Qwen-Qwen3-0.6B");
  const auto prompt = render_chat(*tok, {{"user", "Hi"}}, true, R"({"enable_thinking": false})").text;
  EXPECT_EQ(prompt.substr(prompt.rfind("<|im_start|>")), "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// The reasoning models people fine-tune most, on a conversation of three
// replies with reasoning: the template drops the reasoning of replies before
// the last query, so the whole conversation cannot be trained, and
// data.split_turns (auto) trains each reply in the context the model sees
// when it writes it. Its samples are checked against transformers' rendering
// of every prefix (expect_matches), and a run trains on them.
void expect_three_replies_train(const std::string& name) {
  SCOPED_TRACE(name);
  const auto& refs = references();
  ASSERT_TRUE(refs.ok()) << refs.log();
  json conv;
  for (const auto& c : read_lines(refs / (name + ".jsonl")))
    if (c["case"] == "three_turns_reasoning") conv = c;
  ASSERT_FALSE(conv.is_null());
  EXPECT_EQ(conv.value("error_type", ""), "NotAPrefix");  // one sample cannot train every reply
  ASSERT_TRUE(conv.contains("turns")) << conv.value("turns_error", "");
  EXPECT_EQ(conv["turns"].size(), 3u);
  EXPECT_GE(expect_matches(name, [](const json& c) { return c["case"] == "three_turns_reasoning"; }).split, 1);
  anvil::testing::TempDir dir;
  std::string lines;
  for (int i = 0; i < 4; ++i) lines += json({{"messages", conv["messages"]}}).dump() + "\n";
  anvil::testing::write_text(dir / "train.jsonl", lines);
  const std::string yaml =
      "algorithm: sft\nmodel: {family: llama, max_position_embeddings: 512, hidden_size: 32, "
      "num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64}\ntokenizer: {path: " +
      (refs / name).string() + "}\ndata: {train: [{path: " + (dir / "train.jsonl").string() +
      "}], template: hf}\ntrain: {max_steps: 2, micro_batch_size: 3, log_every: 1, threads: 1}\n"
      "eval: {generate_samples: 0}\n";
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(dir, yaml, "", &log), 0) << log;
  EXPECT_NE(log.find("12 samples"), std::string::npos) << "4 conversations of 3 replies each:\n" << log;
  EXPECT_EQ(anvil::testing::read_losses(dir / "out" / "metrics.jsonl").size(), 2u);
}

TEST(ChatTemplateCorpus, Qwen3ConversationsTrainEachReplyInItsOwnContext) {
  expect_three_replies_train("Qwen-Qwen3-0.6B");
}

TEST(ChatTemplateCorpus, DeepSeekR1ConversationsTrainEachReplyInItsOwnContext) {
  expect_three_replies_train("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B");
}

TEST(ChatTemplateCorpus, QwQ) { expect_family("Qwen-QwQ-32B", 17, 2); }

TEST(ChatTemplateCorpus, Qwen3Coder) { expect_family("Qwen3-Coder", 21, 21); }

TEST(ChatTemplateCorpus, Gemma2) { expect_family("google-gemma-2-2b-it", 12, 12); }

TEST(ChatTemplateCorpus, Gemma4) { expect_family("google-gemma-4-31B-it", 24, 3); }

TEST(ChatTemplateCorpus, Gemma4Interleaved) { expect_family("google-gemma-4-31B-it-interleaved", 24, 3); }

TEST(ChatTemplateCorpus, MistralNemo) { expect_family("mistralai-Mistral-Nemo-Instruct-2407", 14, 11); }

TEST(ChatTemplateCorpus, MistralSmall32) { expect_family("Mistral-Small-3.2-24B-Instruct-2506", 16, 16); }

TEST(ChatTemplateCorpus, Phi35) { expect_family("microsoft-Phi-3.5-mini-instruct", 18, 11); }

TEST(ChatTemplateCorpus, Llama31) { expect_family("meta-llama-Llama-3.1-8B-Instruct", 23, 23); }

TEST(ChatTemplateCorpus, Llama32) { expect_family("meta-llama-Llama-3.2-3B-Instruct", 23, 23); }

TEST(ChatTemplateCorpus, Llama33) { expect_family("meta-llama-Llama-3.3-70B-Instruct", 23, 23); }

TEST(ChatTemplateCorpus, SmolLM3) { expect_family("HuggingFaceTB-SmolLM3-3B", 24, 24); }

const std::set<std::string>& named_templates() {
  static const std::set<std::string> s = {"Qwen-Qwen2.5-7B-Instruct",
                                          "Qwen-Qwen3-0.6B",
                                          "Qwen-QwQ-32B",
                                          "Qwen3-Coder",
                                          "google-gemma-2-2b-it",
                                          "google-gemma-4-31B-it",
                                          "google-gemma-4-31B-it-interleaved",
                                          "mistralai-Mistral-Nemo-Instruct-2407",
                                          "Mistral-Small-3.2-24B-Instruct-2506",
                                          "microsoft-Phi-3.5-mini-instruct",
                                          "meta-llama-Llama-3.1-8B-Instruct",
                                          "meta-llama-Llama-3.2-3B-Instruct",
                                          "meta-llama-Llama-3.3-70B-Instruct",
                                          "HuggingFaceTB-SmolLM3-3B"};
  return s;
}

// ------------------------------------------------------------ the rest of the corpus

// Every other template; the references cover every .jinja of the corpus.
TEST(ChatTemplateCorpus, EveryOtherTemplateMatchesTransformers) {
  const auto& refs = references();
  ASSERT_TRUE(refs.ok()) << refs.log();
  const auto index = json::parse(read_text(refs / "templates.json"));
  const auto names = index["names"].get<std::vector<std::string>>();
  std::set<std::string> corpus;
  for (const auto& f : stdfs::directory_iterator(index["corpus"].get<std::string>()))
    if (f.path().extension() == ".jinja") corpus.insert(f.path().stem().string());
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), corpus);
  EXPECT_EQ(names.size(), kCorpusTemplates);
  Counts all;
  for (const auto& name : names) {
    if (named_templates().count(name)) continue;
    const auto n = expect_matches(name);
    EXPECT_GE(n.rendered + n.refused, 26) << name;  // every conversation
    all.rendered += n.rendered, all.masked += n.masked, all.prompts += n.prompts;
  }
  EXPECT_GE(all.rendered, 1200);
  EXPECT_GE(all.masked, 900);
  EXPECT_GE(all.prompts, 1200);
  for (const auto& name : named_templates()) EXPECT_EQ(corpus.count(name), 1u) << name;
}

// What the corpus needed of the interpreter: firefunction-v2 ({% filter %}
// blocks) and Hy3 (str.format) render as transformers does.
TEST(ChatTemplateCorpus, FilterBlocksAndStrFormatRender) {
  EXPECT_GE(expect_matches("fireworks-ai-llama-3-firefunction-v2").rendered, 1);
  EXPECT_GE(expect_matches("tencent-Hy3").rendered, 24);
}

// transformers' copies of a message's reasoning (reasoning_content, thinking,
// reasoning) in gpt-oss and LFM2.5, which read `thinking`.
TEST(ChatTemplateCorpus, ReasoningUnderEachNameRendersAsTransformers) {
  for (const auto* name : {"openai-gpt-oss-120b", "LFM2.5-8B-A1B"}) {
    const auto n = expect_matches(name, [](const json& c) {
      for (const auto& m : c["messages"])
        if (m.contains("reasoning_content") || m.contains("thinking") || m.contains("reasoning")) return true;
      return false;
    });
    EXPECT_GE(n.rendered, 6) << name;
  }
}

// ------------------------------------------------------------ the interpreter

// {% filter %} blocks, str.format, the scopes of set and filter blocks and
// the reasoning aliases, against jinja2 as transformers sets it up; where
// jinja2 raises, Anvil raises too.
TEST(ChatTemplateCorpus, ConstructsRenderAsJinja2Does) {
  const auto& refs = references();
  ASSERT_TRUE(refs.ok()) << refs.log();
  const auto tok = tokenizer::load_tokenizer_from_model_dir(refs / "Qwen-Qwen2.5-7B-Instruct");
  const auto cases = read_lines(refs / "jinja.jsonl");
  ASSERT_GE(cases.size(), 50u);
  for (const auto& c : cases) {
    const auto tmpl = c["template"].get<std::string>();
    SCOPED_TRACE(tmpl);
    const auto rendered = [&] {
      if (c["render_chat"].get<bool>()) {  // through hf's messages, as the trainer's are
        tok->set_chat_template(tmpl);
        return render_chat(*tok, messages_of(c["vars"]["messages"]), false);
      }
      std::vector<std::pair<std::string, jinja::Value>> vars;
      for (const auto& [k, v] : c["vars"].items()) vars.emplace_back(k, json_value(v));
      return jinja::Template(tmpl).render(vars);
    };
    if (c.contains("error")) {
      EXPECT_THROW(rendered(), Error) << c["error"];
      continue;
    }
    jinja::RenderResult r;
    ASSERT_NO_THROW(r = rendered());
    EXPECT_EQ(r.text, c["text"].get<std::string>());
    std::vector<std::vector<int64_t>> spans;
    for (const auto& [b, e] : r.generation) spans.push_back({b, e});
    EXPECT_EQ(spans, c["generation"].get<std::vector<std::vector<int64_t>>>());
  }
}

// The errors of the new constructs name them, and where in the template.
TEST(ChatTemplateCorpus, ConstructErrorsNameThemselves) {
  const auto error = [](const std::string& tmpl) { return error_of([&] { jinja::Template(tmpl).render({}); }); };
  EXPECT_EQ(error("{% filter nosuch %}x{% endfilter %}"), "chat_template line 1, column 11: no filter named 'nosuch'");
  EXPECT_EQ(error("{% filter length %}abc{% endfilter %}"),
            "chat_template line 1, column 4: a {% filter %} block's filters give a int, where a string is written");
  EXPECT_EQ(error("{% filter upper %}x"),
            "chat_template line 1, column 20: unexpected end of template: 'filter' needs 'endfilter'");
  EXPECT_EQ(error("{{ '{} {}'.format(1) }}"),
            "chat_template line 1, column 11: str.format: Replacement index 1 out of range for positional args tuple");
  EXPECT_EQ(error("{{ '{x}'.format(y=1) }}"), "chat_template line 1, column 9: str.format: no argument named 'x'");
  EXPECT_EQ(error("{{ '{:d}'.format('x') }}"),
            "chat_template line 1, column 10: str.format: Unknown format code 'd' for object of type 'str'");
  EXPECT_EQ(error("{{ '{}'.format_map({}) }}"),
            "chat_template line 1, column 8: str.format_map() is not supported by Anvil's chat templates");
}

}  // namespace
}  // namespace anvil::chat
