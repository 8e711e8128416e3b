// The `anvil generate` (ids and text), `anvil chat` and EOS handling from the
// command line, on a tiny LLaMA saved with the bundled tokenizer.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "anvil/generation/generate.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "models/llama/llama.h"
#include "anvil/tokenizer/tokenizer.h"
#include "test_util.h"

namespace anvil::generation {
namespace {

using anvil::testing::run;

class CliGenerate : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(5);
    models::llama::LlamaOptions o;
    o.vocab_size(326)
        .hidden_size(32)
        .intermediate_size(64)
        .num_hidden_layers(2)
        .num_attention_heads(4)
        .num_key_value_heads(2)
        .max_position_embeddings(48)
        .initializer_range(0.2);
    model_ = std::make_shared<models::llama::LlamaForCausalLM>(o);
    model_->special_tokens = {1, 2, 3};
    auto tok = tokenizer::load_tokenizer("sentencepiece", anvil::testing::source_dir() + "/data/tokenizer.model");
    checkpoint::save_model_dir(dir_.path(), *model_, tok.get());
    anvil::testing::write_text(dir_ / "ids.json", "[[5, 6, 7, 8, 9], [10], [11, 12, 13]]");
  }
  std::string generate(const std::string& flags) {
    std::string out;
    const auto cmd = anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --input " +
                     (dir_ / "ids.json").string() + " --output " + (dir_ / "out.json").string() + " " + flags;
    EXPECT_EQ(run(cmd, &out), 0) << out;
    return anvil::testing::read_text(dir_ / "out.json");
  }
  anvil::testing::TempDir dir_;
  std::shared_ptr<models::CausalLM> model_;
};

TEST_F(CliGenerate, IdsInIdsOutMatchTheLibraryAndSamplingIsSeeded) {
  const auto greedy = nlohmann::json::parse(generate("--max-new-tokens 7 --eos-id -1"));
  SamplingOptions opt;
  opt.max_new_tokens = 7;
  EXPECT_EQ(greedy.get<std::vector<std::vector<int64_t>>>(),
            anvil::generation::generate(*model_, {{5, 6, 7, 8, 9}, {10}, {11, 12, 13}}, opt));
  const auto a = generate("--max-new-tokens 7 --eos-id -1 --temperature 1.5 --top-k 50 --top-p 0.95 --seed 1");
  const auto b = generate("--max-new-tokens 7 --eos-id -1 --temperature 1.5 --top-k 50 --top-p 0.95 --seed 1");
  const auto c = generate("--max-new-tokens 7 --eos-id -1 --temperature 1.5 --top-k 50 --top-p 0.95 --seed 2");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const auto& row : nlohmann::json::parse(a)) EXPECT_EQ(row.size(), 7u);
}

// --device and --dtype (generate, chat, logits, score): bfloat16 weights give
// logits close to float32's; a CUDA device on a machine without one is refused.
TEST_F(CliGenerate, DeviceAndDtypeFlags) {
  anvil::testing::write_text(dir_ / "eq.json", "[[5, 6, 7, 8], [9, 10, 11, 12]]");
  auto logits = [&](const std::string& flags) {
    std::string out;
    const auto path = dir_ / "logits.safetensors";
    EXPECT_EQ(run(anvil::testing::cli_bin() + " logits --model " + dir_.path().string() + " --input " +
                      (dir_ / "eq.json").string() + " --output " + path.string() + " " + flags + " 2>&1",
                  &out),
              0)
        << out;
    return io::SafetensorsFile(path).get("logits");
  };
  const auto f32 = logits(""), bf16 = logits("--device cpu --dtype bfloat16");
  ASSERT_EQ(f32.sizes(), bf16.sizes());
  EXPECT_EQ(bf16.scalar_type(), at::kFloat);  // written as float32 whatever the compute dtype
  EXPECT_LE((f32 - bf16).abs().max().item<double>(), 0.05 * f32.abs().max().item<double>());
  EXPECT_EQ(nlohmann::json::parse(generate("--max-new-tokens 4 --eos-id -1 --dtype bfloat16")).size(), 3u);
  if (!at::hasCUDA()) {
    std::string out;
    EXPECT_NE(
        run(anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --prompt hi --device cuda 2>&1",
            &out),
        0);
    EXPECT_NE(out.find("--device: cuda, but this machine has no CUDA device"), std::string::npos) << out;
  }
}

TEST_F(CliGenerate, EosStopsEachSequenceAndIsKept) {
  // Take the first greedy token of prompt 0 as "EOS": that row stops at once,
  // the others go on until they produce it or run out of budget.
  const auto free_run = nlohmann::json::parse(generate("--max-new-tokens 6 --eos-id -1"));
  const int64_t eos = free_run[0][0].get<int64_t>();
  const auto stopped = nlohmann::json::parse(generate("--max-new-tokens 6 --eos-id " + std::to_string(eos)));
  ASSERT_EQ(stopped.size(), 3u);
  EXPECT_EQ(stopped[0], nlohmann::json::array({eos}));
  for (size_t r = 1; r < 3; ++r) {
    std::vector<int64_t> want;
    for (const auto& t : free_run[r]) {
      want.push_back(t.get<int64_t>());
      if (want.back() == eos) break;
    }
    EXPECT_EQ(stopped[r].get<std::vector<int64_t>>(), want) << r;
  }
}

