// The data pipeline: formats, chat templates (against transformers'
// apply_chat_template), bad input, mixtures, resumable sampling across ranks,
// packing equivalence and token shards.
#include "data/datasets.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "data/collate.h"
#include "data/mixture.h"
#include "data/token_shards.h"
#include "models/layers.h"
#include "anvil/models/registry.h"
#include "anvil/train/sft.h"
#include "train/objectives/lm_data.h"
#include "test_util.h"

namespace anvil::data {
namespace {

using chat::ChatTemplate;
using chat::encode_plain;
using chat::TokenizedChat;

using anvil::testing::TempDir;
using anvil::testing::write_text;

std::unique_ptr<tokenizer::Tokenizer> bundled_tokenizer() {
  return tokenizer::load_tokenizer("sentencepiece", anvil::testing::source_dir() + "/data/tokenizer.model");
}

std::vector<Message> pair(const std::string& p, const std::string& r) { return {{"user", p}, {"assistant", r}}; }

SftSample sample_of(const tokenizer::Tokenizer& tok, const std::string& p, const std::string& r, ReadOptions o = {}) {
  DatasetStats st;
  auto s = make_sft_sample(tok, pair(p, r), o, st);
  EXPECT_TRUE(s.has_value());
  return *s;
}

LmSample lm(const SftSample& s) { return {s.input_ids, s.labels, {0}}; }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string msg = e.what();
    const auto at = msg.find("d.jsonl");
    return at == std::string::npos ? msg : msg.substr(at);  // drop the temp folder
  }
  return "<no error>";
}

std::string sft_error(const std::string& content, ReadOptions opt = {}) {
  TempDir dir;
  write_text(dir / "d.jsonl", content);
  auto tok = bundled_tokenizer();
  return error_of([&] { SftDataset::load(dir / "d.jsonl", *tok, opt); });
}

TEST(SftSample, PlainLossCoversResponseAndEosOnly) {
  auto tok = bundled_tokenizer();
  auto s = sample_of(*tok, "upper: ab\n", "AB");
  const auto p = tok->encode("upper: ab\n");
  const auto r = tok->encode("AB");
  ASSERT_EQ(s.input_ids.size(), p.size() + r.size() + 1);
  EXPECT_EQ(s.input_ids.back(), tok->eos_id());
  EXPECT_EQ(s.prompt_tokens, static_cast<int64_t>(p.size()));
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(s.labels[i], kIgnoreIndex);
  for (size_t i = p.size(); i < s.labels.size(); ++i) EXPECT_EQ(s.labels[i], s.input_ids[i]);
  EXPECT_EQ(tok->decode(s.input_ids), "upper: ab\nAB");

  ReadOptions all;
  all.train_on_prompt = true;
  all.add_eos = false;
  auto s2 = sample_of(*tok, "upper: ab\n", "AB", all);
  EXPECT_EQ(s2.labels, s2.input_ids);
  EXPECT_EQ(s2.prompt_tokens, static_cast<int64_t>(p.size()));
}

TEST(Collate, UnpackedPadsRightAndCountsTargets) {
  auto tok = bundled_tokenizer();
  auto a = lm(sample_of(*tok, "add: 1+1\n", "2"));
  auto b = lm(sample_of(*tok, "reverse: abcdef\n", "fedcba"));
  auto batch = collate_unpacked({&a, &b}, 0);
  EXPECT_EQ(batch.input_ids.size(1), static_cast<int64_t>(b.input_ids.size()));
  EXPECT_EQ(batch.num_targets, 2 + 7);  // "2"+EOS, "fedcba"+EOS
  EXPECT_EQ(batch.labels.ne(kIgnoreIndex).sum().item<int64_t>(), 9);
  const auto pad_from = static_cast<int64_t>(a.input_ids.size());
  EXPECT_TRUE(batch.labels[0].narrow(0, pad_from, batch.labels.size(1) - pad_from).eq(kIgnoreIndex).all().item<bool>());
  EXPECT_FALSE(batch.doc_ids.defined());
}

TEST(Collate, PadToMultipleRoundsTheLengthUpAndKeepsTheLoss) {
  // data.pad_to_multiple_of: the longest sample (16 tokens here) rounded up to the multiple, never past the cap
  // unless the longest is; the extra columns are padding with no target, and the loss is the same.
  auto tok = bundled_tokenizer();
  auto a = lm(sample_of(*tok, "add: 1+1\n", "2"));
  auto b = lm(sample_of(*tok, "reverse: abcdef\n", "fedcba"));
  const auto T = static_cast<int64_t>(b.input_ids.size());
  const auto plain = collate_unpacked({&a, &b}, 0);
  EXPECT_EQ(collate_unpacked({&a, &b}, 0, 8).input_ids.size(1), (T + 7) / 8 * 8);
  EXPECT_EQ(collate_unpacked({&a, &b}, 0, 64, T + 3).input_ids.size(1), T + 3);  // capped
  EXPECT_EQ(collate_unpacked({&a, &b}, 0, 64, T - 1).input_ids.size(1), T);      // never below the longest
  const auto padded = collate_unpacked({&a, &b}, 0, 64);
  ASSERT_EQ(padded.input_ids.size(1), 64);
  EXPECT_EQ(padded.num_targets, plain.num_targets);
  EXPECT_EQ(padded.num_tokens, plain.num_tokens);
  EXPECT_TRUE(at::equal(padded.input_ids.narrow(1, 0, T), plain.input_ids));
  EXPECT_TRUE(padded.labels.narrow(1, T, 64 - T).eq(kIgnoreIndex).all().item<bool>());
  config::ModelConfig mc;
  mc.family = "llama";
  mc.vocab_size = tok->vocab_size();
  mc.max_position_embeddings = 64;
  mc.hidden_size = 32;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 4;
  torch::manual_seed(0);
  auto model = models::family_by_name("llama").from_config(mc);
  model->to(at::kDouble);
  const double l_plain =
      train::lm_batch_loss_sum(*model, train::to_batch(collate_unpacked({&a, &b}, 0))).item<double>();
  const double l_padded =
      train::lm_batch_loss_sum(*model, train::to_batch(collate_unpacked({&a, &b}, 0, 64))).item<double>();
  EXPECT_NEAR(l_padded, l_plain, 1e-9 * l_plain);
}

