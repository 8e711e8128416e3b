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
                                (dir / "in.txt").string() + " --output " + (dir / "ids.jsonl").string(), &out), 0)
      << out;
  auto lib = load_tokenizer("sentencepiece", tok);
  std::istringstream ids(anvil::testing::read_text(dir / "ids.jsonl"));
  std::string line;
  for (const auto& l : lines) {
    ASSERT_TRUE(std::getline(ids, line));
    EXPECT_EQ(nlohmann::json::parse(line).get<std::vector<int64_t>>(), lib->encode(l)) << l;
  }
  ASSERT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " tokenize --decode --tokenizer " + tok + " --input " +
                                (dir / "ids.jsonl").string() + " --output " + (dir / "back.txt").string(), &out), 0)
      << out;
  EXPECT_EQ(anvil::testing::read_text(dir / "back.txt"), text);
}

}  // namespace
}  // namespace anvil::tokenizer
