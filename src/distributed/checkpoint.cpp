#include "distributed/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/host_memory.h"
#include "anvil/checkpoint/hf_model.h"
#include "checkpoint/saved_parameters.h"
#include "models/lora.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "io/trainer_state.h"

namespace anvil::distributed {
namespace {

namespace stdfs = std::filesystem;
constexpr int kFormatVersion = 1;

std::string five(int64_t n) {
  std::ostringstream os;
  os << std::setw(5) << std::setfill('0') << n;
  return os.str();
}

stdfs::path shard_file(const stdfs::path& dir, int64_t s, int64_t n) {
  return dir / "shards" / concat("shard-", five(s), "-of-", five(n), ".safetensors");
}

stdfs::path rng_file(const stdfs::path& dir, int64_t rank) {
  return dir / "rng" / concat("rank-", five(rank), ".safetensors");
}

nlohmann::json read_meta(const stdfs::path& dir) {
  const auto path = dir / "sharding.json";
  auto j = nlohmann::json::parse(fs::read_file(path), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format_version", 0) != kFormatVersion || !j.contains("units") ||
      !j.contains("shards") || !j["units"].is_array() || !j["shards"].is_array())
    throw CheckpointError(concat(path.string(), ": expected a sharding.json of format_version ", kFormatVersion,
                                 " with \"units\" and \"shards\""));
  return j;
}

}  // namespace

bool is_sharded_checkpoint(const stdfs::path& dir) { return stdfs::exists(dir / "sharding.json"); }

namespace {

/// The mark a rank leaves in the temporary folder once its files are written.
stdfs::path written_mark(const stdfs::path& tmp, int64_t rank) { return tmp / concat(".written-rank-", five(rank)); }

}  // namespace

namespace {

/// The model in HF layout, gathered one unit at a time into `s`. On several ranks each unit is a file of its
/// own, kept and written by the rank that owns it (unit u: rank u mod W), so no rank keeps more than its share;
/// a LoRA run's adapters (small) and a single rank's model stay one file on rank 0.
void gather_hf_model(ShardedSave& s, ShardedModel& model, bool consolidated) {
  const auto masters = model.master_parameters();
  const bool per_unit = consolidated && s.world > 1 && !models::has_lora(model.model());
  if (per_unit) {
    const auto saved = checkpoint::saved_parameters(model.model());
    std::vector<size_t> with_files;  // units with weights to write, the same list on every rank
    for (size_t u = 0; u < masters.size(); ++u)
      for (const auto& p : model.whole_layouts()[u].params)
        if (saved(p.name) && !checkpoint::is_head_parameter(p.name)) {
          with_files.push_back(u);
          break;
        }
    nlohmann::json weight_map = nlohmann::json::object();
    int64_t total = 0;
    for (size_t u = 0; u < masters.size(); ++u) {
      const auto flat = model.to_whole_layout(u, model.gather_master(u));
      const auto it = std::find(with_files.begin(), with_files.end(), u);
      const auto file = it == with_files.end() ? std::string()
                                               : concat("model-", five(it - with_files.begin() + 1), "-of-",
                                                        five(static_cast<int64_t>(with_files.size())), ".safetensors");
      io::TensorMap tensors;
      const bool owner = static_cast<int64_t>(u) % s.world == s.rank;
      for (const auto& p : model.whole_layouts()[u].params) {
        if (!saved(p.name)) continue;
        const auto view = flat.narrow(0, p.offset, p.numel).view(p.shape);
        if (checkpoint::is_head_parameter(p.name)) {  // small: one file, by rank 0 (root and root.frozen hold heads)
          if (s.rank == 0) s.heads.emplace(p.name, view);
          continue;
        }
        weight_map[p.name] = file;
        total += p.numel * 4;  // float32
        if (owner) tensors.emplace(p.name, view);
      }
      if (owner && !tensors.empty()) s.owned.emplace_back(file, std::move(tensors));
    }
    if (s.rank == 0) s.index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  } else if (consolidated) {
    for (size_t u = 0; u < masters.size(); ++u) {
      const auto flat = model.to_whole_layout(u, model.gather_master(u));
      if (s.rank != 0) continue;
      for (const auto& p : model.whole_layouts()[u].params)
        s.whole.emplace(p.name, flat.narrow(0, p.offset, p.numel).view(p.shape));
    }
  }
}

/// Rank 0's shards.json: the units, their parameters, and each shard's element ranges.
nlohmann::json shards_metadata(const ShardedSave& s, ShardedModel& model, torch::optim::Optimizer& optimizer,
                               bool sharded, int64_t shards) {
  int64_t adam_step = 0;
  if (const auto trained = model.trained_master_parameters(); !trained.empty())
    if (auto* st = optim::adamw_state(optimizer, trained.front())) adam_step = st->step();
  nlohmann::json units = nlohmann::json::array();
  for (const auto& l : model.whole_layouts()) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : l.params) params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    units.push_back({{"name", l.name}, {"numel", l.numel}, {"params", params}});
    if (l.frozen) units.back()["frozen"] = true;  // its ".param" is in dist.param_dtype, with no moments
  }
  // Element ranges per shard, as every rank computes them (the same rule).
  nlohmann::json ranges = nlohmann::json::array();
  for (int64_t r = 0; r < shards; ++r) {
    nlohmann::json range = nlohmann::json::array();
    for (size_t u = 0; u < model.whole_layouts().size(); ++u) {
      const int64_t numel = model.whole_layouts()[u].numel;
      if (!sharded) {
        range.push_back({0, numel});
        continue;
      }
      const int64_t per = (numel + shards - 1) / shards;
      const int64_t b = std::min(r * per, numel);
      range.push_back({b, std::min(b + per, numel)});
    }
    ranges.push_back({{"file", shard_file(s.tmp, r, shards).filename().string()}, {"ranges", range}});
  }
  return {{"format_version", kFormatVersion},
          {"strategy", to_string(model.options().strategy)},
          {"world_size", s.world},
          {"replicate", model.replicas()},
          // Informational: the units above are the whole model's, whatever the mesh that wrote them.
          {"tensor_parallel", model.tensor_parallel() ? model.tensor_parallel()->world_size() : 1},
          {"optimizer_step", adam_step},
          {"units", units},
          {"shards", ranges}};
}

}  // namespace