TEST(Datasets, BadLinesNameFileLineAndField) {
  EXPECT_EQ(sft_error("{\"prompt\": \"a\", \"response\": \"b\"}\n{oops\n"),
            "d.jsonl:2: not valid JSON at column 2: syntax error while parsing object key - invalid literal; last "
            "read: '{o'; expected string literal");
  EXPECT_EQ(sft_error("\n{\"prompt\": \"a\"}\n"),
            "d.jsonl:2: expected an SFT record: {\"prompt\", \"response\"} (or TRL's \"completion\"), or "
            "{\"messages\": [{role, content}, ...]}; this line has fields \"prompt\". data.train[].prompt_field and "
            "response_field map other names");
  EXPECT_EQ(sft_error("{\"prompt\": 3, \"response\": \"b\"}\n"),
            "d.jsonl:1: field \"prompt\": expected a string, got number");
  EXPECT_EQ(sft_error("[1, 2]\n"), "d.jsonl:1: expected a JSON object, got array");
  EXPECT_EQ(sft_error("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n"),
            "d.jsonl:1: field \"messages[0].content\": expected a string, got number");
  EXPECT_EQ(sft_error("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n"),
            "d.jsonl:1: field \"messages[0].role\": expected system, user, assistant or tool, got \"bot\"");
  EXPECT_EQ(sft_error("{\"messages\": {}}\n"),
            "d.jsonl:1: field \"messages\": expected a non-empty list of {role, content}, got object");
  EXPECT_EQ(sft_error(""),
            "d.jsonl: no usable samples (0 lines; skipped as malformed 0, truncated 0, dropped as too long 0, "
            "dropped with no target left 0)");
}

TEST(Datasets, OnErrorSkipCountsAndReportsBadLines) {
  ReadOptions o;
  o.on_error = OnError::skip;
  TempDir dir;
  write_text(dir / "d.jsonl",
             "{\"prompt\": \"add: 1+1\\n\", \"response\": \"2\"}\n{oops\n{\"prompt\": 1, \"response\": \"x\"}\n"
             "{\"prompt\": \"add: 2+2\\n\", \"response\": \"4\"}\n{\"response\": \"y\"}\n");
  auto tok = bundled_tokenizer();
  auto ds = SftDataset::load(dir / "d.jsonl", *tok, o);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.stats().lines, 5);
  EXPECT_EQ(ds.stats().skipped_errors, 3);
  ASSERT_EQ(ds.stats().first_errors.size(), 3u);
  EXPECT_NE(ds.stats().first_errors[0].find("d.jsonl:2: not valid JSON"), std::string::npos);
  EXPECT_NE(ds.stats().first_errors[2].find("d.jsonl:5: expected an SFT record: {\"prompt\", \"response\"}"),
            std::string::npos);
}

TEST(Datasets, OverflowIsTruncatedOrDroppedAndCounted) {
  TempDir dir;
  write_text(dir / "d.jsonl",
             "{\"prompt\": \"reverse: abcdefg\\n\", \"response\": \"gfedcba\"}\n"       // 17 + 8 tokens
             "{\"prompt\": \"add: 1+2\\n\", \"response\": \"3\"}\n"                     // 9 + 2
             "{\"prompt\": \"reverse: abcdefghijklmnop\\n\", \"response\": \"x\"}\n");  // prompt alone too long
  auto tok = bundled_tokenizer();
  ReadOptions o;
  o.max_length = 20;
  auto ds = SftDataset::load(dir / "d.jsonl", *tok, o);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.stats().truncated, 1);
  EXPECT_EQ(ds.stats().dropped_no_target, 1);  // its whole target was truncated away: counted, not trained
  EXPECT_EQ(ds[0].input_ids.size(), 20u);
  o.drop_overflow = true;
  auto dropped = SftDataset::load(dir / "d.jsonl", *tok, o);
  EXPECT_EQ(dropped.size(), 1);
  EXPECT_EQ(dropped.stats().dropped_overflow, 2);
}

// ---- chat templates ------------------------------------------------------------

const std::filesystem::path& chat_refs() {
  static TempDir dir;
  static bool made = false;
  if (!made) {
    const auto cmd = anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                     "/tests/parity/make_chat_references.py " + dir.path().string();
    std::string out;
    EXPECT_EQ(anvil::testing::run(cmd + " 2>&1", &out), 0) << out;
    made = true;
  }
  return dir.path();
}

