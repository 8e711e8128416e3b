// `anvil tokenize` and `--decode`: ids match the library, decode round-trips.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "anvil/tokenizer/tokenizer.h"
#include "test_util.h"

namespace anvil::tokenizer {
namespace {

TEST(TokenizeCli, EncodesLinesAndDecodesThemBack) {
  anvil::testing::TempDir dir;
  const std::string tok = anvil::testing::source_dir() + "/data/tokenizer.model";
  const std::vector<std::string> lines = {"reverse: anvil", "add: 19+23", "héllo wörld ✓", "  two  spaces"};
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  anvil::testing::write_text(dir / "in.txt", text);
  std::string out;
  ASSERT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " tokenize --tokenizer " + tok + " --input " +
                                    (dir / "in.txt").string() + " --output " + (dir / "ids.jsonl").string(),
                                &out),
            0)
      << out;
  auto lib = load_tokenizer("sentencepiece", tok);
  std::istringstream ids(anvil::testing::read_text(dir / "ids.jsonl"));
  std::string line;
  for (const auto& l : lines) {
    ASSERT_TRUE(std::getline(ids, line));
    EXPECT_EQ(nlohmann::json::parse(line).get<std::vector<int64_t>>(), lib->encode(l)) << l;
  }
  ASSERT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " tokenize --decode --tokenizer " + tok + " --input " +
                                    (dir / "ids.jsonl").string() + " --output " + (dir / "back.txt").string(),
                                &out),
            0)
      << out;
  EXPECT_EQ(anvil::testing::read_text(dir / "back.txt"), text);
}

TEST(TokenizeCli, HfTokenizerFolderWithSpecialTokens) {
  anvil::testing::TempDir dir;
  std::string out;
  ASSERT_EQ(anvil::testing::run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                                    "/tests/parity/make_chat_references.py " + dir.path().string() + " 2>&1",
                                &out),
            0)
      << out;
  const auto tok = (dir / "tok").string();  // a folder: tokenizer.json + tokenizer_config.json
  const std::vector<std::string> lines = {"<|im_start|>user", "Grün — ein schönes Wort 🌿</s>", "   "};
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  anvil::testing::write_text(dir / "in.txt", text);
  const auto cli = anvil::testing::cli_bin();
  ASSERT_EQ(anvil::testing::run(cli + " tokenize --tokenizer " + tok + " --input " + (dir / "in.txt").string() +
                                    " --output " + (dir / "ids.jsonl").string(),
                                &out),
            0)
      << out;
  auto lib = load_tokenizer("auto", tok);
  EXPECT_EQ(lib->kind(), "hf");
  std::istringstream ids(anvil::testing::read_text(dir / "ids.jsonl"));
  std::string line;
  for (const auto& l : lines) {
    ASSERT_TRUE(std::getline(ids, line));
    EXPECT_EQ(nlohmann::json::parse(line).get<std::vector<int64_t>>(), lib->encode(l)) << l;
  }
  EXPECT_EQ(lib->encode("<|im_start|>")[0], *lib->token_to_id("<|im_start|>"));
  ASSERT_EQ(anvil::testing::run(cli + " tokenize --decode --keep-special-tokens --tokenizer " + tok + " --input " +
                                    (dir / "ids.jsonl").string() + " --output " + (dir / "back.txt").string(),
                                &out),
            0)
      << out;
  EXPECT_EQ(anvil::testing::read_text(dir / "back.txt"), text);
  // Without the flag, special tokens are dropped.
  ASSERT_EQ(anvil::testing::run(cli + " tokenize --decode --tokenizer " + tok + " --input " +
                                    (dir / "ids.jsonl").string() + " --output " + (dir / "plain.txt").string(),
                                &out),
            0)
      << out;
  EXPECT_EQ(anvil::testing::read_text(dir / "plain.txt"), "user\nGrün — ein schönes Wort 🌿\n   \n");
}

}  // namespace
}  // namespace anvil::tokenizer
