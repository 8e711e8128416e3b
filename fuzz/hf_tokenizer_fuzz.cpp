// A Hugging Face model folder's tokenizer: tokenizer.json (the input up to
// its first NUL byte) and tokenizer_config.json (the rest, when there is
// any), loaded as load_tokenizer_from_model_dir does and then used.

#include "anvil/tokenizer/tokenizer.h"
#include "fuzz_util.h"
#include "tokenizer_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [json, config] = anvil::fuzz::split_at_nul(data, size);
  const auto dir = anvil::fuzz::scratch_dir() / "hf";
  std::filesystem::create_directories(dir);
  anvil::fuzz::write_file(dir / "tokenizer.json", json);
  std::error_code ec;
  std::filesystem::remove(dir / "tokenizer_config.json", ec);
  if (!config.empty()) anvil::fuzz::write_file(dir / "tokenizer_config.json", config);
  return anvil::fuzz::guarded([&] {
    const auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(dir);
    anvil::fuzz::exercise_tokenizer(*tok);
  });
}