ShardedSave prepare_sharded_save(const stdfs::path& output_dir, ShardedModel& model, torch::optim::Optimizer& optimizer,
                                 const tokenizer::Tokenizer* tokenizer, const io::TrainerState& state,
                                 const std::string& run_config_yaml, int64_t keep_last, bool consolidated) {
  auto& comm = model.comm();
  ShardedSave s;
  s.output_dir = output_dir;
  s.rank = comm.rank();
  s.world = comm.world_size();
  s.keep_last = keep_last;
  s.state = state;
  s.tmp = output_dir / concat(".checkpoint-", state.step, ".tmp-sharded");
  if (s.rank == 0) {
    stdfs::remove_all(s.tmp);
    stdfs::create_directories(s.tmp / "shards");
    stdfs::create_directories(s.tmp / "rng");
  }
  comm.barrier(concat("checkpoint ", state.step, ": folder created"));

  // no_shard: every rank holds the same whole state, so rank 0 writes it. Hybrid sharding: the replica groups
  // hold the same shards, so the first group's ranks (ranks 0 .. S-1, its shard ranks) write them.
  const bool sharded = model.options().strategy != Sharding::NoShard;
  const int64_t shards = sharded ? model.shard_comm().world_size() : 1;
  const int64_t shard_rank = model.shard_comm().rank();
  const auto masters = model.master_parameters();
  if (model.tensor_parallel() != nullptr) {
    // Tensor parallelism: the files hold the whole model's units, each unit made whole (gathered over both
    // groups) one at a time and cut over every rank, which writes one shard of it (the ranges shards_metadata
    // gives for W shards): a rank keeps 1/W of the state, whatever the strategy.
    s.shard_file = shard_file(s.tmp, s.rank, s.world);
    for (size_t u = 0; u < masters.size(); ++u) {
      const auto& whole = model.whole_layouts()[u];
      const int64_t per = (whole.numel + s.world - 1) / s.world;
      const int64_t b = std::min(s.rank * per, whole.numel), e = std::min(b + per, whole.numel);
      auto keep = [&](const std::string& key, const at::Tensor& shard) {
        const auto values = model.to_whole_layout(u, model.gather_master(u, shard));
        if (e > b) s.shard.emplace(whole.name + key, values.narrow(0, b, e - b).clone().cpu());
      };
      keep(".param", masters[u]);
      if (auto* st = optim::adamw_state(optimizer, masters[u])) {
        keep(".exp_avg", st->exp_avg().to(at::kFloat));
        keep(".exp_avg_sq", st->exp_avg_sq().to(at::kFloat));
      }
    }
  } else if (model.replica() == 0 && shard_rank < shards) {
    s.shard_file = shard_file(s.tmp, shard_rank, shards);
    for (size_t u = 0; u < masters.size(); ++u) {
      const auto [b, e] = model.shard_range(u);
      if (e <= b) continue;
      const auto& name = model.layouts()[u].name;
      s.shard.emplace(name + ".param", masters[u].narrow(0, 0, e - b));
      if (auto* st = optim::adamw_state(optimizer, masters[u])) {
        s.shard.emplace(name + ".exp_avg", st->exp_avg().narrow(0, 0, e - b));
        s.shard.emplace(name + ".exp_avg_sq", st->exp_avg_sq().narrow(0, 0, e - b));
      }
    }
  }
  s.rng = checkpoint::rng_state(model.device());
  gather_hf_model(s, model, consolidated);
  s.model = &model.model();
  if (s.rank != 0) return s;
  s.tokenizer = tokenizer;
  s.run_config_yaml = run_config_yaml;
  s.meta = model.tensor_parallel() ? shards_metadata(s, model, optimizer, true, s.world)
                                   : shards_metadata(s, model, optimizer, sharded, shards);
  return s;
}

