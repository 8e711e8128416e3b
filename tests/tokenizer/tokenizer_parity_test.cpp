// Parity with Hugging Face `tokenizers` and `sentencepiece` themselves:
// tests/parity/make_tokenizer_references.py trains tokenizers with those
// libraries (byte-level ones shaped as GPT-2, GPT-NeoX, LLaMA-3, Galactica and
// OPT; SentencePiece models and their transformers conversions) and records,
// for every line of a multilingual corpus, the ids they encode it to and the
// text they decode those ids to. We load the same files and must agree line
// for line. Then the loader's error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "anvil/tokenizer/tokenizer.h"
#include "test_util.h"

namespace anvil::tokenizer {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

// The references: made once per ctest run by the ParityReferences.Tokenizers
// fixture (tests/CMakeLists.txt), or once per process by a test run alone.
struct References {
  References() : dir("ANVIL_TOKENIZER_REFERENCES", "make_tokenizer_references.py") {
    ok = dir.ok();
    log = dir.log();
    if (!ok) return;
    const auto corpus = fs::read_file(dir / "corpus.txt");
    for (size_t begin = 0, end; begin < corpus.size(); begin = end + 1) {  // '\n' only: lines hold \r, U+2028
      end = corpus.find('\n', begin);
      if (end == std::string::npos) end = corpus.size();
      lines.push_back(corpus.substr(begin, end - begin));
    }
  }
  anvil::testing::ReferenceFolder dir;
  bool ok = false;
  std::string log;
  std::vector<std::string> lines;
};

const References& references() {
  static References refs;
  return refs;
}

std::string ids_text(const std::vector<int64_t>& ids) { return json(ids).dump(); }
std::string quoted(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

void check_parity(const std::string& name, const std::string& load_path) {
  const auto& refs = references();
  ASSERT_TRUE(refs.ok) << refs.log;
  const auto dir = refs.dir.path() / name;
  const auto tok = load_tokenizer("auto", refs.dir.path() / load_path);

  std::vector<json> expected;
  const auto jsonl = fs::read_file(dir / "expected.jsonl");
  for (size_t begin = 0, end; (end = jsonl.find('\n', begin)) != std::string::npos; begin = end + 1)
    expected.push_back(json::parse(jsonl.substr(begin, end - begin)));
  ASSERT_EQ(expected.size(), refs.lines.size());

  size_t id_mismatches = 0, decode_mismatches = 0, round_trips = 0, special_mismatches = 0;
  for (size_t i = 0; i < refs.lines.size(); ++i) {
    const auto& line = refs.lines[i];
    const auto want = expected[i]["ids"].get<std::vector<int64_t>>();
    const auto want_text = expected[i]["decoded"].get<std::string>();
    const auto got = tok->encode(line);
    if (got != want && id_mismatches++ == 0)
      ADD_FAILURE() << name << ": first id mismatch at corpus line " << i + 1 << ": " << quoted(line)
                    << "\n  reference: " << ids_text(want) << "\n  anvil:     " << ids_text(got);
    if (expected[i].contains("ids_special")) {  // transformers' AutoTokenizer, add_special_tokens=True
      auto framed = got;
      if (tok->add_bos()) framed.insert(framed.begin(), tok->bos_id());
      const auto want_special = expected[i]["ids_special"].get<std::vector<int64_t>>();
      if (framed != want_special && special_mismatches++ == 0)
        ADD_FAILURE() << name << ": first mismatch with special tokens at corpus line " << i + 1
                      << "\n  transformers: " << ids_text(want_special) << "\n  anvil:        " << ids_text(framed);
    }
    const auto decoded = tok->decode(want, /*skip_special_tokens=*/false);
    if (decoded != want_text && decode_mismatches++ == 0)
      ADD_FAILURE() << name << ": first decode mismatch at corpus line " << i + 1 << " " << ids_text(want)
                    << "\n  reference: " << quoted(want_text) << "\n  anvil:     " << quoted(decoded);
    if (want_text == line) {  // the reference round-trips this line, so must we
      ++round_trips;
      EXPECT_EQ(tok->decode(got, false), line) << name << ": round trip of corpus line " << i + 1;
    }
  }
  EXPECT_EQ(id_mismatches, 0u) << name << ": lines whose ids differ";
  EXPECT_EQ(decode_mismatches, 0u) << name << ": lines whose decoded text differs";
  EXPECT_EQ(special_mismatches, 0u) << name << ": lines whose ids with special tokens differ";
  EXPECT_GT(round_trips, refs.lines.size() / 10) << name << ": the corpus should mostly round-trip";

  const auto meta = json::parse(fs::read_file(dir / "meta.json"));
  EXPECT_EQ(tok->bos_id(), meta["bos"].get<int64_t>()) << name;
  EXPECT_EQ(tok->eos_id(), meta["eos"].get<int64_t>()) << name;
  EXPECT_EQ(tok->pad_id(), meta["pad"].get<int64_t>()) << name;
  EXPECT_EQ(tok->add_bos(), meta["add_bos"].get<bool>()) << name;
}

TEST(TokenizerParity, Gpt2ByteLevel) {
  check_parity("gpt2", "gpt2");
  const auto tok = load_tokenizer("auto", references().dir.path() / "gpt2");
  EXPECT_EQ(tok->kind(), "hf");
  const auto im_start = tok->token_to_id("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  auto expected = tok->encode("user");
  expected.insert(expected.begin(), *im_start);
  EXPECT_EQ(tok->encode("<|im_start|>user"), expected);
  // Special added tokens are dropped by decode(ids) (skip_special_tokens),
  // the non-special <tool> is not.
  EXPECT_EQ(tok->decode(tok->encode("a<|im_start|>b<|endoftext|> <tool>")), "ab<tool>");
  EXPECT_FALSE(tok->token_to_id("no such token").has_value());
}

TEST(TokenizerParity, NeoxNfc) { check_parity("neox", "neox"); }

TEST(TokenizerParity, Llama3Split) {
  check_parity("llama3", "llama3/tokenizer.json");
  const auto tok = load_tokenizer("hf", references().dir.path() / "llama3");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), *tok->token_to_id("<|begin_of_text|>"));
}

TEST(TokenizerParity, GalacticaSplitsDigitsAndMarkers) {
  check_parity("galactica", "galactica");
  const auto tok = load_tokenizer("auto", references().dir.path() / "galactica");
  // The folder names no special tokens: the fairseq ids, as Galactica's code.
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->pad_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->add_bos());
  // Markers are single tokens; the split marker is cut out and leaves one
  // token per residue; digits stand alone.
  const auto start = tok->token_to_id("[START_AMINO]"), end = tok->token_to_id("[END_AMINO]");
  ASSERT_TRUE(start && end);
  std::vector<int64_t> expected{*start};
  for (const char* residue : {"M", "K", "V"}) expected.push_back(tok->encode(residue).at(0));
  expected.push_back(*end);
  EXPECT_EQ(tok->encode("[START_AMINO]MSPL1T-TH1S-Pl3A5EKSPL1T-TH1S-Pl3A5EV[END_AMINO]"), expected);
  EXPECT_EQ(tok->encode("2024").size(), 4u);
}