TEST(ChatTemplates, IdsAndTrainedTokensMatchTransformersApplyChatTemplate) {
  auto tok = tokenizer::load_tokenizer("auto", chat_refs() / "tok");
  for (const std::string name : {"plain", "chatml", "llama3", "oasst"}) {
    std::ifstream in(chat_refs() / (name + ".jsonl"));
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      std::vector<Message> msgs;
      for (const auto& m : j["messages"]) msgs.push_back({m["role"], m["content"]});
      const auto t = ChatTemplate::get(name).encode(*tok, msgs, false);
      EXPECT_EQ(t.input_ids, j["ids"].get<std::vector<int64_t>>()) << name << " conversation " << n;
      std::vector<int64_t> mask;
      for (auto l : t.labels) mask.push_back(l != kIgnoreIndex);
      EXPECT_EQ(mask, j["mask"].get<std::vector<int64_t>>()) << name << " conversation " << n;
      // The generation prompt is the prefix up to the first trained token.
      std::vector<Message> head(msgs.begin(), msgs.begin() + 1 + (msgs[0].role == "system"));
      const auto prompt = ChatTemplate::get(name).encode_prompt(*tok, head);
      ASSERT_LE(prompt.size(), t.input_ids.size());
      EXPECT_EQ(prompt, std::vector<int64_t>(t.input_ids.begin(), t.input_ids.begin() + t.prompt_tokens)) << name;
      ++n;
    }
    EXPECT_EQ(n, 5) << name;
  }
  EXPECT_EQ(ChatTemplate::get("chatml").end_of_turn_id(*tok), *tok->token_to_id("<|im_end|>"));
  EXPECT_EQ(ChatTemplate::get("llama3").end_of_turn_id(*tok), *tok->token_to_id("<|eot_id|>"));
  EXPECT_EQ(ChatTemplate::get("oasst").end_of_turn_id(*tok), tok->eos_id());
}

TEST(ChatTemplates, MissingMarkersAndUntrainableSamplesAreReported) {
  auto sp = bundled_tokenizer();  // a character model without ChatML markers
  EXPECT_EQ(error_of([&] { ChatTemplate::get("chatml").encode(*sp, pair("a", "b"), false); }),
            "data.template chatml: the tokenizer has no single token \"<|im_start|>\", which this template needs (use "
            "a tokenizer that has the template's special tokens, or data.template: plain)");
  EXPECT_EQ(error_of([] { ChatTemplate::get("vicuna"); }),
            "data.template: unknown chat template \"vicuna\"; expected plain, chatml, llama3, oasst or hf");

  auto tok = tokenizer::load_tokenizer("auto", chat_refs() / "tok");
  TempDir dir;
  write_text(
      dir / "d.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"no reply here\"}]}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
      "{\"prompt\": \"a very long prompt that leaves no room for the reply, a very long prompt that leaves no "
      "room for the reply, a very long prompt that leaves no room\", \"response\": \"x\"}\n");
  ReadOptions o;
  o.chat = &chat::ChatTemplate::get("chatml");
  o.max_length = 40;
  auto ds = SftDataset::load(dir / "d.jsonl", *tok, o);
  EXPECT_EQ(ds.size(), 1);
  EXPECT_EQ(ds.stats().dropped_no_target, 2);  // nothing to train on / truncated away
  EXPECT_EQ(ds[0].response, "yo");
  EXPECT_EQ(ds[0].prompt, "hi");
}

TEST(ChatTemplates, PromptGivenAsMessagesKeepsTheResponse) {
  auto tok = tokenizer::load_tokenizer("auto", chat_refs() / "tok");
  TempDir dir;
  write_text(dir / "d.jsonl",
             "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be terse.\"}, {\"role\": \"user\", "
             "\"content\": \"hi\"}], \"response\": \"yo\"}\n");
  ReadOptions o;
  o.chat = &chat::ChatTemplate::get("chatml");
  auto ds = SftDataset::load(dir / "d.jsonl", *tok, o);
  ASSERT_EQ(ds.size(), 1);
  const std::vector<Message> conv{{"system", "Be terse."}, {"user", "hi"}, {"assistant", "yo"}};
  EXPECT_EQ(ds[0].input_ids, ChatTemplate::get("chatml").encode(*tok, conv, false).input_ids);
  EXPECT_EQ(ds[0].response, "yo");
  write_text(dir / "d.jsonl", "{\"prompt\": [{\"role\": \"bot\", \"content\": \"x\"}], \"response\": \"y\"}\n");
  EXPECT_EQ(error_of([&] { SftDataset::load(dir / "d.jsonl", *tok, o); }),
            "d.jsonl:1: field \"prompt[0].role\": expected system, user, assistant or tool, got \"bot\"");
}

// ---- other formats ---------------------------------------------------------------

