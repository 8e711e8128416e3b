// MosaicML streaming (MDS) folders against mosaicml-streaming itself (PyPI;
// tests/parity/mds_datasets.py): folders its MDSWriter writes, uncompressed
// and zstd, tokens as bytes or ndarray of several dtypes, several shards,
// read in place give the token lists it was given, one document per sample;
// pretraining mixes an MDS folder with Anvil's own shards in one data.train
// list; damaged or foreign folders are named.
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

void python(const std::string& args) {
  std::string out;
  const auto cmd = anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                   "/tests/parity/mds_datasets.py " + args + " 2>&1";
  ASSERT_EQ(run(cmd, &out), 0) << cmd << "\n" << out;
}

std::vector<std::vector<int64_t>> documents(const TokenShards& ts) { return anvil::testing::shard_documents(ts); }

/// What opening `dir` throws ("" if it opens).
std::string open_error(const stdfs::path& dir, const MdsOptions& opt = {}) {
  try {
    TokenShards::open_mds(dir, opt);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

MdsOptions options_for(const std::string& name) {
  MdsOptions opt;
  if (name.rfind("bytes_int32", 0) == 0) opt.bytes_dtype = "int32";
  return opt;
}

TEST(Mds, FoldersOfMosaicStreamingReadInPlaceAsItsSamples) {
  TempDir dir;
  python("write " + (dir / "mds").string());
  const auto expected = nlohmann::json::parse(anvil::testing::read_text(dir / "mds" / "expected.json"));
  ASSERT_EQ(expected.size(), 6u);
  for (const auto& [name, docs] : expected.items()) {
    SCOPED_TRACE(name);
    const auto folder = dir / "mds" / name;
    ASSERT_TRUE(is_mds_dataset(folder));
    const auto ts = TokenShards::open_mds(folder, options_for(name));
    const auto want = docs.get<std::vector<std::vector<int64_t>>>();
    EXPECT_EQ(documents(*ts), want);
    EXPECT_GT(ts->shards().size(), 1u);
    int64_t tokens = 0, top = 0;
    for (const auto& d : want)
      for (const auto t : d) ++tokens, top = std::max(top, t);
    EXPECT_EQ(ts->num_tokens(), tokens);
    EXPECT_EQ(ts->num_docs(), static_cast<int64_t>(want.size()));
    EXPECT_EQ(ts->vocab_size(), top + 1);
    // Windows read across the samples' headers as one token stream per shard.
    const auto& s = ts->shards().front();
    std::vector<int64_t> stream(static_cast<size_t>(s.tokens));
    ts->read(s, 0, s.tokens, stream.data());
    std::vector<int64_t> joined;
    for (int64_t d = 0; d < s.docs; ++d) joined.insert(joined.end(), want[d].begin(), want[d].end());
    EXPECT_EQ(stream, joined);
  }
  // streaming's local cache keeps zstd shards decompressed, index.json as it was.
  ASSERT_TRUE(stdfs::exists(dir / "mds" / "streaming_cache" / "shard.00000.mds"));
  ASSERT_FALSE(stdfs::exists(dir / "mds" / "streaming_cache" / "shard.00000.mds.zstd"));
  EXPECT_EQ(documents(*TokenShards::open_mds(dir / "mds" / "streaming_cache")),
            expected["ndarray_dynamic_zstd"].get<std::vector<std::vector<int64_t>>>());
  // A folder without index.json, or whose shards are another streaming format, is not MDS.
  EXPECT_FALSE(is_mds_dataset(dir / "mds"));
  auto index = anvil::testing::read_text(dir / "mds" / "ndarray_uint16" / "index.json");
  index.replace(index.find("\"format\": \"mds\""), 15, "\"format\": \"jsonl\"");
  anvil::testing::write_text(dir / "mds" / "ndarray_uint16" / "index.json", index);
  EXPECT_FALSE(is_mds_dataset(dir / "mds" / "ndarray_uint16"));
  EXPECT_NE(open_error(dir / "mds" / "ndarray_uint16").find("index.json: shards[0].format: \"jsonl\"; Anvil reads MDS"),
            std::string::npos);
}

TEST(Mds, PretrainingMixesAnMdsFolderAndAnvilShards) {
  TempDir dir;
  python("tokens " + (dir / "c4_mds").string() + " 326 " + (dir / "big_mds").string() + " 100000");
  std::string log;
  const auto prep = anvil::testing::cli_bin() + " prepare --tokenizer " + anvil::testing::source_dir() +
                    "/data/tokenizer.model --input " + anvil::testing::source_dir() +
                    "/data/sft_eval.jsonl --text-field prompt --text-field response";
  ASSERT_EQ(run(prep + " --output " + (dir / "shards").string() + " 2>&1", &log), 0) << log;
  const auto train = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                     " --config configs/pretrain_tiny.yaml data.max_length=16 train.max_steps=4 train.save_every=4 "
                     "train.eval_every=0 schedule.warmup_steps=1 train.threads=1 ";
  const auto cmd = train + "output_dir=" + (dir / "out").string() +
                   " 'data.train=[{path: " + (dir / "shards").string() +
                   ", weight: 1}, {path: " + (dir / "c4_mds").string() + ", weight: 1}]' 2>&1";
  ASSERT_EQ(run(cmd, &log), 0) << log;
  EXPECT_NE(log.find((dir / "c4_mds").string() + ": "), std::string::npos) << log;
  EXPECT_NE(log.find("60 documents"), std::string::npos) << log;
  // Token ids past the tokenizer's vocabulary are named.
  EXPECT_NE(run(train + "output_dir=" + (dir / "bad").string() + " 'data.train=[{path: " + (dir / "big_mds").string() +
                    "}]' 2>&1",
                &log),
            0);
  EXPECT_NE(log.find("big_mds: holds token ids up to"), std::string::npos) << log;
  // Tokens as int32 `bytes`: read as such with data.train[i].token_dtype;
  // read as int64 (llm-foundry's default) they are no token ids, and the
  // error names the key.
  python("tokens_bytes " + (dir / "bytes_mds").string() + " 326");
  const auto bytes_run = [&](const std::string& name, const std::string& dtype) {
    return run(train + "output_dir=" + (dir / name).string() + " 'data.train=[{path: " + (dir / "bytes_mds").string() +
                   dtype + "}]' 2>&1",
               &log);
  };
  ASSERT_EQ(bytes_run("int32", ", token_dtype: int32"), 0) << log;
  EXPECT_NE(log.find("60 documents"), std::string::npos) << log;
  EXPECT_NE(bytes_run("int64", ""), 0);
  EXPECT_NE(log.find("bytes_mds/shard.00000.mds: sample 0 holds"), std::string::npos) << log;
  EXPECT_NE(log.find("as int64, not a token id"), std::string::npos) << log;
  EXPECT_NE(log.find("set data.train[i].token_dtype"), std::string::npos) << log;
}

TEST(Mds, DamagedOrForeignFoldersAreNamed) {
  TempDir dir;
  python("write " + (dir / "mds").string());
  const auto root = dir / "mds";
  // A truncated shard, uncompressed and zstd.
  stdfs::resize_file(root / "ndarray_uint16" / "shard.00001.mds", 100);
  EXPECT_NE(open_error(root / "ndarray_uint16").find("shard.00001.mds: 100 bytes, index.json says "), std::string::npos)
      << open_error(root / "ndarray_uint16");
  const auto zip = root / "ndarray_int32_zstd" / "shard.00002.mds.zstd";
  const auto zip_bytes = stdfs::file_size(zip);
  stdfs::resize_file(zip, zip_bytes - 10);
  EXPECT_NE(open_error(root / "ndarray_int32_zstd").find("shard.00002.mds.zstd: " + std::to_string(zip_bytes - 10)),
            std::string::npos);
  // A zstd shard of the right size that is not zstd.
  const auto zip2 = root / "ndarray_dynamic_zstd" / "shard.00000.mds.zstd";
  anvil::testing::write_text(zip2, std::string(stdfs::file_size(zip2), 'x'));
  EXPECT_NE(open_error(root / "ndarray_dynamic_zstd").find("shard.00000.mds.zstd: does not decompress (zstd: "),
            std::string::npos)
      << open_error(root / "ndarray_dynamic_zstd");
  // A sample whose offsets leave the file (sample 0's end offset).
  {
    std::fstream f(root / "ndarray_fixed_int64" / "shard.00000.mds", std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t far = 1u << 30;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&far), 4);
  }
  EXPECT_NE(open_error(root / "ndarray_fixed_int64").find("shard.00000.mds: sample 0: spans bytes"), std::string::npos)
      << open_error(root / "ndarray_fixed_int64");
  // int32 bytes read as llm-foundry's default int64.
  EXPECT_NE(open_error(root / "bytes_int32_zstd").find("a bytes column is read as int64"), std::string::npos)
      << open_error(root / "bytes_int32_zstd");
  // No tokens column; an encoding that holds no token ids; compression other than zstd.
  EXPECT_NE(open_error(root / "bytes_int64", MdsOptions{"input_ids", "int64"})
                .find("index.json: shards[0].column_names: no column \"input_ids\" of token ids"),
            std::string::npos);
  auto index = anvil::testing::read_text(root / "bytes_int64" / "index.json");
  index.replace(index.find("\"bytes\", \"str\""), 14, "\"str\", \"str\"");
  anvil::testing::write_text(root / "bytes_int64" / "index.json", index);
  EXPECT_NE(
      open_error(root / "bytes_int64").find("shards[0].column_encodings[1]: column \"tokens\" is encoded \"str\""),
      std::string::npos)
      << open_error(root / "bytes_int64");
  index = anvil::testing::read_text(root / "bytes_int32_zstd" / "index.json");
  for (size_t at; (at = index.find("\"compression\": \"zstd\"")) != std::string::npos;)
    index.replace(at, 21, "\"compression\": \"gz\"");
  anvil::testing::write_text(root / "bytes_int32_zstd" / "index.json", index);
  EXPECT_NE(open_error(root / "bytes_int32_zstd", options_for("bytes_int32"))
                .find("shards[0].compression: \"gz\": Anvil decompresses zstd shards"),
            std::string::npos);
}

}  // namespace
}  // namespace anvil::data