TEST(TokenizerParity, OptPrependsEndOfSequence) {
  check_parity("opt", "opt");  // checks transformers' ids with add_special_tokens=True too
  const auto tok = load_tokenizer("auto", references().dir.path() / "opt");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->bos_id(), tok->token_to_id("</s>"));
}

// Qwen2 / Qwen2.5 / Qwen3's pipeline as transformers' Qwen2TokenizerFast builds
// it: NFC, the Qwen split (digits one by one), byte-level BPE; ChatML markers
// are special, Qwen3's <think> and <tool_call> are added but not special.
TEST(TokenizerParity, Qwen2SplitAndAddedTokens) {
  check_parity("qwen2", "qwen2");
  const auto tok = load_tokenizer("auto", references().dir.path() / "qwen2");
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->eos_id(), *tok->token_to_id("<|im_end|>"));
  EXPECT_EQ(tok->encode("2024").size(), 4u);
  const auto think = tok->token_to_id("<think>");
  ASSERT_TRUE(think.has_value());
  EXPECT_EQ(tok->encode("<think>").size(), 1u);
  // decode(ids) drops special tokens, not the non-special <think>.
  EXPECT_EQ(tok->decode(tok->encode("<|im_start|>a<think>b<|im_end|>")), "a<think>b");
}