TEST(Formats, PreferencePromptsAndOfflineRl) {
  auto tok = tokenizer::load_tokenizer("auto", chat_refs() / "tok");
  TempDir dir;
  ReadOptions o;
  o.chat = &chat::ChatTemplate::get("chatml");
  write_text(dir / "p.jsonl",
             "{\"prompt\": \"What is 2+2?\", \"chosen\": \"4\", \"rejected\": \"5\", \"margin\": 1.5}\n"
             "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be terse.\"}, {\"role\": \"user\", \"content\": "
             "\"Name a colour.\"}], \"chosen\": \"Blue\", \"rejected\": \"I don't know\"}\n");
  auto pref = PreferenceDataset::load(dir / "p.jsonl", *tok, o);
  ASSERT_EQ(pref.size(), 2);
  EXPECT_EQ(pref[0].margin, 1.5);
  EXPECT_FALSE(pref[1].margin.has_value());
  // prompt + chosen is exactly the conversation the SFT path would render.
  auto full = pref[0].prompt_ids;
  full.insert(full.end(), pref[0].chosen_ids().begin(), pref[0].chosen_ids().end());
  auto conv = ChatTemplate::get("chatml").encode(*tok, pair("What is 2+2?", "4"), false).input_ids;
  EXPECT_EQ(full, std::vector<int64_t>(conv.begin(), conv.end() - 1));  // conv ends with the "\n" after <|im_end|>
  EXPECT_EQ(pref[0].rejected_ids().back(), *tok->token_to_id("<|im_end|>"));

  write_text(dir / "bad.jsonl", "{\"prompt\": \"q\", \"chosen\": \"a\", \"rejected\": \"b\", \"margin\": \"big\"}\n");
  EXPECT_NE(error_of([&] {
              PreferenceDataset::load(dir / "bad.jsonl", *tok, o);
            }).find("d.jsonl:1: field \"margin\": expected a number, got string"),
            std::string::npos);
  write_text(dir / "bad2.jsonl", "{\"prompt\": \"q\", \"chosen\": \"a\"}\n");
  EXPECT_NE(error_of([&] {
              PreferenceDataset::load(dir / "bad2.jsonl", *tok, o);
            }).find("2.jsonl:1: missing field \"rejected\""),
            std::string::npos);

  // Ranked replies (K-wise), best first.
  write_text(dir / "k.jsonl", "{\"prompt\": \"What is 2+2?\", \"ranked\": [\"4\", \"5\", \"22\"]}\n");
  auto ranked = PreferenceDataset::load(dir / "k.jsonl", *tok, o);
  ASSERT_EQ(ranked[0].replies.size(), 3u);
  EXPECT_FALSE(ranked[0].is_pair());
  EXPECT_EQ(ranked[0].prompt_ids, pref[0].prompt_ids);
  EXPECT_EQ(ranked[0].chosen_ids(), pref[0].chosen_ids());
  EXPECT_EQ(ranked[0].replies[1], pref[0].rejected_ids());
  EXPECT_EQ(ranked[0].reply_texts[2], "22");
  for (const auto& [line, expected] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt\": \"q\", \"ranked\": [\"a\"]}", "field \"ranked\": expected a list of at least 2 replies"},
           {"{\"prompt\": \"q\", \"ranked\": [\"a\", 3]}", "field \"ranked[1]\": expected a string, got 3"},
           {"{\"prompt\": \"q\", \"ranked\": [\"a\", \"b\"], \"chosen\": \"a\"}", "not both"}}) {
    write_text(dir / "k2.jsonl", line + "\n");
    EXPECT_NE(error_of([&] { PreferenceDataset::load(dir / "k2.jsonl", *tok, o); }).find(expected), std::string::npos)
        << line;
  }

  // TRL's preference forms read as TRL defines them: conversational replies,
  // and the implicit prompt (the shared start of chosen and rejected).
  write_text(dir / "trl.jsonl",
             "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"chosen\": [{\"role\": "
             "\"assistant\", \"content\": \"4\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"5\"}]}\n"
             "{\"chosen\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, {\"role\": \"assistant\", "
             "\"content\": \"4\"}], \"rejected\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, {\"role\": "
             "\"assistant\", \"content\": \"5\"}]}\n"
             "{\"chosen\": \"The sky is blue.\", \"rejected\": \"The sky is green.\"}\n");
  auto trl = PreferenceDataset::load(dir / "trl.jsonl", *tok, o);
  ASSERT_EQ(trl.size(), 3);
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(trl[i].prompt_ids, pref[0].prompt_ids) << i;
    EXPECT_EQ(trl[i].chosen_ids(), pref[0].chosen_ids()) << i;
    EXPECT_EQ(trl[i].rejected_ids(), pref[0].rejected_ids()) << i;
  }
  EXPECT_EQ(trl[2].prompt, "The sky is");  // the space goes with the replies, as in TRL's extract_prompt
  EXPECT_EQ(trl[2].reply_texts, (std::vector<std::string>{" blue.", " green."}));
  write_text(dir / "sft.jsonl", "{\"prompt\": \"q\", \"response\": \"a\"}\n");
  EXPECT_NE(error_of([&] { PreferenceDataset::load(dir / "sft.jsonl", *tok, o); })
                .find("expected a preference record: {\"prompt\", \"chosen\", \"rejected\"} or {\"prompt\", "
                      "\"ranked\": [best, ..., worst]} (TRL's implicit-prompt {\"chosen\", \"rejected\"} too); this "
                      "line has fields \"prompt\", \"response\""),
            std::string::npos);

  // TRL's prompt-completion SFT format, standard and conversational.
  write_text(dir / "pc.jsonl",
             "{\"prompt\": \"What is 2+2?\", \"completion\": \"4\"}\n"
             "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"completion\": [{\"role\": "
             "\"assistant\", \"content\": \"4\"}]}\n");
  auto pc = SftDataset::load(dir / "pc.jsonl", *tok, o);
  ASSERT_EQ(pc.size(), 2);
  EXPECT_EQ(pc[0].input_ids, conv);
  EXPECT_EQ(pc[1].input_ids, conv);

  write_text(dir / "q.jsonl", "{\"prompt\": \"What is 2+2?\"}\n{\"prompt\": \"Hi\"}\n");
  auto prompts = PromptDataset::load(dir / "q.jsonl", *tok, o);
  ASSERT_EQ(prompts.size(), 2);
  EXPECT_EQ(prompts[0].prompt_ids, pref[0].prompt_ids);

  write_text(dir / "r.jsonl",
             "{\"prompt\": \"What is 2+2?\", \"response\": \"4\", \"reward\": 1}\n"
             "{\"prompt\": \"What is 2+2?\", \"response\": \"5\", \"reward\": -0.5}\n");
  auto rl = OfflineRlDataset::load(dir / "r.jsonl", *tok, o);
  ASSERT_EQ(rl.size(), 2);
  EXPECT_EQ(rl[1].reward, -0.5);
  EXPECT_EQ(rl[0].prompt_tokens, static_cast<int64_t>(pref[0].prompt_ids.size()));
  write_text(dir / "r2.jsonl", "{\"prompt\": \"q\", \"response\": \"a\"}\n");
  EXPECT_NE(
      error_of([&] { OfflineRlDataset::load(dir / "r2.jsonl", *tok, o); }).find("2.jsonl:1: missing field \"reward\""),
      std::string::npos);
}

