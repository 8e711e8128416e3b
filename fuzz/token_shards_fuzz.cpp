// A token-shard folder (anvil prepare's output: meta.json, NAME.idx,
// NAME.bin), opened and read as pretraining windows. The input is
// [meta length: u16 LE][idx length: u16 LE] meta idx bin, written as
// meta.json, shard_00000.idx and shard_00000.bin.

#include <memory>

#include "data/token_shards.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t meta_len = data[0] | (data[1] << 8), idx_len = data[2] | (data[3] << 8);
  std::string_view rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  const auto meta = rest.substr(0, meta_len);
  rest.remove_prefix(meta.size());
  const auto idx = rest.substr(0, idx_len);
  rest.remove_prefix(idx.size());
  const auto dir = anvil::fuzz::scratch_dir() / "shards";
  std::filesystem::create_directories(dir);
  anvil::fuzz::write_file(dir / "meta.json", meta);
  anvil::fuzz::write_file(dir / "shard_00000.idx", idx);
  anvil::fuzz::write_file(dir / "shard_00000.bin", rest);
  return anvil::fuzz::guarded([&] {
    auto shards = anvil::data::TokenShards::open(dir);
    anvil::data::PretrainDataset ds(shards, 4, "fuzz");
    anvil::data::LmSample s;
    for (int64_t i = 0; i < ds.size() && i < 64; ++i) ds.get(i, s);
  });
}