void write_sharded_files(const ShardedSave& s) {
  std::vector<stdfs::path> written;
  if (!s.shard_file.empty()) {  // ranks past the shard count (no_shard) write none
    io::save_safetensors(s.shard_file, s.shard, {{"format", "pt"}});
    written.push_back(s.shard_file);
  }
  written.push_back(rng_file(s.tmp, s.rank));
  io::save_safetensors(written.back(), s.rng);
  for (const auto& [file, tensors] : s.owned) {  // this rank's units of the HF folder
    written.push_back(s.tmp / file);
    io::save_safetensors(written.back(), tensors, {{"format", "pt"}});
  }
  if (!s.heads.empty()) {
    written.push_back(s.tmp / checkpoint::kHeadsFile);
    io::save_safetensors(written.back(), s.heads, {{"format", "pt"}});
  }
  if (s.rank == 0) {
    if (!s.index.is_null()) fs::write_file_atomic(s.tmp / "model.safetensors.index.json", s.index.dump(2) + "\n");
    if (!s.whole.empty()) checkpoint::save_weight_files(s.tmp, *s.model, s.whole);  // as checkpoint::save_model_dir
    fs::write_file_atomic(s.tmp / "sharding.json", s.meta.dump(1) + "\n");
    checkpoint::save_model_config(s.tmp, *s.model, s.tokenizer, at::kFloat);
    fs::write_file_atomic(s.tmp / "config.yaml", s.run_config_yaml);
    for (const auto& [name, state] : s.companions) checkpoint::save_model_state(s.tmp / name, state, nullptr);
  }
  for (const auto& f : written) fs::fsync_path(f);
  fs::write_file_atomic(written_mark(s.tmp, s.rank), "");
}

stdfs::path publish_sharded_save(const ShardedSave& s, double timeout_s,
                                 const std::function<void(const stdfs::path&)>& before_complete) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < s.world; ++r)
      if (!stdfs::exists(written_mark(s.tmp, r))) missing.push_back(r);
    if (missing.empty()) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw CheckpointError(concat("checkpoint-", s.state.step, " in ", s.output_dir.string(), ": ", missing.size(),
                                   " rank(s) (the first: rank ", missing.front(),
                                   ") did not finish writing their shard within ", timeout_s, " s (dist.timeout_s); ",
                                   s.tmp.string(), " stays unpublished"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int64_t r = 0; r < s.world; ++r) stdfs::remove(written_mark(s.tmp, r));
  if (before_complete) before_complete(s.tmp);
  io::write_trainer_state(s.tmp, s.state);  // last: marks the folder complete
  fs::fsync_tree(s.tmp);
  checkpoint::publish_checkpoint(s.tmp, s.output_dir, s.state.step, s.keep_last);
  return s.output_dir / concat("checkpoint-", s.state.step);
}