// ---- mixtures and resumable sampling ----------------------------------------------

TEST(Mixture, FractionsAndSizesAreFreshSubsetsEveryEpoch) {
  std::vector<MixtureSpec> specs(3);
  specs[0].size = 100, specs[0].fraction = 0.3;
  specs[1].size = 50, specs[1].take = 20;
  specs[2].size = 10, specs[2].fraction = 2.5;  // repeated: 25 per epoch
  MixtureSampler s(specs, 7);
  EXPECT_EQ(s.epoch_length(), 30 + 20 + 25);
  std::vector<std::set<int64_t>> subset0(3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::map<int, int> count;
    std::vector<std::set<int64_t>> seen(3);
    std::map<int64_t, int> reps;
    for (int64_t i = 0; i < s.epoch_length(); ++i) {
      const auto r = s.next();
      ++count[r.dataset];
      seen[static_cast<size_t>(r.dataset)].insert(r.index);
      if (r.dataset == 2) ++reps[r.index];
      ASSERT_LT(r.index, specs[static_cast<size_t>(r.dataset)].size);
    }
    EXPECT_EQ(count[0], 30);
    EXPECT_EQ(count[1], 20);
    EXPECT_EQ(count[2], 25);
    EXPECT_EQ(seen[0].size(), 30u);  // without replacement within an epoch
    EXPECT_EQ(seen[1].size(), 20u);
    EXPECT_EQ(seen[2].size(), 10u);  // every sample twice, half of them three times
    for (auto [i, n] : reps) EXPECT_TRUE(n == 2 || n == 3);
    if (epoch == 0)
      subset0 = seen;
    else
      EXPECT_NE(seen[0], subset0[0]) << "epoch " << epoch << " reused epoch 0's subset";
  }
}

TEST(Mixture, WeightsSetTheShareOfEachDataset) {
  std::vector<MixtureSpec> specs(2);
  specs[0].size = 1000, specs[0].weight = 3;
  specs[1].size = 3000, specs[1].weight = 1;
  MixtureSampler s(specs, 11);
  EXPECT_EQ(s.epoch_length(), 4000);
  int first = 0;
  for (const auto& r : s.plan()) first += r.dataset == 0;
  EXPECT_NEAR(first / 4000.0, 0.75, 0.02);  // 3000 draws of 1000 samples: three laps
}

TEST(Mixture, OneDatasetKeepsTheEpochPermutationOfEarlierVersions) {
  // Order of the single-dataset sampler before mixtures existed (seed 42, size 10, epochs 0 and 1).
  std::vector<MixtureSpec> specs(1);
  specs[0].size = 10;
  MixtureSampler s(specs, 42);
  std::vector<int64_t> e0, e1;
  for (int i = 0; i < 10; ++i) e0.push_back(s.next().index);
  for (int i = 0; i < 10; ++i) e1.push_back(s.next().index);
  EXPECT_EQ(e0, permutation(10, 42 * 0x100000001B3ull));
  EXPECT_EQ(e1, permutation(10, 42 * 0x100000001B3ull + 1));
}

struct SyntheticLm final : LmDataset {
  explicit SyntheticLm(int64_t n, int64_t salt) : n_(n), salt_(salt) {}
  int64_t size() const override { return n_; }
  int64_t length(int64_t i) const override { return 3 + (i * 7 + salt_) % 9; }
  void get(int64_t i, LmSample& out) const override {
    out.input_ids.clear();
    for (int64_t t = 0; t < length(i); ++t) out.input_ids.push_back((salt_ * 1000 + i * 13 + t) % 50);
    out.labels = out.input_ids;
    out.labels[0] = kIgnoreIndex;
    out.doc_starts = {0};
  }
  std::string name() const override { return "synthetic"; }
  int64_t n_, salt_;
};

std::vector<at::Tensor> take(train::LmBatchSource& src, int steps) {
  std::vector<at::Tensor> out;
  for (int i = 0; i < steps; ++i) {
    auto b = src.next();
    out.push_back(b.tensors.at("input_ids"));
    if (b.tensors.count("doc_ids")) out.push_back(b.tensors.at("doc_ids"));
  }
  return out;
}