// Gemma 2 / 3's pipeline as transformers' GemmaTokenizerFast builds it: spaces
// to U+2581 by a normalizer, no prefix, BPE with byte fallback, <bos> added.
TEST(TokenizerParity, GemmaReplaceByteFallbackAndBos) {
  check_parity("gemma", "gemma");  // checks transformers' ids with add_special_tokens=True too
  const auto tok = load_tokenizer("auto", references().dir.path() / "gemma");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), *tok->token_to_id("<bos>"));
  EXPECT_EQ(tok->eos_id(), *tok->token_to_id("<eos>"));
  EXPECT_EQ(tok->pad_id(), *tok->token_to_id("<pad>"));
  EXPECT_EQ(tok->encode("<start_of_turn>user").front(), *tok->token_to_id("<start_of_turn>"));
}

// SentencePiece BPE with byte fallback as transformers converts it: Metaspace
// (prepend_scheme first, legacy=False; always, legacy=True), the Replace /
// ByteFallback / Fuse / Strip decoders.
TEST(TokenizerParity, SentencePieceConvertedMetaspaceFirst) {
  check_parity("llama_first", "llama_first");
  const auto tok = load_tokenizer("auto", references().dir.path() / "llama_first");
  EXPECT_EQ(tok->kind(), "hf");
  // Only the start of the text gets the prefix: not the text after an added token.
  const auto hello = tok->encode("hello");
  auto framed = hello;
  framed.insert(framed.begin(), *tok->token_to_id("<s>"));
  EXPECT_NE(tok->encode("<s>hello"), framed);
  EXPECT_EQ(tok->decode(tok->encode("naïve 😀 x")), "naïve 😀 x");  // 😀 by byte fallback
}

TEST(TokenizerParity, SentencePieceConvertedMetaspaceAlways) {
  check_parity("llama_always", "llama_always");
  const auto tok = load_tokenizer("auto", references().dir.path() / "llama_always");
  auto framed = tok->encode("hello");
  framed.insert(framed.begin(), *tok->token_to_id("<s>"));
  EXPECT_EQ(tok->encode("<s>hello"), framed);
}

TEST(TokenizerParity, Llama2PrependReplaceNormalizers) {
  check_parity("llama2", "llama2/tokenizer.json");
  const auto tok = load_tokenizer("auto", references().dir.path() / "llama2");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
}

TEST(TokenizerParity, MetaspaceNeverAndOlderForm) {
  check_parity("metaspace_never", "metaspace_never");
  check_parity("metaspace_old", "metaspace_old");
}

TEST(TokenizerParity, SentencePieceUnigram) { check_parity("sp_unigram", "sp_unigram/tokenizer.model"); }

TEST(TokenizerParity, SentencePieceBpe) {
  check_parity("sp_bpe", "sp_bpe/tokenizer.model");
  const auto tok = load_tokenizer("sentencepiece", references().dir.path() / "sp_bpe");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  // Control pieces are dropped by default and kept as their piece text on request.
  const auto ids = tok->encode("Hello world");
  auto framed = ids;
  framed.insert(framed.begin(), tok->bos_id());
  framed.push_back(tok->eos_id());
  EXPECT_EQ(tok->decode(framed), tok->decode(ids));
  EXPECT_EQ(tok->decode(framed, false), "<s>" + tok->decode(ids) + "</s>");
  EXPECT_EQ(tok->token_to_id("<s>"), tok->bos_id());
  EXPECT_EQ(tok->token_to_id("<unk>"), 0);
  EXPECT_FALSE(tok->token_to_id("certainly not a piece").has_value());
}

