#pragma once
// trainer_state.json: the last file of a checkpoint folder (its presence marks
// the folder complete). It holds the step, the batch source's position, the
// non-finite step count and the objective's own state (Objective::state()). Torch-free, so the fuzz targets can link it
// alone.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace anvil::io {

inline constexpr const char* kTrainerStateFile = "trainer_state.json";

struct TrainerState {
  int64_t step = 0;
  nlohmann::json data;           // the batch source's position
  int64_t nonfinite_steps = 0;   // steps skipped so far for a NaN/inf loss or gradient norm
  nlohmann::json objective;      // the objective's state (null when it keeps none)
  int64_t iteration = 0;         // iterations completed (an iteration runs one or more steps)
  int64_t micro_batch_size = 0;  // train.micro_batch_size: auto: the rows per forward reached (0: not auto)
};

/// trainer_state.json of a checkpoint folder, validated (types and ranges of
/// every field read); throws CheckpointError naming the file and key.
nlohmann::json read_trainer_state(const std::filesystem::path& dir);
/// The TrainerState a JSON object read by read_trainer_state holds.
TrainerState trainer_state_of(const nlohmann::json& j);
void write_trainer_state(const std::filesystem::path& dir, const TrainerState& state);

}  // namespace anvil::io