stdfs::path save_sharded_checkpoint(const stdfs::path& output_dir, ShardedModel& model,
                                    torch::optim::Optimizer& optimizer, const tokenizer::Tokenizer* tokenizer,
                                    const io::TrainerState& state, const std::string& run_config_yaml,
                                    int64_t keep_last, bool consolidated,
                                    const std::function<void(const stdfs::path&)>& extra) {
  auto& comm = model.comm();
  const auto s =
      prepare_sharded_save(output_dir, model, optimizer, tokenizer, state, run_config_yaml, keep_last, consolidated);
  write_sharded_files(s);
  if (extra) extra(s.tmp);
  comm.barrier(concat("checkpoint ", state.step, ": every rank wrote its shard"));
  if (s.rank == 0) publish_sharded_save(s, /*timeout_s=*/60);  // the marks are there: a shared file system's delay
  comm.barrier(concat("checkpoint ", state.step, ": published"));
  return output_dir / concat("checkpoint-", state.step);
}

checkpoint::ModelState gather_consolidated(ShardedModel& model, torch::optim::Optimizer& optimizer) {
  const bool lead = model.comm().rank() == 0;
  std::set<std::string> omit;  // a reward model's folder has no LM head (as checkpoint::save_model_dir)
  if (model.model().has_score_head())
    for (const auto& n : model.model().lm_head_parameters()) omit.insert(n);
  const auto masters = model.master_parameters();
  checkpoint::ModelState out;
  out.model = &model.model();
  out.dtype = at::kFloat;
  for (size_t u = 0; u < masters.size(); ++u) {
    const auto flat = model.to_whole_layout(u, model.gather_master(u));
    auto* st = optim::adamw_state(optimizer, masters[u]);  // every rank has stepped, or none
    at::Tensor m1, m2;
    if (st) {
      m1 = model.to_whole_layout(u, model.gather_master(u, st->exp_avg()).to(at::kFloat));
      m2 = model.to_whole_layout(u, model.gather_master(u, st->exp_avg_sq()).to(at::kFloat));
    }
    if (!lead) continue;
    for (const auto& p : model.whole_layouts()[u].params) {
      if (omit.count(p.name)) continue;
      auto part = [&](const at::Tensor& t) { return t.narrow(0, p.offset, p.numel).view(p.shape); };
      out.weights.emplace(p.name, part(flat));
      if (!st) continue;
      out.moments.emplace(p.name + ".exp_avg", part(m1));
      out.moments.emplace(p.name + ".exp_avg_sq", part(m2));
      out.steps[p.name] = st->step();
    }
  }
  return out;
}

void save_consolidated(const stdfs::path& dir, ShardedModel& model, torch::optim::Optimizer& optimizer) {
  const auto state = gather_consolidated(model, optimizer);
  if (model.comm().rank() == 0) checkpoint::save_model_state(dir, state, nullptr);
}

std::map<std::string, at::Tensor> read_sharded_units(const stdfs::path& dir, const std::string& kind) {
  const auto meta = read_meta(dir);
  std::map<std::string, at::Tensor> out;
  std::vector<std::string> names;
  for (const auto& u : meta["units"]) {
    const auto name = u.at("name").get<std::string>();
    names.push_back(name);
    out.emplace(name, at::zeros({u.at("numel").get<int64_t>()}, at::kFloat));
  }
  for (const auto& shard : meta["shards"]) {
    const auto path = dir / "shards" / shard.at("file").get<std::string>();
    if (!stdfs::exists(path)) throw CheckpointError(concat(path.string(), ": shard file missing"));
    io::SafetensorsFile f(path);
    const auto& ranges = shard.at("ranges");
    for (size_t u = 0; u < names.size(); ++u) {
      const auto b = ranges.at(u).at(0).get<int64_t>(), e = ranges.at(u).at(1).get<int64_t>();
      if (e <= b) continue;
      const auto key = names[u] + "." + kind;
      if (!f.contains(key)) {
        if (kind == "param") throw CheckpointError(concat(path.string(), ": tensor \"", key, "\" missing"));
        continue;  // no optimizer state yet
      }
      auto t = f.get(key);
      if (t.numel() != e - b)
        throw CheckpointError(concat(path.string(), ": tensor \"", key, "\" has ", t.numel(), " elements, ",
                                     "sharding.json says ", e - b));
      out[names[u]].narrow(0, b, e - b).copy_(t.reshape(-1));
    }
  }
  return out;
}

