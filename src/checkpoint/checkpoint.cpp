#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <regex>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/logging.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "checkpoint/saved_parameters.h"
#include "io/trainer_state.h"

namespace anvil::checkpoint {
namespace {

namespace stdfs = std::filesystem;
constexpr int kFormatVersion = 1;
// AdamW moments by HF parameter name, and the per-parameter step counts
// beside them: no file of a checkpoint goes through torch's serializer, which
// aborts the process on a short write and whose reader unpickles.
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kOptimizerMeta = "optimizer.json";

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
    if (step && e.is_directory() && stdfs::exists(e.path() / io::kTrainerStateFile)) out.emplace_back(*step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<at::Device> rng_devices(const at::Device& device) {
  std::vector<at::Device> devs = {at::Device(at::kCPU)};
  if (!device.is_cpu()) devs.push_back(device);
  return devs;
}

void load_optimizer_state(const stdfs::path& dir, models::CausalLM& model, torch::optim::Optimizer& optimizer) {
  if (!stdfs::exists(dir / kOptimizerFile)) {
    if (stdfs::exists(dir / "optimizer.pt"))
      throw CheckpointError(concat((dir / "optimizer.pt").string(),
                                   ": optimizer state in torch's archive format (written by Anvil before "
                                   "2026-11-23) is no longer read, since its reader deserializes pickled data. "
                                   "Continue from this checkpoint's weights in a new output_dir with model.from=",
                                   dir.string(), " (the optimizer state starts afresh)"));
    throw CheckpointError(concat((dir / kOptimizerFile).string(), ": missing"));
  }
  const auto meta_path = dir / kOptimizerMeta;
  const auto meta = nlohmann::json::parse(fs::read_file(meta_path), nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("steps") || !meta["steps"].is_object())
    throw CheckpointError(concat(meta_path.string(), ": expected a JSON object with a \"steps\" object"));
  io::SafetensorsFile file(dir / kOptimizerFile);
  for (const auto& item : model.named_parameters()) {
    const auto& name = item.key();
    const auto& p = item.value();
    if (!file.contains(name + ".exp_avg")) continue;
    const auto step = meta["steps"].find(name);
    if (step == meta["steps"].end() || !step->is_number_integer() || step->get<int64_t>() < 0)
      throw CheckpointError(concat(meta_path.string(), ": steps.", name, ": expected a step count >= 0"));
    auto moment = [&](const std::string& suffix) {
      auto t = file.get(name + suffix);
      if (t.sizes() != p.sizes())
        throw CheckpointError(concat(file.path().string(), ": tensor \"", name, suffix, "\" has shape ", t.sizes(),
                                     ", expected ", p.sizes(), " (the parameter's)"));
      return t.to(p.device(), optim::moment_dtype(optimizer, p));
    };
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(step->get<int64_t>());
    st->exp_avg(moment(".exp_avg"));
    st->exp_avg_sq(moment(".exp_avg_sq"));
    if (file.contains(name + ".max_exp_avg_sq")) st->max_exp_avg_sq(moment(".max_exp_avg_sq"));
    optimizer.state()[p.unsafeGetTensorImpl()] = std::move(st);
  }
}

}  // namespace

void save_optimizer_moments(const stdfs::path& dir, const std::map<std::string, at::Tensor>& moments,
                            const nlohmann::json& steps) {
  io::save_safetensors(dir / kOptimizerFile, moments);
  const nlohmann::json meta = {{"optimizer", "adamw"}, {"format_version", kFormatVersion}, {"steps", steps}};
  fs::write_file_atomic(dir / kOptimizerMeta, meta.dump(2) + "\n");
}

ModelState model_state(models::CausalLM& model, torch::optim::Optimizer& optimizer) {
  ModelState out;
  out.model = &model;
  out.dtype = model.parameters().front().scalar_type();
  const auto saved = saved_parameters(model);
  for (const auto& item : model.named_parameters()) {
    const auto& name = item.key();
    if (saved(name)) out.weights.emplace(name, item.value());
    auto* st = optim::adamw_state(optimizer, item.value());
    if (!st) continue;  // not stepped yet
    out.moments.emplace(name + ".exp_avg", st->exp_avg());
    out.moments.emplace(name + ".exp_avg_sq", st->exp_avg_sq());
    if (st->max_exp_avg_sq().defined()) out.moments.emplace(name + ".max_exp_avg_sq", st->max_exp_avg_sq());
    out.steps[name] = st->step();
  }
  return out;
}

void save_model_state(const stdfs::path& dir, const ModelState& state, const tokenizer::Tokenizer* tokenizer) {
  stdfs::create_directories(dir);
  save_weight_files(dir, *state.model, state.weights);
  save_model_config(dir, *state.model, tokenizer, state.dtype);
  save_optimizer_moments(dir, state.moments, state.steps);
}

void save_model_and_optimizer(const stdfs::path& dir, models::CausalLM& model, torch::optim::Optimizer& optimizer) {
  save_model_state(dir, model_state(model, optimizer), nullptr);
}

void load_model_and_optimizer(const stdfs::path& dir, models::CausalLM& model, torch::optim::Optimizer& optimizer) {
  if (!stdfs::is_directory(dir))
    throw CheckpointError(concat(dir.string(), ": missing; the run trains a model named ", dir.filename().string(),
                                 " beside the policy, and the checkpoint holds none"));
  load_weights(model, dir);
  load_optimizer_state(dir, model, optimizer);
}

stdfs::path save_checkpoint(const stdfs::path& output_dir, const CheckpointParts& parts, int64_t keep_last) {
  const auto step = parts.state.step;
  const auto final_dir = output_dir / concat("checkpoint-", step);
  const auto tmp = output_dir / concat(".checkpoint-", step, ".tmp-", ::getpid());
  stdfs::remove_all(tmp);
  stdfs::create_directories(tmp);

  try {
    save_model_state(tmp, parts.model, parts.tokenizer);
    io::save_safetensors(tmp / "rng_state.safetensors", parts.rng);
    fs::write_file_atomic(tmp / "config.yaml", parts.run_config_yaml);
    for (const auto& [name, companion] : parts.companions) save_model_state(tmp / name, companion, nullptr);
    if (parts.before_complete) parts.before_complete(tmp);
    io::write_trainer_state(tmp, parts.state);  // written last
    fs::fsync_tree(tmp);
  } catch (const std::exception& e) {
    // A full disk or an unwritable folder: the unfinished folder goes, the
    // previous checkpoints stay as they were.
    std::error_code ec;
    stdfs::remove_all(tmp, ec);
    throw CheckpointError(concat("saving checkpoint-", step, " in ", output_dir.string(), " failed (", e.what(),
                                 "); the previous checkpoints are as they were"));
  }

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
    // Renamed out of the checkpoint-<step> names first, in one atomic step: a
    // kill in the middle of the removal leaves a hidden leftover (removed
    // below, or by the next save), never a checkpoint-<step> folder with part
    // of its files gone.
    auto all = complete_checkpoints(output_dir);
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) {
      const auto doomed = output_dir / concat(".checkpoint-", all[i].first, ".pruned-", ::getpid());
      stdfs::rename(all[i].second, doomed);
      stdfs::remove_all(doomed);
    }
  }
  // Leftovers of runs killed mid-save.
  for (const auto& e : stdfs::directory_iterator(output_dir)) {
    const auto name = e.path().filename().string();
    if (name.rfind(".checkpoint-", 0) == 0) stdfs::remove_all(e.path());
  }
}

io::TensorMap rng_state(const at::Device& device) {
  io::TensorMap states;
  for (const auto& d : rng_devices(device)) {
    auto gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    states.emplace(d.str(), gen.get_state());
  }
  return states;
}

void save_rng_state(const stdfs::path& path, const at::Device& device) {
  io::save_safetensors(path, rng_state(device));
}

void load_rng_state(const stdfs::path& path, const at::Device& device) {
  io::SafetensorsFile f(path);
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

io::TrainerState load_checkpoint(const stdfs::path& dir, models::CausalLM& model, torch::optim::Optimizer& optimizer) {
  if (stdfs::exists(dir / "sharding.json"))
    throw CheckpointError(concat(dir.string(),
                                 ": written by a sharded run (see its sharding.json); "
                                 "distributed::load_sharded_checkpoint reads it"));
  const auto j = io::read_trainer_state(dir);
  load_weights(model, dir);
  load_optimizer_state(dir, model, optimizer);
  load_rng_state(dir / "rng_state.safetensors", model.parameters().front().device());
  return io::trainer_state_of(j);
}

}  // namespace anvil::checkpoint
