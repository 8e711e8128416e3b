// JSONL datasets as the trainer reads them: SFT lines ({prompt, response} or
// {messages}) and preference lines ({prompt, chosen, rejected} or {prompt,
// ranked}), tokenized with the quickstart's SentencePiece model (plain
// template) or a byte-level BPE with ChatML's tokens (chatml template). The
// first input byte picks the reader and its options; the rest is the file.

#include <memory>

#include "data/datasets.h"
#include "anvil/tokenizer/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto plain_tok = anvil::tokenizer::load_tokenizer(
      "sentencepiece", std::string(anvil::fuzz::source_dir()) + "/data/tokenizer.model");
  static const auto chatml_tok = anvil::tokenizer::load_tokenizer(
      "hf", std::string(anvil::fuzz::source_dir()) + "/fuzz/data/chatml-tokenizer.json");
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const auto& tok = mode & 2 ? chatml_tok : plain_tok;
  const auto path = anvil::fuzz::scratch_dir() / "data.jsonl";
  anvil::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  anvil::data::ReadOptions opt;
  opt.chat = &anvil::chat::ChatTemplate::get(mode & 2 ? "chatml" : "plain");
  opt.on_error = mode & 4 ? anvil::data::OnError::skip : anvil::data::OnError::fail;
  opt.max_length = mode & 8 ? 12 : 0;
  opt.train_on_prompt = mode & 16;
  opt.drop_overflow = mode & 32;
  return anvil::fuzz::guarded([&] {
    if (mode & 1) {
      const auto ds = anvil::data::PreferenceDataset::load(path, *tok, opt);
      size_t n = 0;
      for (int64_t i = 0; i < ds.size(); ++i) n += ds[i].chosen_ids().size() + ds[i].rejected_ids().size();
      (void)n;
    } else {
      const auto ds = anvil::data::SftDataset::load(path, *tok, opt);
      anvil::data::LmSample s;
      for (int64_t i = 0; i < ds.size(); ++i) ds.get(i, s);
    }
  });
}