namespace {

/// A sharded checkpoint's files, mapped once, read a rank's slice at a time.
class RankSlices {
 public:
  RankSlices(const stdfs::path& dir, const nlohmann::json& meta) {
    for (const auto& shard : meta["shards"]) {
      const auto path = dir / "shards" / shard.at("file").get<std::string>();
      if (!stdfs::exists(path)) throw CheckpointError(concat(path.string(), ": shard file missing"));
      files_.push_back(std::make_unique<io::SafetensorsFile>(path));
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const auto& r : shard.at("ranges")) ranges.emplace_back(r.at(0).get<int64_t>(), r.at(1).get<int64_t>());
      if (ranges.size() != meta["units"].size())
        throw CheckpointError(concat((dir / "sharding.json").string(), ": shard ", shard.at("file").get<std::string>(),
                                     " gives ranges for ", ranges.size(), " units of ", meta["units"].size()));
      ranges_.push_back(std::move(ranges));
    }
  }

  /// Elements [b, e) of unit u's `key` (float32), zero-padded to `size`: the overlapping piece of every file that
  /// holds part of them. Optimizer moments may be absent (never stepped): zeros then, unless `required`.
  at::Tensor read(size_t u, const std::string& key, int64_t b, int64_t e, int64_t size, bool required) const {
    auto out = at::zeros({size}, at::kFloat);
    for (size_t f = 0; f < files_.size(); ++f) {
      const auto [fb, fe] = ranges_[f].at(u);
      const int64_t lo = std::max(b, fb), hi = std::min(e, fe);
      if (hi <= lo) continue;
      const auto& file = *files_[f];
      if (!file.contains(key)) {
        if (required) throw CheckpointError(concat(file.path().string(), ": tensor \"", key, "\" missing"));
        continue;
      }
      if (file.numel(key) != fe - fb)
        throw CheckpointError(concat(file.path().string(), ": tensor \"", key, "\" has ", file.numel(key),
                                     " elements, sharding.json says ", fe - fb));
      out.narrow(0, lo - b, hi - lo).copy_(file.get_elements(key, lo - fb, hi - lo));
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges_;  // per file, per unit: the elements it holds
};

}  // namespace

io::TrainerState load_sharded_checkpoint(const stdfs::path& dir, ShardedModel& model,
                                         torch::optim::Optimizer& optimizer,
                                         const std::function<void(size_t, size_t)>& before_unit) {
  const auto j = io::read_trainer_state(dir);
  const auto meta = read_meta(dir);
  const auto& layouts = model.whole_layouts();  // the files' (the whole model's under tensor parallelism)
  const auto& units = meta["units"];
  const auto meta_path = (dir / "sharding.json").string();
  if (units.size() != layouts.size())
    throw CheckpointError(concat(meta_path, ": ", units.size(), " units, this model has ", layouts.size()));
  for (size_t u = 0; u < layouts.size(); ++u) {
    const auto name = units[u].at("name").get<std::string>();
    const auto numel = units[u].at("numel").get<int64_t>();
    if (name != layouts[u].name || numel != layouts[u].numel)
      throw CheckpointError(concat(meta_path, ": unit ", u, " is \"", name, "\" of ", numel,
                                   " elements, this model's is \"", layouts[u].name, "\" of ", layouts[u].numel));
  }
  // Streamed: each unit's slice this rank owns, read from the pieces of the shard files that overlap it (any
  // earlier world size), so no rank holds more than its own state plus one unit's slice in flight.
  host_peaks().end("load");  // the host memory of a resume is a phase of its own (core/host_memory.h)
  return_free_host_memory();
  host_peaks().begin("resume");
  const RankSlices files(dir, meta);
  const auto adam_step = meta.value("optimizer_step", int64_t{0});
  const auto masters = model.master_parameters();
  for (size_t u = 0; u < layouts.size(); ++u) {
    if (before_unit) before_unit(u, layouts.size());
    const auto& name = layouts[u].name;
    const auto [b, e] = model.shard_range(u);
    const auto shard = masters[u].numel();
    // Tensor parallelism: the whole unit is read and this rank's shares of it cut (one unit at a time).
    const bool whole = model.tensor_parallel() != nullptr;
    auto read = [&](const std::string& key, bool required) {
      if (!whole) return files.read(u, name + key, b, e, shard, required);
      const auto n = layouts[u].numel;
      return model.slice_for_rank(u, model.from_whole_layout(u, files.read(u, name + key, 0, n, n, required)));
    };
    model.load_unit_shard(u, read(".param", true));
    if (adam_step == 0 || layouts[u].frozen) continue;
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(adam_step);
    const auto moments = optim::moment_dtype(optimizer, masters[u]);
    st->exp_avg(read(".exp_avg", false).to(masters[u].device(), moments));
    st->exp_avg_sq(read(".exp_avg_sq", false).to(masters[u].device(), moments));
    optimizer.state()[masters[u].unsafeGetTensorImpl()] = std::move(st);
  }
  // The same rank's generators when the world size matches; otherwise the
  // generators start from rank 0's (dropout masks then differ from the old run).
  auto path = rng_file(dir, model.comm().rank());
  if (!stdfs::exists(path)) path = rng_file(dir, 0);
  checkpoint::load_rng_state(path, model.device());
  host_peaks().end("resume");
  return io::trainer_state_of(j);
}

void import_optimizer_state(ShardedModel& model, torch::optim::Optimizer& per_parameter,
                            torch::optim::Optimizer& sharded_optimizer) {
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.model().named_parameters()) params.emplace(p.key(), p.value());
  const auto masters = model.master_parameters();
  for (size_t u = 0; u < masters.size(); ++u) {
    const auto& layout = model.layouts()[u];
    auto m1 = at::zeros({layout.numel}, at::kFloat), m2 = at::zeros({layout.numel}, at::kFloat);
    int64_t step = -1;
    for (const auto& fp : layout.params) {
      auto* st = optim::adamw_state(per_parameter, params.at(fp.name));
      if (!st) continue;
      if (step >= 0 && st->step() != step)
        throw CheckpointError(concat("optimizer state: parameter \"", fp.name, "\" has taken ", st->step(),
                                     " steps, others of ", layout.name, " ", step));
      step = st->step();
      // A parameter tensor parallelism cut after the optimizer read it: its moments are cut alike.
      m1.narrow(0, fp.offset, fp.numel).copy_(model.share_of_whole(fp.name, st->exp_avg()).reshape(-1));
      m2.narrow(0, fp.offset, fp.numel).copy_(model.share_of_whole(fp.name, st->exp_avg_sq()).reshape(-1));
    }
    if (step < 0) continue;  // never stepped
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(step);
    const auto moments = optim::moment_dtype(sharded_optimizer, masters[u]);
    st->exp_avg(model.slice_for_rank(u, m1).to(masters[u].device(), moments));
    st->exp_avg_sq(model.slice_for_rank(u, m2).to(masters[u].device(), moments));
    sharded_optimizer.state()[masters[u].unsafeGetTensorImpl()] = std::move(st);
  }
}

