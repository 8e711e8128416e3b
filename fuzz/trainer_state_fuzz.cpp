// trainer_state.json of a checkpoint folder, as a resume reads it: validated,
// turned into a TrainerState, and its data position given to a sampler.

#include "data/mixture.h"
#include "io/trainer_state.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = anvil::fuzz::scratch_dir() / "ckpt";
  std::filesystem::create_directories(dir);
  anvil::fuzz::write_file(dir / anvil::io::kTrainerStateFile,
                          std::string_view(reinterpret_cast<const char*>(data), size));
  return anvil::fuzz::guarded([&] {
    const auto st = anvil::io::trainer_state_of(anvil::io::read_trainer_state(dir));
    if (st.data.empty()) return;
    anvil::data::MixtureSampler sampler({{.size = 7}, {.size = 3, .fraction = 2.0}}, 1234);
    sampler.set_state(anvil::data::sampler_state_of(st.data));
    for (int i = 0; i < 12; ++i) sampler.next();
  });
}
