#include "anvil/io/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <regex>

#include "anvil/core/error.h"
#include "anvil/core/fs.h"
#include "anvil/core/logging.h"
#include "anvil/io/hf_model.h"
#include "anvil/io/safetensors.h"

namespace anvil::io {
namespace {

namespace stdfs = std::filesystem;
constexpr const char* kStateFile = "trainer_state.json";
constexpr int kFormatVersion = 1;

std::optional<int64_t> checkpoint_step(const stdfs::path& p) {
  static const std::regex re("checkpoint-([0-9]+)");
  std::smatch m;
  const auto name = p.filename().string();
  if (!std::regex_match(name, m, re)) return std::nullopt;
  return std::stoll(m[1]);
}

std::vector<std::pair<int64_t, stdfs::path>> complete_checkpoints(const stdfs::path& output_dir) {
  std::vector<std::pair<int64_t, stdfs::path>> out;
  if (!stdfs::is_directory(output_dir)) return out;
  for (const auto& e : stdfs::directory_iterator(output_dir)) {
    auto step = checkpoint_step(e.path());
    if (step && e.is_directory() && stdfs::exists(e.path() / kStateFile)) out.emplace_back(*step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<at::Device> rng_devices(const at::Device& device) {
  std::vector<at::Device> devs = {at::Device(at::kCPU)};
  if (!device.is_cpu()) devs.push_back(device);
  return devs;
}

}  // namespace

stdfs::path save_checkpoint(const stdfs::path& output_dir, const CheckpointParts& parts, int64_t keep_last) {
  const auto step = parts.state.step;
  const auto final_dir = output_dir / concat("checkpoint-", step);
  const auto tmp = output_dir / concat(".checkpoint-", step, ".tmp-", ::getpid());
  stdfs::remove_all(tmp);
  stdfs::create_directories(tmp);

  save_model_dir(tmp, *parts.model, parts.tokenizer);
  {
    torch::serialize::OutputArchive archive;
    parts.optimizer->save(archive);
    archive.save_to((tmp / "optimizer.pt").string());
  }
  save_rng_state(tmp / "rng_state.safetensors", parts.model->parameters().front().device());
  fs::write_file_atomic(tmp / "config.yaml", parts.run_config_yaml);
  write_trainer_state(tmp, parts.state);  // written last
  fs::fsync_tree(tmp);

  publish_checkpoint(tmp, output_dir, step, keep_last);
  return final_dir;
}

void publish_checkpoint(const stdfs::path& tmp, const stdfs::path& output_dir, int64_t step, int64_t keep_last) {
  const auto final_dir = output_dir / concat("checkpoint-", step);
  // Replace an existing folder of the same step (e.g. a SIGTERM save that
  // lands on a save_every step) without ever leaving no complete copy.
  const auto old = output_dir / concat(".checkpoint-", step, ".old-", ::getpid());
  const bool had = stdfs::exists(final_dir);
  if (had) stdfs::rename(final_dir, old);
  stdfs::rename(tmp, final_dir);
  fs::fsync_path(output_dir);
  if (had) stdfs::remove_all(old);

  if (keep_last > 0) {
    auto all = complete_checkpoints(output_dir);
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) stdfs::remove_all(all[i].second);
  }
  // Leftovers of runs killed mid-save.
  for (const auto& e : stdfs::directory_iterator(output_dir)) {
    const auto name = e.path().filename().string();
    if (name.rfind(".checkpoint-", 0) == 0) stdfs::remove_all(e.path());
  }
}

void save_rng_state(const stdfs::path& path, const at::Device& device) {
  TensorMap states;
  for (const auto& d : rng_devices(device)) {
    auto gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.emplace(d.str(), gen.get_state());
  }
  save_safetensors(path, states);
}

void load_rng_state(const stdfs::path& path, const at::Device& device) {
  SafetensorsFile f(path);
  for (const auto& d : rng_devices(device)) {
    auto key = d.str();
    if (!f.contains(key) && !d.is_cpu())  // another rank's file: its GPU had another index
      for (const auto& name : f.names())
        if (name.rfind(c10::DeviceTypeName(d.type(), /*lower_case=*/true), 0) == 0) key = name;
    if (!f.contains(key)) throw CheckpointError(concat(path.string(), ": no RNG state for device ", d.str()));
    auto gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(f.get(key));
  }
}

std::optional<stdfs::path> latest_checkpoint(const stdfs::path& output_dir) {
  auto all = complete_checkpoints(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

nlohmann::json read_trainer_state(const stdfs::path& dir) {
  const auto state_path = dir / kStateFile;
  auto j = nlohmann::json::parse(fs::read_file(state_path), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    throw CheckpointError(concat(state_path.string(), ": expected a JSON object with an integer \"step\""));
  if (j.value("format_version", 0) != kFormatVersion)
    throw CheckpointError(concat(state_path.string(), ": format_version ", j.value("format_version", 0),
                                 " is not supported (expected ", kFormatVersion, ")"));
  return j;
}

void write_trainer_state(const stdfs::path& dir, const TrainerState& state) {
  nlohmann::json st = {{"format_version", kFormatVersion}, {"step", state.step}, {"data", state.data}};
  fs::write_file_atomic(dir / kStateFile, st.dump(2) + "\n");
}

TrainerState load_checkpoint(const stdfs::path& dir, models::CausalLM& model, torch::optim::Optimizer& optimizer) {
  if (stdfs::exists(dir / "sharding.json"))
    throw CheckpointError(concat(dir.string(), ": written by a sharded run (see its sharding.json); "
                                 "dist::load_sharded_checkpoint reads it"));
  const auto j = read_trainer_state(dir);
  load_weights(model, dir);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from((dir / "optimizer.pt").string());
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError(concat((dir / "optimizer.pt").string(), ": cannot restore optimizer state: ",
                                 e.what_without_backtrace()));
  }
  load_rng_state(dir / "rng_state.safetensors", model.parameters().front().device());
  return {j["step"].get<int64_t>(), j.value("data", nlohmann::json::object())};
}

}  // namespace anvil::io