TEST_F(CliGenerate, ChatAnswersEveryLineAndBadIdsAreReported) {
  std::string out;
  const auto chat = "printf 'reverse: abc\\nupper: hi\\n' | " + anvil::testing::cli_bin() + " chat --model " +
                    dir_.path().string() + " --max-new-tokens 5 2>/dev/null";
  ASSERT_EQ(run(chat, &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;

  anvil::testing::write_text(dir_ / "bad.json", "[[1, 2], [3, 999]]");
  const auto bad = anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --input " +
                   (dir_ / "bad.json").string() + " --output " + (dir_ / "o.json").string();
  EXPECT_EQ(run(bad, &out), 2);
  EXPECT_NE(out.find("bad.json: entry 1: token id 999 is outside [0, 326)"), std::string::npos) << out;
}

// A prompt that leaves the model (48 positions) no room is refused, naming
// it, its length and the limit; --truncate left keeps its last tokens and
// says so; a reply the positions cut is reported; chat refuses such a line.
TEST_F(CliGenerate, APromptLongerThanThePositionsIsRefusedOrTruncatedOnRequest) {
  std::vector<int64_t> long_ids(60, 7);
  anvil::testing::write_text(dir_ / "long.json", nlohmann::json::array({std::vector<int64_t>{5, 6}, long_ids}).dump());
  const auto gen = anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --input " +
                   (dir_ / "long.json").string() + " --output " + (dir_ / "o.json").string() +
                   " --max-new-tokens 4 --eos-id -1";
  std::string out;
  EXPECT_NE(run(gen + " 2>&1", &out), 0);
  EXPECT_NE(out.find("long.json: entry 1: the prompt is 60 tokens; the model reads at most 48 positions, prompt and "
                     "reply together, so a prompt may hold 47; shorten it, or pass --truncate left"),
            std::string::npos)
      << out;
  ASSERT_EQ(run(gen + " --truncate left 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("long.json: entry 1: the prompt is 60 tokens; kept its last 44 (--truncate left"),
            std::string::npos)
      << out;
  const auto rows = nlohmann::json::parse(anvil::testing::read_text(dir_ / "o.json"));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].size(), 4u);
  // 46 tokens leave room for 2 of the 4 new tokens asked for: generated, and said.
  anvil::testing::write_text(dir_ / "near.json", nlohmann::json::array({std::vector<int64_t>(46, 7)}).dump());
  ASSERT_EQ(run(anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --input " +
                    (dir_ / "near.json").string() + " --output " + (dir_ / "o.json").string() +
                    " --max-new-tokens 4 --eos-id -1 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("near.json: entry 0: the reply is cut at 2 tokens"), std::string::npos) << out;
  EXPECT_EQ(nlohmann::json::parse(anvil::testing::read_text(dir_ / "o.json"))[0].size(), 2u);

  // A reply is reported cut only when the positions cut it: one that ends
  // within them is whole (the quickstart's own "try it" line, 32 new tokens
  // on 32 positions, was warned about before each reply ended). Each reply
  // gets every position its own prompt leaves, whatever the other prompts.
  anvil::testing::write_text(dir_ / "two.json",
                             nlohmann::json::array({std::vector<int64_t>(40, 7), std::vector<int64_t>(30, 8)}).dump());
  const auto two = anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --input " +
                   (dir_ / "two.json").string() + " --output " + (dir_ / "o.json").string() + " --max-new-tokens 32";
  ASSERT_EQ(run(two + " --eos-id -1 2>&1", &out), 0) << out;
  const auto cut = nlohmann::json::parse(anvil::testing::read_text(dir_ / "o.json"));
  ASSERT_EQ(cut[0].size(), 8u);
  EXPECT_EQ(cut[1].size(), 18u);
  EXPECT_NE(out.find("two.json: entry 0: the reply is cut at 8 tokens, where the model's 48 positions end (a "
                     "40-token prompt, --max-new-tokens 32)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("two.json: entry 1: the reply is cut at 18 tokens"), std::string::npos) << out;
  // Entry 0's first token as the end of sequence: that reply ends at once, and only entry 1's is cut.
  ASSERT_EQ(run(two + " --eos-id " + std::to_string(cut[0][0].get<int64_t>()) + " 2>&1", &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(anvil::testing::read_text(dir_ / "o.json"))[0].size(), 1u);
  EXPECT_EQ(out.find("entry 0: the reply is cut"), std::string::npos) << out;

  // Text: a --prompt, and a chat line, of about 80 tokens.
  std::string text;
  for (int i = 0; i < 20; ++i) text += "reverse: abc ";
  EXPECT_NE(
      run(anvil::testing::cli_bin() + " generate --model " + dir_.path().string() + " --prompt '" + text + "' 2>&1",
          &out),
      0);
  EXPECT_NE(out.find("--prompt 1: the prompt is "), std::string::npos) << out;
  const auto chat = "printf 'hi\n" + text + "\n' | " + anvil::testing::cli_bin() + " chat --model " +
                    dir_.path().string() + " --max-new-tokens 4";
  EXPECT_NE(run(chat + " 2>&1", &out), 0);
  EXPECT_NE(out.find("line 2: the prompt is "), std::string::npos) << out;
  ASSERT_EQ(run(chat + " --truncate left 2>/dev/null", &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
}

}  // namespace
}  // namespace anvil::generation