// ---------------------------------------------------------------- loading without the references

// A minimal byte-level BPE tokenizer.json: "a" + "b" merge, one added token.
json tiny_tokenizer() {
  return json::parse(R"({
    "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": true, "normalized": false,
                      "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]}
  })");
}

void write_json(const stdfs::path& file, const json& j) { anvil::testing::write_text(file, j.dump()); }

std::string load_error(const std::string& type, const stdfs::path& path) {
  try {
    load_tokenizer(type, path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerLoading, DefaultsWithoutConfigSaveAndReload) {
  anvil::testing::TempDir dir, copy;
  write_json(dir / "tokenizer.json", tiny_tokenizer());
  const auto tok = load_tokenizer("auto", dir.path());
  EXPECT_EQ(tok->encode("ab a<|endoftext|>"), (std::vector<int64_t>{2, 3, 0, 4}));
  EXPECT_EQ(tok->eos_id(), 4);  // <|endoftext|> when nothing says otherwise
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->pad_id(), -1);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->vocab_size(), 5);
  // Invalid UTF-8 is read as Python would decode it with errors="replace".
  EXPECT_EQ(tok->encode("a\xff"), tok->encode("a\xef\xbf\xbd"));

  write_json(dir / "tokenizer_config.json",
             {{"bos_token", "a"}, {"eos_token", {{"content", "b"}}}, {"pad_token", nullptr}, {"add_bos_token", true}});
  anvil::testing::write_text(dir / "tokenizer.model", "not read: tokenizer.json comes first");
  EXPECT_TRUE(has_tokenizer(dir.path()));
  const auto configured = load_tokenizer_from_model_dir(dir.path());
  EXPECT_EQ(configured->kind(), "hf");
  EXPECT_EQ(configured->bos_id(), 0);
  EXPECT_EQ(configured->eos_id(), 1);
  EXPECT_TRUE(configured->add_bos());
  EXPECT_EQ(configured->decode({0, 2, 1, 4}), "ab");  // BOS, EOS and special added tokens dropped
  EXPECT_EQ(configured->decode({0, 2, 1, 4}, false), "aabb<|endoftext|>");

  configured->save(copy.path());
  configured->save(dir.path());  // onto itself: nothing to do
  EXPECT_TRUE(stdfs::exists(copy / "tokenizer.json"));
  EXPECT_TRUE(stdfs::exists(copy / "tokenizer_config.json"));
  const auto reloaded = load_tokenizer_from_model_dir(copy.path());
  EXPECT_EQ(reloaded->bos_id(), 0);
  EXPECT_EQ(reloaded->encode("ab a"), configured->encode("ab a"));
}

TEST(TokenizerLoading, FolderWithAnUnsupportedTokenizerJsonFallsBackToTokenizerModel) {
  anvil::testing::TempDir dir;
  // A folder whose tokenizer.json is a SentencePiece unigram conversion.
  anvil::testing::write_text(
      dir / "tokenizer.json",
      R"({"model": {"type": "Unigram", "vocab": [], "byte_fallback": true},)"
      R"( "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}, "added_tokens": []})");
  std::string err;
  try {
    load_tokenizer_from_model_dir(dir.path());
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << err;  // alone, its error is reported
  stdfs::copy_file(anvil::testing::source_dir() + "/data/tokenizer.model", dir / "tokenizer.model");
  auto tok = load_tokenizer_from_model_dir(dir.path());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->decode(tok->encode("reverse: abc")), "reverse: abc");
}