void export_sharded_checkpoint(const stdfs::path& dir, const stdfs::path& output, const std::string& dtype) {
  checkpoint::check_export_target(output, dtype);
  auto model = checkpoint::model_from_config(dir);
  const auto meta = read_meta(dir);
  const auto units = read_sharded_units(dir, "param");
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model->named_parameters()) params.emplace(p.key(), p.value());
  std::set<std::string> filled;
  at::NoGradGuard no_grad;
  for (const auto& u : meta["units"]) {
    const auto& flat = units.at(u.at("name").get<std::string>());
    for (const auto& p : u.at("params")) {
      const auto name = p.at("name").get<std::string>();
      auto it = params.find(name);
      if (it == params.end())
        throw CheckpointError(concat((dir / "sharding.json").string(), ": \"", name, "\" is not a parameter of the ",
                                     model->family(), " model config.json describes"));
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      if (at::IntArrayRef(shape) != it->second.sizes())
        throw CheckpointError(concat((dir / "sharding.json").string(), ": \"", name, "\" has shape ",
                                     at::IntArrayRef(shape), ", config.json's model expects ", it->second.sizes()));
      it->second.copy_(flat.narrow(0, p.at("offset").get<int64_t>(), it->second.numel()).view(shape));
      filled.insert(name);
    }
  }
  for (const auto& [name, _] : params)
    if (!filled.count(name))
      throw CheckpointError(concat(dir.string(), ": parameter \"", name, "\" is in none of the shards"));
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (tokenizer::has_tokenizer(dir)) tok = tokenizer::load_tokenizer_from_model_dir(dir);
  if (auto gen = dir / "generation_config.json"; stdfs::exists(gen)) {
    const auto g = nlohmann::json::parse(fs::read_file(gen), nullptr, false);
    if (g.is_object()) {
      model->special_tokens.bos = g.value("bos_token_id", int64_t{-1});
      model->special_tokens.eos = g.value("eos_token_id", int64_t{-1});
      model->special_tokens.pad = g.value("pad_token_id", int64_t{-1});
    }
  }
  checkpoint::write_model_dir_atomic(*model, tok.get(), output, dtype);
}

}  // namespace anvil::distributed
