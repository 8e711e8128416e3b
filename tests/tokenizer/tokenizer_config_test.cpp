// tokenizer_config.json as a saved folder (a checkpoint, an export) writes
// it: the source's keys kept as transformers would write them back.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "anvil/tokenizer/tokenizer.h"
#include "test_util.h"

namespace anvil::tokenizer {
namespace {

using anvil::testing::read_text;
using anvil::testing::TempDir;
using anvil::testing::write_text;
namespace stdfs = std::filesystem;

// transformers writes a tokenizer that records no length limit with
// model_max_length = VERY_LARGE_INTEGER, int(1e30) =
// 1000000000000000019884624838656. Read back as a double, it was written as
// the float 1e+30 (issue 59); it is written as the integer again, and
// Python's json reads back the int transformers wrote. Other numbers stay as
// they were.
TEST(TokenizerConfig, ASavedFolderKeepsTransformersVeryLargeInteger) {
  TempDir dir;
  const auto from = dir / "from", to = dir / "to";
  stdfs::create_directories(from);
  stdfs::create_directories(to);
  load_tokenizer("sentencepiece", anvil::testing::source_dir() + "/data/tokenizer.model")->save(from);
  auto cfg = nlohmann::json::parse(read_text(from / "tokenizer_config.json"));
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["some_ratio"] = 0.5;
  cfg["nested"] = {{"big", 1}, {"limits", {4096, 2}}};
  // nlohmann::json cannot hold the integer: it is spliced into the text as transformers writes it.
  auto text = cfg.dump(2);
  const std::string very_large = "1000000000000000019884624838656";
  text.insert(text.find('{') + 1, "\n  \"model_max_length\": " + very_large + ",");
  text.replace(text.find("\"big\": 1"), 8, "\"big\": " + very_large);
  write_text(from / "tokenizer_config.json", text);

  load_tokenizer_from_model_dir(from)->save(to);
  const auto saved = read_text(to / "tokenizer_config.json");
  EXPECT_NE(saved.find("\"model_max_length\": " + very_large + ","), std::string::npos) << saved;
  EXPECT_NE(saved.find("\"big\": " + very_large), std::string::npos) << saved;
  EXPECT_EQ(saved.find("e+30"), std::string::npos) << saved;
  const auto j = nlohmann::json::parse(saved);
  EXPECT_EQ(j["some_ratio"], 0.5);
  EXPECT_EQ(j["nested"]["limits"], nlohmann::json({4096, 2}));
  EXPECT_EQ(j["clean_up_tokenization_spaces"], false);
  std::string out;
  ASSERT_EQ(
      anvil::testing::run(anvil::testing::python_bin() + " -c 'import json, sys; c = json.load(open(sys.argv[1]))" +
                              "; v = c[\"model_max_length\"]; print(type(v).__name__, v == int(1e30))' " +
                              (to / "tokenizer_config.json").string(),
                          &out),
      0)
      << out;
  EXPECT_EQ(out, "int True\n");
}

}  // namespace
}  // namespace anvil::tokenizer
