#include "io/trainer_state.h"

#include "anvil/core/error.h"
#include "core/fs.h"

namespace anvil::io {
namespace {

constexpr int kFormatVersion = 1;

}  // namespace

nlohmann::json read_trainer_state(const std::filesystem::path& dir) {
  const auto path = (dir / kTrainerStateFile).string();
  auto j = nlohmann::json::parse(fs::read_file(path), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw CheckpointError(concat(path, ": expected a JSON object with an integer \"step\""));
  const auto integer = [&](const char* key, bool required) {
    const auto it = j.find(key);
    if (it == j.end()) {
      if (required) throw CheckpointError(concat(path, ": ", key, ": missing (expected a non-negative integer)"));
      return;
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      throw CheckpointError(concat(path, ": ", key, ": expected a non-negative integer, got ", it->dump()));
  };
  integer("step", true);
  integer("format_version", true);
  integer("nonfinite_steps", false);   // absent in checkpoints older than the non-finite guard
  integer("iteration", false);         // absent in checkpoints older than Objective v2
  integer("micro_batch_size", false);  // train.micro_batch_size: auto's value reached; absent otherwise
  if (j["format_version"].get<int64_t>() != kFormatVersion)
    throw CheckpointError(concat(path, ": format_version ", j["format_version"].get<int64_t>(),
                                 " is not supported (expected ", kFormatVersion, ")"));
  if (j.contains("data") && !j["data"].is_object())
    throw CheckpointError(
        concat(path, ": data: expected an object (the data stream's position), got ", j["data"].dump()));
  return j;
}

TrainerState trainer_state_of(const nlohmann::json& j) {
  const auto integer = [&](const char* key, int64_t fallback) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
  };
  TrainerState st;
  st.step = j.at("step").get<int64_t>();
  st.data = j.value("data", nlohmann::json::object());
  st.nonfinite_steps = integer("nonfinite_steps", 0);
  st.objective = j.value("objective", nlohmann::json());
  st.iteration = integer("iteration", st.step);  // one step per iteration before Objective v2
  st.micro_batch_size = integer("micro_batch_size", 0);
  return st;
}

void write_trainer_state(const std::filesystem::path& dir, const TrainerState& state) {
  nlohmann::json st = {{"format_version", kFormatVersion},
                       {"step", state.step},
                       {"data", state.data},
                       {"nonfinite_steps", state.nonfinite_steps},
                       {"iteration", state.iteration}};
  if (!state.objective.is_null()) st["objective"] = state.objective;
  if (state.micro_batch_size > 0) st["micro_batch_size"] = state.micro_batch_size;
  fs::write_file_atomic(dir / kTrainerStateFile, st.dump(2) + "\n");
}

}  // namespace anvil::io
