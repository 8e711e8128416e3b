// GPT-NeoX / Megatron indexed datasets against megatron-core itself (PyPI;
// tests/parity/megatron_datasets.py): its IndexedDatasetBuilder's files, in
// every dtype, read in place give its token streams and document boundaries;
// `anvil prepare --format megatron` writes files its IndexedDataset reads as
// the same documents as Anvil's own shards; pretraining mixes both formats
// in one data.train list; damaged files are named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "anvil/core/error.h"
#include "data/token_shards.h"
#include "test_util.h"

namespace anvil::data {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

std::string python(const std::string& args) {
  std::string out;
  const auto cmd = anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                   "/tests/parity/megatron_datasets.py " + args + " 2>/dev/null";
  EXPECT_EQ(run(cmd, &out), 0) << cmd << "\n" << out;
  return out;
}

std::vector<std::vector<int64_t>> documents(const TokenShards& ts) { return anvil::testing::shard_documents(ts); }

TEST(Megatron, EveryDtypeOfMegatronCoreReadsInPlaceWithItsDocuments) {
  TempDir dir;
  python("write " + (dir / "mc").string());
  const auto expected = nlohmann::json::parse(anvil::testing::read_text(dir / "mc" / "expected.json"));
  ASSERT_EQ(expected.size(), 8u);
  for (const auto& [dtype, docs] : expected.items()) {
    SCOPED_TRACE(dtype);
    const auto prefix = dir / "mc" / dtype;
    ASSERT_TRUE(is_megatron_dataset(prefix));
    EXPECT_TRUE(is_megatron_dataset(stdfs::path(prefix.string() + ".bin")));
    const auto ts = TokenShards::open_megatron(prefix);
    EXPECT_EQ(documents(*ts), docs.get<std::vector<std::vector<int64_t>>>());
    int64_t tokens = 0, top = 0;
    for (const auto& d : docs)
      for (const auto& t : d) ++tokens, top = std::max(top, t.get<int64_t>());
    EXPECT_EQ(ts->num_tokens(), tokens);
    EXPECT_EQ(ts->num_docs(), static_cast<int64_t>(docs.size()));
    EXPECT_EQ(ts->vocab_size(), top + 1);
  }
}

TEST(Megatron, PrepareWritesWhatMegatronCoreReadsAsAnvilsOwnShards) {
  TempDir dir;
  std::ofstream(dir / "docs.jsonl") << R"({"text": "upper: abc\nABC"})"
                                    << "\n"
                                    << R"({"text": "add: 12+30\n42"})"
                                    << "\n"
                                    << R"({"text": "a longer document, with punctuation; and digits 0123"})"
                                    << "\n";
  const auto prep = anvil::testing::cli_bin() + " prepare --tokenizer " + anvil::testing::source_dir() +
                    "/data/tokenizer.model --input " + (dir / "docs.jsonl").string();
  std::string log;
  ASSERT_EQ(run(prep + " --output " + (dir / "shards").string() + " 2>&1", &log), 0) << log;
  ASSERT_EQ(run(prep + " --format megatron --output " + (dir / "mg" / "docs_text_document").string() + " 2>&1", &log),
            0)
      << log;
  const auto ours = documents(*TokenShards::open(dir / "shards"));
  const auto theirs = nlohmann::json::parse(python("read " + (dir / "mg" / "docs_text_document").string()));
  EXPECT_EQ(theirs.get<std::vector<std::vector<int64_t>>>(), ours);
  EXPECT_EQ(documents(*TokenShards::open_megatron(dir / "mg" / "docs_text_document")), ours);
  // An existing prefix is refused, not overwritten.
  EXPECT_NE(run(prep + " --format megatron --output " + (dir / "mg" / "docs_text_document").string() + " 2>&1", &log),
            0);
  EXPECT_NE(log.find("exists"), std::string::npos) << log;
}

TEST(Megatron, PretrainingMixesMegatronAndAnvilShards) {
  TempDir dir;
  python("write " + (dir / "mc").string());
  std::string log;
  const auto prep = anvil::testing::cli_bin() + " prepare --tokenizer " + anvil::testing::source_dir() +
                    "/data/tokenizer.model --input " + anvil::testing::source_dir() +
                    "/data/sft_eval.jsonl --text-field prompt --text-field response";
  ASSERT_EQ(run(prep + " --output " + (dir / "shards").string() + " 2>&1", &log), 0) << log;
  ASSERT_EQ(run(prep + " --format megatron --output " + (dir / "mg" / "eval").string() + " 2>&1", &log), 0) << log;
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                   " --config configs/pretrain_tiny.yaml output_dir=" + (dir / "out").string() +
                   " 'data.train=[{path: " + (dir / "shards").string() +
                   ", weight: 1}, {path: " + (dir / "mg" / "eval").string() +
                   ", weight: 1}]' data.max_length=16 train.max_steps=4 "
                   "train.save_every=4 train.eval_every=0 schedule.warmup_steps=1 train.threads=1 2>&1";
  ASSERT_EQ(run(cmd, &log), 0) << log;
  EXPECT_NE(log.find((dir / "mg" / "eval").string() + ": "), std::string::npos) << log;
  // Token ids past the tokenizer's vocabulary are named.
  const auto bad = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                   " --config configs/pretrain_tiny.yaml output_dir=" + (dir / "bad").string() +
                   " 'data.train=[{path: " + (dir / "mc" / "int32").string() +
                   "}]' train.max_steps=4 schedule.warmup_steps=1 2>&1";
  EXPECT_NE(run(bad, &log), 0);
  EXPECT_NE(log.find("holds token ids up to"), std::string::npos) << log;
}

TEST(Megatron, DamagedFilesAreNamed) {
  TempDir dir;
  python("write " + (dir / "mc").string());
  const auto prefix = dir / "mc" / "int32";
  stdfs::resize_file(prefix.string() + ".bin", stdfs::file_size(prefix.string() + ".bin") - 4);
  try {
    TokenShards::open_megatron(prefix);
    ADD_FAILURE() << "a short .bin was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("int32.bin: "), std::string::npos) << e.what();
  }
  anvil::testing::write_text(dir / "mc" / "uint8.idx", "not an index");
  try {
    TokenShards::open_megatron(dir / "mc" / "uint8");
    ADD_FAILURE() << "a bad header was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("uint8.idx: not a Megatron indexed dataset index"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace anvil::data