TEST(Mixture, ResumeMidEpochAndAtTheBoundaryGivesTheSameStreamForAnyWorldSize) {
  std::vector<std::shared_ptr<const LmDataset>> ds{std::make_shared<SyntheticLm>(40, 1),
                                                   std::make_shared<SyntheticLm>(23, 2)};
  std::vector<MixtureSpec> specs(2);
  specs[0].size = 40, specs[0].fraction = 0.5;  // 20 per epoch
  specs[1].size = 23, specs[1].take = 16;       // epoch = 36 samples
  for (bool packing : {false, true}) {
    auto source = [&](int64_t rank, int64_t world, int64_t m) {
      train::LmBatchSource::Options o;
      o.micro_batch_size = m, o.max_length = 24, o.packing = packing, o.rank = rank, o.world = world;
      return train::LmBatchSource(ds, MixtureSampler(specs, 5), o);
    };
    // The global stream: one rank reading 6-row micro-batches.
    auto global = source(0, 1, 6);
    const auto reference = take(global, 12);
    for (int64_t world : {1, 2, 3}) {
      const int64_t m = 6 / world;
      // Each step, the ranks' rows together are the global micro-batch, in rank order.
      std::vector<train::LmBatchSource> ranks;
      for (int64_t r = 0; r < world; ++r) ranks.push_back(source(r, world, m));
      for (int step = 0; step < 12; ++step) {
        std::vector<at::Tensor> parts;
        for (auto& src : ranks) parts.push_back(src.next().tensors.at("input_ids"));
        const auto T = reference[static_cast<size_t>(step * (packing ? 2 : 1))].size(1);
        for (auto& p : parts) p = at::constant_pad_nd(p, {0, T - p.size(1)}, 0);  // unpacked rows pad per rank
        auto glued = at::cat(parts, 0);
        auto ref = reference[static_cast<size_t>(step * (packing ? 2 : 1))];
        if (!packing) glued = glued.narrow(1, 0, ref.size(1));
        EXPECT_TRUE(glued.equal(ref)) << "world " << world << " step " << step << " packing " << packing;
      }
      // Resume: mid-epoch (step 2 = 12 samples unpacked) and exactly at the epoch boundary (step 6 = 36 samples).
      for (int cut : {2, 5, 6}) {
        std::vector<train::LmBatchSource> before, after;
        for (int64_t r = 0; r < world; ++r) before.push_back(source(r, world, m));
        for (int64_t r = 0; r < world; ++r) take(before[static_cast<size_t>(r)], cut);
        const auto state = before[0].state();
        for (int64_t r = 1; r < world; ++r)
          EXPECT_EQ(before[static_cast<size_t>(r)].state(), state);  // global position
        for (int64_t r = 0; r < world; ++r) {
          after.push_back(source(r, world, m));
          after.back().restore(state);
          const auto cont = take(after.back(), 3);
          const auto uninterrupted = take(before[static_cast<size_t>(r)], 3);
          ASSERT_EQ(cont.size(), uninterrupted.size());
          for (size_t k = 0; k < cont.size(); ++k)
            EXPECT_TRUE(cont[k].equal(uninterrupted[k])) << "world " << world << " cut " << cut << " rank " << r;
        }
        if (!packing && cut == 6 && world == 1)
          EXPECT_EQ(state["epoch"].get<int64_t>() * 36 + state["offset"].get<int64_t>(), 36);
      }
    }
  }
}

// train.num_train_epochs counts steps in rows: a sample each, or with
// packing the rows next() starts within the first epoch.
TEST(Mixture, RowsPerEpochAreTheRowsTheFirstEpochFills) {
  std::vector<std::shared_ptr<const LmDataset>> ds{std::make_shared<SyntheticLm>(40, 1),
                                                   std::make_shared<SyntheticLm>(23, 2)};
  std::vector<MixtureSpec> specs(2);
  specs[0].size = 40, specs[0].fraction = 0.5;
  specs[1].size = 23, specs[1].take = 16;  // epoch = 36 samples of 3 to 11 tokens
  for (bool packing : {false, true}) {
    train::LmBatchSource::Options o;
    o.micro_batch_size = 1, o.max_length = 24, o.packing = packing;
    train::LmBatchSource src(ds, MixtureSampler(specs, 5), o);
    EXPECT_EQ(src.samples_per_epoch(), 36);
    const auto rows = src.rows_per_epoch();
    int64_t started = 0;  // rows next() starts while the first epoch has samples left
    for (;;) {
      const auto at = src.state();
      if (at["epoch"].get<int64_t>() > 0 || at["offset"].get<int64_t>() >= 36) break;
      src.next();
      ++started;
    }
    EXPECT_EQ(rows, started) << "packing " << packing;
    if (packing)
      EXPECT_LT(rows, 36);
    else
      EXPECT_EQ(rows, 36);
    EXPECT_EQ(src.rows_per_epoch(), rows);  // whatever the position
  }
}

// ---- packing -------------------------------------------------------------------

void check_packing(const std::string& family) {
  torch::manual_seed(0);
  config::ModelConfig mc;
  mc.family = family;
  mc.vocab_size = 50;
  mc.max_position_embeddings = 32;
  mc.hidden_size = 32;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 4;
  auto model = models::family_by_name(family).from_config(mc);
  model->to(at::kDouble);
  model->eval();
  SyntheticLm ds(10, 3);
  std::vector<LmSample> samples(10);
  for (int64_t i = 0; i < 10; ++i) ds.get(i, samples[static_cast<size_t>(i)]);
  // A pretraining-style sample holding two documents.
  samples[9].doc_starts = {0, 4};
  // Unpacked: each document on its own.
  double unpacked = 0;
  int64_t unpacked_targets = 0;
  for (auto s : samples) {
    for (size_t d = 0; d < s.doc_starts.size(); ++d) {
      const auto b = s.doc_starts[d],
                 e = d + 1 < s.doc_starts.size() ? s.doc_starts[d + 1] : static_cast<int64_t>(s.input_ids.size());
      LmSample doc{
          {s.input_ids.begin() + b, s.input_ids.begin() + e}, {s.labels.begin() + b, s.labels.begin() + e}, {0}};
      auto batch = train::to_batch(collate_unpacked({&doc}, 0));
      unpacked += train::lm_batch_loss_sum(*model, batch).item<double>();
      unpacked_targets += batch.num_targets;
    }
  }
  // Packed into 32-token rows.
  std::vector<std::vector<const LmSample*>> rows(1);
  int64_t used = 0;
  for (const auto& s : samples) {
    if (used + static_cast<int64_t>(s.input_ids.size()) > 32) rows.emplace_back(), used = 0;
    rows.back().push_back(&s);
    used += static_cast<int64_t>(s.input_ids.size());
  }
  ASSERT_GE(rows.size(), 2u);
  ASSERT_GE(rows[0].size(), 3u);
  auto packed = train::to_batch(collate_packed(rows, 32, 0));
  EXPECT_EQ(packed.num_targets, unpacked_targets);
  const double loss = train::lm_batch_loss_sum(*model, packed).item<double>();
  EXPECT_NEAR(loss / unpacked, 1.0, 1e-6) << family;
  // Without the mask the documents would see each other: the loss must differ.
  auto leaky = packed;
  leaky.tensors.erase("doc_ids");
  EXPECT_GT(std::abs(train::lm_batch_loss_sum(*model, leaky).item<double>() / unpacked - 1.0), 1e-5) << family;
}

