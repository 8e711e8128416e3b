// A SentencePiece tokenizer.model (a serialized protobuf), loaded as a model
// folder's tokenizer and then used.

#include "anvil/tokenizer/tokenizer.h"
#include "fuzz_util.h"
#include "tokenizer_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = anvil::fuzz::scratch_dir() / "sp";
  std::filesystem::create_directories(dir);
  anvil::fuzz::write_file(dir / "tokenizer.model", std::string_view(reinterpret_cast<const char*>(data), size));
  return anvil::fuzz::guarded([&] {
    const auto tok = anvil::tokenizer::load_tokenizer_from_model_dir(dir);
    anvil::fuzz::exercise_tokenizer(*tok);
  });
}