TEST(TokenizerErrors, MessagesNameFileAndKey) {
  anvil::testing::TempDir dir;
  const auto file = (dir / "tokenizer.json").string();
  const auto expect_error = [&](const json& spec, const std::string& what) {
    write_json(dir / "tokenizer.json", spec);
    const auto msg = load_error("hf", dir.path());
    EXPECT_NE(msg.find(file + ": " + what), std::string::npos) << msg;
  };

  anvil::testing::write_text(dir / "tokenizer.json", "{\"model\": ");
  EXPECT_NE(load_error("auto", dir / "tokenizer.json").find(file + ": not valid JSON"), std::string::npos);

  auto spec = tiny_tokenizer();
  spec["model"]["type"] = "WordPiece";
  expect_error(spec, "model.type: unsupported model \"WordPiece\"; expected BPE");

  spec = tiny_tokenizer();
  spec["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]})");
  expect_error(spec,
               "pre_tokenizer.pretokenizers[0].type: unsupported pre-tokenizer \"Whitespace\"; "
               "expected ByteLevel, Split, Digits, Metaspace or Sequence");

  spec = tiny_tokenizer();
  spec["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(spec, "pre_tokenizer.replacement: missing");

  spec = tiny_tokenizer();
  spec["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "__"}};
  expect_error(spec, "pre_tokenizer.replacement: expected a single character, got \"__\"");

  spec = tiny_tokenizer();
  spec["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
  expect_error(spec, "pre_tokenizer.prepend_scheme: unsupported scheme \"sometimes\"; expected first, always or never");

  spec = tiny_tokenizer();
  spec["decoder"] = {{"type", "CTC"}};
  expect_error(spec,
               "decoder.type: unsupported decoder \"CTC\"; "
               "expected ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace or Sequence");

  spec = tiny_tokenizer();
  spec["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "WordPiece"}]})");
  expect_error(spec, "decoder.decoders[1].type: unsupported decoder \"WordPiece\"");

  spec = tiny_tokenizer();
  spec["decoder"] = json::parse(R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})");
  expect_error(spec, "decoder.start: expected a non-negative integer");

  spec = tiny_tokenizer();
  spec["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"Glob": "*"}, "content": ""})");
  expect_error(spec, "normalizer.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");

  spec = tiny_tokenizer();
  spec["model"].erase("merges");
  expect_error(spec, "model.merges: missing");

  spec = tiny_tokenizer();
  spec["model"]["merges"] = {"a c"};
  expect_error(spec, "model.merges[0]: \"c\" is not in model.vocab");

  spec = tiny_tokenizer();
  spec["normalizer"] = {{"type", "Lowercase"}};
  expect_error(spec, "normalizer.type: unsupported normalizer \"Lowercase\"");

  spec = tiny_tokenizer();
  spec["model"]["byte_fallback"] = "yes";
  expect_error(spec, "model.byte_fallback: expected true or false");

  spec = tiny_tokenizer();
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error(spec, "pre_tokenizer.pattern.Regex: cannot compile regex");

  write_json(dir / "tokenizer.json", tiny_tokenizer());
  write_json(dir / "tokenizer_config.json", {{"eos_token", "<|nope|>"}});
  const auto msg = load_error("auto", dir.path());
  EXPECT_NE(
      msg.find((dir / "tokenizer_config.json").string() + ": eos_token: token \"<|nope|>\" is not in the vocabulary"),
      std::string::npos)
      << msg;

  try {
    load_tokenizer("tiktoken", dir.path());
    ADD_FAILURE() << "unknown type accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "tokenizer.type: unknown tokenizer type \"tiktoken\"; expected auto, hf or sentencepiece");
  }
  anvil::testing::TempDir empty;
  EXPECT_FALSE(has_tokenizer(empty.path()));
  EXPECT_NE(load_error("auto", empty.path()).find("no tokenizer found"), std::string::npos);
}

TEST(TokenizerParity, SentencePieceConfigErrorsNameFileAndKey) {
  const auto& refs = references();
  ASSERT_TRUE(refs.ok) << refs.log;
  anvil::testing::TempDir dir;
  stdfs::copy_file(refs.dir.path() / "sp_bpe" / "tokenizer.model", dir / "tokenizer.model");
  write_json(dir / "tokenizer_config.json", {{"pad_token", "<pad-nowhere>"}});
  const auto msg = load_error("auto", dir.path());
  EXPECT_NE(msg.find((dir / "tokenizer_config.json").string() +
                     ": pad_token: token \"<pad-nowhere>\" is not in the vocabulary"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace anvil::tokenizer