TEST(Packing, LossEqualsUnpackedTrainingForEveryFamily) {
  const auto families = models::family_names();
  ASSERT_GE(families.size(), 12u);
  for (const auto& f : families) check_packing(f);
}

TEST(Packing, PositionsRestartAndDocumentsCannotSeeEachOther) {
  LmSample a{{1, 2, 3}, {kIgnoreIndex, 2, 3}, {0}}, b{{4, 5, 6, 7}, {4, 5, 6, 7}, {0, 2}};
  auto batch = collate_packed({{&a, &b}}, 8, 0);
  std::vector<int64_t> pos(batch.position_ids.data_ptr<int64_t>(), batch.position_ids.data_ptr<int64_t>() + 8);
  std::vector<int64_t> doc(batch.doc_ids.data_ptr<int64_t>(), batch.doc_ids.data_ptr<int64_t>() + 8);
  std::vector<int64_t> lab(batch.labels.data_ptr<int64_t>(), batch.labels.data_ptr<int64_t>() + 8);
  EXPECT_EQ(pos, (std::vector<int64_t>{0, 1, 2, 0, 1, 0, 1, 0}));
  EXPECT_EQ(doc, (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 2, -1}));
  EXPECT_EQ(lab, (std::vector<int64_t>{kIgnoreIndex, 2, 3, kIgnoreIndex, 5, kIgnoreIndex, 7, kIgnoreIndex}));
  EXPECT_EQ(batch.num_targets, 4);
  auto mask = models::layers::document_causal_mask(batch.doc_ids)[0][0];
  EXPECT_TRUE(mask[4][3].item<bool>());
  EXPECT_FALSE(mask[3][2].item<bool>());  // across documents
  EXPECT_FALSE(mask[3][4].item<bool>());  // the future
}

TEST(Packing, DocumentOffsetsCountTheFlattenedRows) {
  // Flash attention's cumulative lengths over the B * T tokens end to end: each row's documents, then its
  // padding as one more; an id that comes back after another has no offsets (the mask takes it).
  const auto doc = at::tensor({0, 0, 0, 1, 1, 2, 2, -1, 0, 0, 0, 0, 0, 0, 1, 1}, at::kLong).view({2, 8});
  const auto o = document_offsets(doc);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->cu_seqlens.scalar_type(), at::kInt);
  const auto cu = o->cu_seqlens;
  EXPECT_EQ(std::vector<int32_t>(cu.data_ptr<int32_t>(), cu.data_ptr<int32_t>() + cu.numel()),
            (std::vector<int32_t>{0, 3, 5, 7, 8, 14, 16}));
  EXPECT_EQ(o->max_seqlen, 6);
  EXPECT_FALSE(document_offsets(at::tensor({0, 0, 1, 0}, at::kLong).view({1, 4})));
  EXPECT_FALSE(document_offsets(at::tensor({0, -1, 1, -1}, at::kLong).view({1, 4})));
}

// ---- token shards -------------------------------------------------------------------

TEST(TokenShards, WindowsCarryDocumentBoundariesAndDamageIsReported) {
  TempDir dir;
  ShardWriterOptions o;
  o.shard_tokens = 20;  // several shards
  ShardWriter w(dir / "shards", 100, 99, o);
  std::vector<std::vector<int64_t>> docs;
  for (int d = 0; d < 12; ++d) {
    std::vector<int64_t> doc;
    for (int t = 0; t < 3 + d % 5; ++t) doc.push_back(d * 5 + t);
    w.add(doc);
    docs.push_back(doc);
  }
  w.finish("test", {"synthetic"});
  auto shards = TokenShards::open(dir / "shards");
  EXPECT_GT(shards->shards().size(), 1u);
  EXPECT_EQ(shards->num_docs(), 12);
  int64_t expect_tokens = 0;
  for (const auto& d : docs) expect_tokens += static_cast<int64_t>(d.size()) + 1;
  EXPECT_EQ(shards->num_tokens(), expect_tokens);
  // The stream of the first shard, rebuilt from the documents.
  std::vector<int64_t> stream;
  for (const auto& d : docs) {
    stream.insert(stream.end(), d.begin(), d.end());
    stream.push_back(99);
  }
  PretrainDataset ds(shards, 5, "shards");
  LmSample s;
  ds.get(0, s);
  EXPECT_EQ(s.input_ids, std::vector<int64_t>(stream.begin(), stream.begin() + 5));
  EXPECT_EQ(s.doc_starts, (std::vector<int64_t>{0, 4}));  // doc 1 starts at token 4 (doc 0: 3 tokens + EOS)
  ds.get(1, s);
  EXPECT_EQ(s.input_ids, std::vector<int64_t>(stream.begin() + 5, stream.begin() + 10));
  EXPECT_EQ(s.labels, s.input_ids);

  // A truncated shard is named, with what meta.json promised.
  const auto bin = dir / "shards" / "shard_00000.bin";
  std::filesystem::resize_file(bin, std::filesystem::file_size(bin) - 2);
  const auto err = error_of([&] { TokenShards::open(dir / "shards"); });
  EXPECT_NE(err.find("shard_00000.bin: expected"), std::string::npos) << err;
  EXPECT_NE(err.find("re-run anvil prepare"), std::string::npos) << err;
  // The writer refuses to overwrite.
  EXPECT_NE(error_of([&] { ShardWriter(dir / "shards", 100, 99); }).find("output exists"), std::string::npos);
}

// An id the vocabulary does not hold is reported when the shards are opened,
// with the file, the position and the vocabulary size, not at step N.
TEST(TokenShards, IdsOutsideTheVocabularyAreReportedOnOpen) {
  TempDir dir;
  ShardWriter w(dir / "shards", 100, 99);
  w.add({1, 2, 3});
  w.add({4, 5});
  w.finish("test", {"synthetic"});
  ASSERT_NO_THROW(TokenShards::open(dir / "shards"));
  const auto bin = dir / "shards" / "shard_00000.bin";
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2 * 4);  // token 4 (uint16): the first id of the second document
    const uint16_t big = 4000;
    f.write(reinterpret_cast<const char*>(&big), 2);
  }
  const auto err = error_of([&] { TokenShards::open(dir / "shards"); });
  EXPECT_NE(err.find(bin.string() + ": token 4 is id 4000, outside the vocabulary of 100 that meta.json declares"),
            std::string::npos)
      << err;
}

// Shards record their tokenizer's fingerprint; opening them for a run with
// another tokenizer is an error naming both (older shards, with no
// fingerprint: another vocabulary size or EOS).
TEST(TokenShards, DataPreparedWithAnotherTokenizerIsRefusedNamingBoth) {
  TempDir dir;
  const auto path = anvil::testing::source_dir() + "/data/tokenizer.model";
  auto tok = tokenizer::load_tokenizer("sentencepiece", path);
  const auto write = [&](const std::string& name, int64_t vocab, int64_t eos, const std::string& fp) {
    ShardWriter w(dir / name, vocab, eos);
    w.add({1, 2, 3});
    w.finish("sentencepiece", {"synthetic"}, fp);
    return TokenShards::open(dir / name);
  };
  const auto fp = tokenizer::fingerprint(*tok);
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp, tokenizer::fingerprint(*tokenizer::load_tokenizer("sentencepiece", path)));  // stable
  const auto same = write("same", tok->vocab_size(), tok->eos_id(), fp);
  EXPECT_EQ(same->tokenizer_fingerprint(), fp);
  EXPECT_EQ(same->tokenizer_kind(), "sentencepiece");
  EXPECT_NO_THROW(check_shard_tokenizer(*same, *tok, "same"));
  // One added special token is another tokenizer.
  auto other = tokenizer::with_special_tokens(tokenizer::load_tokenizer("sentencepiece", path), {"<tool>"});
  ASSERT_NE(tokenizer::fingerprint(*other), fp);
  const auto err = error_of([&] { check_shard_tokenizer(*same, *other, "data/shards"); });
  EXPECT_NE(err.find("data/shards: the shards were written with another tokenizer than this run's (meta.json: a "
                     "sentencepiece tokenizer of " +
                     std::to_string(tok->vocab_size()) + " tokens, EOS " + std::to_string(tok->eos_id()) +
                     ", fingerprint " + fp +
                     "; tokenizer.path: a sentencepiece "
                     "tokenizer of " +
                     std::to_string(other->vocab_size()) + " tokens"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("Re-run anvil prepare with the run's tokenizer"), std::string::npos) << err;
  // Shards from before the fingerprint: the vocabulary size and EOS decide.
  EXPECT_NO_THROW(check_shard_tokenizer(*write("old", tok->vocab_size(), tok->eos_id(), ""), *tok, "old"));
  EXPECT_NE(error_of([&] {
              check_shard_tokenizer(*write("old_vocab", 100, tok->eos_id(), ""), *tok, "old_vocab");
            }).find("old_vocab: the shards were written with another tokenizer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              check_shard_tokenizer(*write("old_eos", tok->vocab_size(), 7, ""), *tok, "old_eos");
            }).find("EOS 7"),
            std::string::npos);
}

TEST(TokenShards, DamagedMetaFieldsAreNamed) {
  // Cases the fuzzer found (fuzz/corpus/token_shards/regress-*) or that sit
  // next to them: each is an error naming meta.json and the key.
  TempDir dir;
  ShardWriter w(dir / "shards", 100, 99);
  w.add({1, 2, 3});
  w.finish("test", {"synthetic"});
  const auto meta_path = dir / "shards" / "meta.json";
  const auto good = nlohmann::json::parse(anvil::testing::read_text(meta_path));
  const auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto m = good;
    edit(m);
    anvil::testing::write_text(meta_path, m.dump());
    return error_of([&] { TokenShards::open(dir / "shards"); });
  };
  const auto m = meta_path.string();
  EXPECT_EQ(with([](auto& j) { j["format"] = 7; }), m + ": format: expected \"anvil-token-shards\"");
  EXPECT_EQ(with([](auto& j) { j["dtype"] = nullptr; }), m + ": dtype: expected uint16 or uint32");
  EXPECT_EQ(with([](auto& j) { j["shards"][0]["docs"] = -1; }),
            m + ": shards[0].docs: expected an integer in [0, 2^50], got -1");
  EXPECT_EQ(with([](auto& j) { j["shards"][0]["name"] = "../shards/shard_00000"; }),
            m + ": shards[0].name: expected a file name inside the folder, got \"../shards/shard_00000\"");
}

}  // namespace
}  // namespace anvil::data
