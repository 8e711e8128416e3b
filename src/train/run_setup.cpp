// Building a run from its config (run_setup.h).

#include "train/run_setup.h"

#include "train/memory_plan.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/device.h"
#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/hub_cache.h"
#include "core/logging.h"
#include "anvil/chat/chat.h"
#include "distributed/checkpoint.h"
#include "distributed/env.h"
#include "checkpoint/checkpoint.h"
#include "anvil/checkpoint/hf_model.h"
#include "checkpoint/peft.h"
#include "kernels/dispatch.h"
#include "models/init.h"
#include "models/lora.h"
#include "anvil/models/registry.h"
#include "io/trainer_state.h"
#include "distributed/sharding.h"
#include "optim/schedule.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;

at::Device parse_device(const std::string& d) {
  at::Device device(at::kCPU);
  try {
    device = at::Device(d);
  } catch (const c10::Error&) {
    throw ConfigError(concat("train.device: expected cpu, cuda or cuda:N, got \"", d, "\""));
  }
  if (device.is_cuda()) {
    const int n = torch::cuda::device_count();  // a DeviceIndex (int8): printed as a number
    if (n == 0)
      throw ConfigError(
          concat("train.device: ", d, ", but no usable CUDA GPU is visible (",
                 at::hasCUDA() ? "check nvidia-smi and CUDA_VISIBLE_DEVICES" : "this LibTorch has no CUDA support",
                 "); use train.device=cpu to train on the CPU"));
    if (device.has_index() && device.index() >= n)
      throw ConfigError(concat("train.device: ", d, ", but ", n, n == 1 ? " GPU is" : " GPUs are", " visible (cuda:0",
                               n > 1 ? concat(" to cuda:", n - 1) : std::string(), ")"));
  }
  return device;
}

/// LoRA: the adapters of model.lora_from, or new ones per the lora section;
/// `weights` false: their shapes alone (a memory plan), nothing read or logged.
void add_adapters(const config::RunConfig& cfg, models::CausalLM& model, bool weights = true) {
  // The adapter's base_model_name_or_path: an absolute folder, or the Hub id as written (as PEFT records it).
  const auto& from = cfg.model.from;
  const auto base = from.empty() ? std::string() : stdfs::exists(from) ? stdfs::absolute(from).string() : from;
  if (!cfg.model.lora_from.empty()) {
    const auto adapter = hub::local_path(cfg.model.lora_from);
    auto o = checkpoint::read_peft_config(adapter);
    o.base_model = base;
    const auto targets = models::add_lora(
        model, o,
        concat("model.lora_from: ", cfg.model.lora_from, "/", checkpoint::kAdapterConfig, ": target_modules"));
    if (!weights) return;
    checkpoint::load_peft_weights(model, adapter);
    log::info("lora: continuing the adapter in ", cfg.model.lora_from, " (r ", o.r, ", alpha ", o.alpha, " on ",
              nlohmann::json(targets).dump(), ")");
  } else if (cfg.lora.r > 0) {
    const models::LoraOptions o{cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules, base};
    const auto targets = models::add_lora(model, o);
    if (!weights) return;
    log::info("lora: r ", o.r, ", alpha ", o.alpha, ", dropout ", o.dropout, " on ", nlohmann::json(targets).dump());
  }
}

/// Builds the model: from model.from (HF folder) or randomly initialised. With
/// `deferred_on`, a folder's model is built there without storage and its
/// weights are read later, each rank its ranges (checkpoint::open_model_dir).
std::shared_ptr<models::CausalLM> build_model(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                              std::optional<at::Device> deferred_on, bool shapes_only = false) {
  std::shared_ptr<models::CausalLM> model;
  if (!cfg.model.from.empty() && deferred_on) {
    model = checkpoint::open_model_dir(cfg.model.from, *deferred_on);
    log::info("model: ", model->family(), " from ", cfg.model.from,
              models::has_deferred(*model) ? " (each rank reads its shards of the weights)" : "");
  } else if (!cfg.model.from.empty()) {
    model = checkpoint::load_model_dir(cfg.model.from);
    log::info("model: loaded ", model->family(), " from ", cfg.model.from);
  } else {
    auto mc = cfg.model;
    if (mc.vocab_size == 0) mc.vocab_size = tok.vocab_size();
    const auto& family = models::family_by_name(mc.family);
    std::optional<models::DeferredInitGuard> shapes;
    if (shapes_only) shapes.emplace(at::kCPU);  // a plan reads shapes: no memory, no draws
    // Sharded: no storage, each rank draws its shards of the weights one process draws (models/init.h).
    if (deferred_on && !shapes_only)
      model = models::build_deferred_random([&] { return family.from_config(mc); }, *deferred_on);
    if (model)
      log::info("model: ", model->family(), " randomly initialised (each rank draws its shards of the weights)");
    else
      model = family.from_config(mc);
  }
  if (shapes_only) {
    add_adapters(cfg, *model, /*weights=*/false);  // a plan counts LoRA's base as frozen
    return model;
  }
  if (model->vocab_size() < tok.vocab_size()) {
    if (cfg.tokenizer.add_special_tokens.empty())
      throw ConfigError(
          concat("model.vocab_size: ", model->vocab_size(), " is smaller than the tokenizer's ", tok.vocab_size()));
    // The added special tokens need rows (transformers' resize_token_embeddings).
    const auto m = cfg.tokenizer.resize_to_multiple_of;
    const auto n = m > 0 ? (tok.vocab_size() + m - 1) / m * m : tok.vocab_size();
    log::info("model: vocabulary ", model->vocab_size(), " -> ", n,
              " rows for tokenizer.add_special_tokens (new rows: the mean of the old ones)");
    models::materialize_deferred(*model);  // the new rows' mean reads every old one
    model->resize_vocab(n);
  }
  model->special_tokens = {tok.bos_id(), tok.eos_id(), tok.pad_id()};
  if (const double coef = cfg.model.keys.get<models::ExpertKeys>().router_aux_loss_coef; coef >= 0) {
    if (model->num_experts() == 0)
      throw ConfigError(
          concat("model.router_aux_loss_coef: the ", model->family(), " model of ", cfg.model.from, " has no experts"));
    model->router_aux_loss_coef = coef;
  }
  if (model->num_experts() > 0)
    log::info("model: ", model->num_experts(), " experts per sparse layer; load-balancing loss weight ",
              model->router_aux_loss_coef, model->router_aux_loss_coef > 0 ? " (logged as moe/aux_loss)" : "");
  add_adapters(cfg, *model);
  return model;
}

std::unique_ptr<tokenizer::Tokenizer> build_tokenizer(const config::RunConfig& cfg) {
  auto tok = !cfg.tokenizer.path.empty()
                 ? tokenizer::load_tokenizer(config::kTokenizerTypes.name(cfg.tokenizer.type), cfg.tokenizer.path)
                 : tokenizer::load_tokenizer_from_model_dir(cfg.model.from);
  const auto& added = cfg.tokenizer.add_special_tokens;
  if (added.empty()) return tok;
  const auto before = tok->vocab_size();
  tok = tokenizer::with_special_tokens(std::move(tok), added);
  std::string list;
  for (const auto& t : added) list += concat(list.empty() ? "" : ", ", t);
  log::info("tokenizer: special tokens ", list, " (vocabulary ", before, " -> ", tok->vocab_size(), ")");
  return tok;
}

/// Row 0 of a batch as text, trained tokens inside [[ ]]; trailing padding
/// (untrained pad tokens) dropped.
std::string render_first_row(const Batch& batch, const tokenizer::Tokenizer& tok) {
  const auto ids_it = batch.tensors.find("input_ids"), labels_it = batch.tensors.find("labels");
  if (ids_it == batch.tensors.end() || labels_it == batch.tensors.end())
    return "(this objective's batches hold no input_ids/labels)";
  const auto ids = ids_it->second[0].contiguous(), labels = labels_it->second[0].contiguous();
  const auto* id = ids.data_ptr<int64_t>();
  const auto* label = labels.data_ptr<int64_t>();
  int64_t n = ids.numel();
  const int64_t pad = tok.padding_id();
  while (n > 0 && id[n - 1] == pad && label[n - 1] == chat::kIgnoreIndex) --n;
  std::string out;
  for (int64_t i = 0; i < n;) {
    const bool trained = label[i] != chat::kIgnoreIndex;
    std::vector<int64_t> span;
    for (; i < n && (label[i] != chat::kIgnoreIndex) == trained; ++i) span.push_back(id[i]);
    const auto text = tok.decode(span, false);
    out += trained ? "[[" + text + "]]" : text;
  }
  return out;
}

/// The checkpoint a run continues from: train.resume_from, else output_dir's
/// latest complete one (train.resume: auto), else none.
std::optional<stdfs::path> checkpoint_to_resume(const config::RunConfig& cfg, const stdfs::path& out_dir) {
  if (!cfg.train.resume_from.empty()) {
    const stdfs::path from = cfg.train.resume_from;
    if (!stdfs::exists(from / io::kTrainerStateFile))
      throw ConfigError(concat("train.resume_from: ", from.string(), " is not a complete checkpoint (no ",
                               io::kTrainerStateFile, ")"));
    return from;
  }
  auto latest = checkpoint::latest_checkpoint(out_dir);
  if (latest && cfg.train.resume == config::Resume::kNever)
    throw ConfigError(concat("train.resume: never, but ", out_dir.string(), " holds ", latest->filename().string(),
                             "; use another output_dir, or train.resume: auto to continue that run"));
  return latest;
}

/// A resume compares the new config with the checkpoint's: keys that extend
/// or observe the run may change (each change logged); any other difference
/// stops the run unless train.allow_config_change is set.
void check_resume_config(const stdfs::path& ckpt, const std::string& config_yaml, const config::RunConfig& cfg) {
  const auto saved_path = ckpt / "config.yaml";
  if (!stdfs::exists(saved_path)) {
    log::warn("resume: ", saved_path.string(), " is missing, so the config cannot be compared with the run's");
    return;
  }
  std::vector<config::ConfigChange> blocked;
  for (const auto& c : config::config_changes(fs::read_file(saved_path), config_yaml)) {
    if (config::may_change_on_resume(c.key)) {
      log::info("resume: ", c.key, " changes from ", c.before, " to ", c.after);
    } else if (cfg.train.allow_config_change) {
      log::warn("resume: ", c.key, " changes from ", c.before, " to ", c.after, " (train.allow_config_change)");
    } else {
      blocked.push_back(c);
    }
  }
  if (blocked.empty()) return;
  std::string list;
  for (const auto& c : blocked) list += concat("\n  ", c.key, ": ", c.before, " -> ", c.after);
  throw ConfigError(
      concat("resuming ", ckpt.string(), ": this config differs from the run's (", saved_path.string(),
             ") in keys that change training:", list,
             "\nStart a new run with another output_dir, or set train.allow_config_change=true to "
             "continue with the new values (each start's config is kept in output_dir/config-history/)."));
}

/// Sharded runs (several ranks, a sharding strategy or mixed precision on
/// one, or one resuming a sharded checkpoint) get a communicator; a plain
/// single-process run has none.
bool sharded_run(const config::RunConfig& cfg, int64_t ranks, const std::optional<stdfs::path>& latest) {
  return ranks > 1 || cfg.dist.sharding != config::Sharding::kNoShard ||
         cfg.dist.param_dtype != config::Dtype::kFloat32 || cfg.dist.reduce_dtype != config::Dtype::kFloat32 ||
         (latest && distributed::is_sharded_checkpoint(*latest));
}

std::shared_ptr<distributed::Communicator> make_comm(const config::RunConfig& cfg, const distributed::ProcessInfo& proc,
                                                     const at::Device& device,
                                                     const std::optional<stdfs::path>& latest) {
  if (!sharded_run(cfg, proc.world_size, latest)) return nullptr;
  distributed::CommOptions co;
  co.backend = config::kBackends.name(cfg.dist.backend);
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
  return distributed::make_communicator(proc, device, co);
}

/// Where the algorithm keeps side ranks (side_ranks): the last ones of the launch run the objective's serve();
/// the others train over their own communicator (sharded as a launch of only them would be).
void split_roles(const config::RunConfig& cfg, RunSetup& r) {
  const auto side = side_ranks(cfg);
  if (side.count == 0) return;
  const int64_t world = r.comm ? r.comm->world_size() : 1;
  if (world <= side.count)
    throw ConfigError(concat(side.key, ": ", side.count, side.count == 1 ? " rank" : " ranks",
                             " apart from training leave none of the launch's ", world, world == 1 ? " rank" : " ranks",
                             " to train; launch at least ", side.count + 1,
                             " (mpirun -np, torchrun --nproc-per-node, srun --ntasks)"));
  r.world = r.comm;
  r.trainers = world - side.count;
  r.side = r.comm->rank() >= r.trainers;
  auto group = r.comm->split(r.side ? 1 : 0, r.comm->rank(), r.side ? "side ranks" : "training ranks");
  r.comm = !r.side && sharded_run(cfg, r.trainers, r.latest) ? group : nullptr;
}

/// The mesh of dist.tensor_parallel, and the ranks data is split over (RankContext): every training rank, or
/// the mesh's data-parallel group (the ranks of a tensor-parallel group read the same rows).
void set_data_ranks(const config::RunConfig& cfg, RunSetup& r) {
  if (cfg.dist.tensor_parallel > 1 || cfg.dist.context_parallel > 1) {
    if (!r.comm) {
      const bool tp = cfg.dist.tensor_parallel > 1;
      throw ConfigError(concat(tp ? "dist.tensor_parallel: " : "dist.context_parallel: ",
                               tp ? cfg.dist.tensor_parallel : cfg.dist.context_parallel, " splits each ",
                               tp ? "block" : "row",
                               " across that many ranks, and this run has 1; launch with "
                               "mpirun -np, torchrun --nproc-per-node or srun --ntasks"));
    }
    r.mesh = std::make_shared<distributed::Mesh>(
        r.comm, distributed::MeshShape{cfg.dist.tensor_parallel, cfg.dist.context_parallel});
  }
  // Data is split over the data-parallel ranks: every rank, or the mesh's data-parallel group (the ranks of a
  // tensor- or context-parallel group read the same rows).
  const auto data = r.mesh ? r.mesh->dp : r.comm;
  r.ranks.world = data ? data->world_size() : 1;
  r.ranks.rank = data ? data->rank() : 0;
  if (data && r.ranks.world > 1) {
    r.ranks.sum = [comm = data, device = r.device](std::vector<double>& v) {
      auto t = at::tensor(v, at::kDouble).to(device);
      comm->all_reduce_sum(t, "step or evaluation statistics");
      t = t.cpu().contiguous();
      std::copy(t.data_ptr<double>(), t.data_ptr<double>() + v.size(), v.begin());
    };
    r.ranks.gather = [comm = data, device = r.device](const std::vector<double>& mine, std::vector<double>& all) {
      const auto in = at::tensor(mine, at::kDouble).to(device);
      auto out = at::empty({in.numel() * comm->world_size()}, in.options());
      comm->all_gather(out, in, "rollout rows").wait();
      out = out.cpu().contiguous();
      all.assign(out.data_ptr<double>(), out.data_ptr<double>() + out.numel());
    };
  }
}

/// One chat format from data to checkpoint: data.template, else the one
/// recorded with model.from (else with the tokenizer's folder); the
/// checkpoints record it. Returns the template's name.
std::string resolve_template(const config::RunConfig& cfg, tokenizer::Tokenizer& tok) {
  const bool from_model = !cfg.model.from.empty() && tokenizer::has_tokenizer(cfg.model.from);
  const auto where = from_model ? cfg.model.from : cfg.tokenizer.path;
  const auto recorder =
      from_model && !cfg.tokenizer.path.empty() ? tokenizer::load_tokenizer_from_model_dir(where) : nullptr;
  const auto& rec_tok = recorder ? *recorder : tok;
  const auto name = chat::resolve_chat_template(rec_tok, cfg.data.template_name, "data.template", where, "");
  if (cfg.data.template_name == "auto")
    log::info("data.template: ", name,
              name == "hf" ? concat(", the chat_template of ", where, " rendered as written")
              : chat::recorded_chat_format(rec_tok).kind == chat::RecordedChatFormat::Kind::builtin
                  ? concat(", the format recorded in ", where)
                  : concat(" (", where, " records no chat format)"));
  // hf renders the recorded Jinja itself, which the run's tokenizer may not carry.
  tok.set_chat_template(name == "hf" ? rec_tok.chat_template() : chat::ChatTemplate::get(name).jinja(tok));
  return name;
}

}  // namespace

RunSetup setup_run(const config::RunConfig& cfg, const RunOptions& options) {
  log::configure(log::parse_level(cfg.logging.level));
  const auto proc = distributed::discover_from_environment();
  if (cfg.train.threads > 0) at::set_num_threads(static_cast<int>(cfg.train.threads));
  RunSetup r;
  r.device = parse_device(cfg.train.device);
  if (r.device.is_cuda() && !r.device.has_index() && proc.world_size > 1)
    r.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(proc.local_rank));
  set_tf32(cfg.train.tf32);
  kernels::set_fused_ops(cfg.train.fused_kernels);
  set_unverified_cuda_allowed(cfg.train.unverified_cuda);
  if (r.device.is_cuda() && !cfg.train.unverified_cuda)
    log::info(
        "train.unverified_cuda: false: on CUDA the paths no GPU has run yet stay off (the fused rope, gated-MLP "
        "and LayerNorm-backward kernels, packed rows through flash attention, overlapped step reads, pinned "
        "batch copies); what runs instead has passed bench/gpu/run.sh check (docs/benchmarks.md)");
  r.out_dir = cfg.output_dir;
  r.config_yaml = config::to_yaml(cfg);
  r.latest = checkpoint_to_resume(cfg, r.out_dir);
  // Evaluating a checkpoint continues nothing, so any config may evaluate it.
  if (r.latest && !options.eval_only) check_resume_config(*r.latest, r.config_yaml, cfg);
  r.comm = make_comm(cfg, proc, r.device, r.latest);
  r.lead = !r.comm || r.comm->rank() == 0;
  split_roles(cfg, r);
  if (!r.lead) log::configure(log::Level::warn);  // one rank reports
  set_data_ranks(cfg, r);

  // train.micro_batch_size: auto: one micro-batch per rank of the step's whole batch, which the loop halves on
  // every rank when a step runs out of device memory on any (the ranks agree before each collective:
  // distributed::ShardingOptions::agree_on_out_of_memory).
  r.auto_micro_batch = cfg.train.micro_batch_size == config::TrainConfig::kAutoMicroBatch;
  if (r.auto_micro_batch && cfg.train.global_batch_size % r.ranks.world != 0)
    throw ConfigError(concat("train.global_batch_size: ", cfg.train.global_batch_size, " samples per step do not ",
                             "divide among ", r.ranks.world, " ranks (train.micro_batch_size: auto starts from one ",
                             "micro-batch per rank); expected a multiple of ", r.ranks.world));
  r.micro_batch_size = r.auto_micro_batch ? cfg.train.global_batch_size / r.ranks.world : cfg.train.micro_batch_size;
  // Batch math: the same global batch whatever the world size.
  r.micro_per_step =
      cfg.train.global_batch_size > 0 ? cfg.train.global_batch_size / r.micro_batch_size : cfg.train.grad_accum_steps;
  if (r.micro_per_step % r.ranks.world != 0)
    throw ConfigError(concat(cfg.train.global_batch_size > 0 ? "train.global_batch_size" : "train.grad_accum_steps",
                             ": a step of ", r.micro_per_step, " micro-batches of ", r.micro_batch_size,
                             " samples does not divide among ", r.ranks.world, " ranks; expected a multiple of ",
                             r.ranks.world * r.micro_batch_size, " samples per step"));

  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  r.tok = build_tokenizer(cfg);
  // full_shard over several ranks reads each rank's ranges of the folder's weights into its shards, unless
  // a plain checkpoint (read into the whole model first) is resumed. Under tensor parallelism the cut layers'
  // shares are read one parameter at a time when cut (distributed::apply_tensor_parallel), the rest as ranges.
  std::optional<at::Device> deferred_on;
  if (r.comm && cfg.dist.sharding == config::Sharding::kFullShard &&
      (!r.latest || distributed::is_sharded_checkpoint(*r.latest)))
    deferred_on = r.device;
  r.model = build_model(cfg, *r.tok, deferred_on);
  r.model->to(r.device);
  r.model->train();
  // data.max_length defaults to the model's context, which model.from only knows once loaded.
  auto data_cfg = cfg;
  data_cfg.train.micro_batch_size = r.micro_batch_size;
  if (data_cfg.data.max_length == 0) data_cfg.data.max_length = r.model->max_positions();
  if (data_cfg.data.max_length > r.model->max_positions())
    throw ConfigError(concat("data.max_length: ", data_cfg.data.max_length, " exceeds the model's ",
                             r.model->max_positions(), " positions"));
  // Packed rows are data.max_length long, and context parallelism cuts each into 2 x cp chunks (unpacked rows
  // are padded to a multiple).
  if (const int64_t cp = cfg.dist.context_parallel; cp > 1 && cfg.data.packing && data_cfg.data.max_length % (2 * cp))
    throw ConfigError(concat("data.max_length: packed rows of ", data_cfg.data.max_length,
                             " positions do not split into 2 x dist.context_parallel = ", 2 * cp,
                             " chunks (each rank of a context-parallel group holds a head and a tail chunk); "
                             "expected a multiple of ",
                             2 * cp));
  // The chat format is resolved (and recorded with the tokenizer) for an
  // algorithm that reads data.template, as it declared when it registered;
  // plain for the others. The objective gets the object, built here once.
  if (const auto reads = config::keys_read_by(cfg.algorithm);
      std::find(reads.begin(), reads.end(), "data.template") != reads.end())
    data_cfg.data.template_name = resolve_template(cfg, *r.tok);
  const auto& chat = chat::ChatTemplate::get(data_cfg.data.template_name == "auto" ? std::string("plain")
                                                                                   : data_cfg.data.template_name);
  r.objective = make_objective(data_cfg, *r.tok, chat);
  if (r.auto_micro_batch && !r.objective->splits_rows())
    throw ConfigError(concat("train.micro_batch_size: auto: algorithm ", cfg.algorithm,
                             " cannot split its micro-batches (its rows' losses depend on each other or it builds "
                             "its own batches; sft and pretrain can); set a number"));
  r.objective->set_ranks(r.ranks);
  return r;
}

int64_t steps_for_epochs(double epochs, int64_t rows_per_epoch, int64_t rows_per_step) {
  const int64_t per_epoch = std::max<int64_t>(1, (rows_per_epoch + rows_per_step - 1) / rows_per_step);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(epochs * static_cast<double>(per_epoch))));
}

config::RunConfig resolve_length(const config::RunConfig& cfg, RunSetup& r) {
  auto out = cfg;
  out.train.micro_batch_size = r.micro_batch_size;  // auto's start
  const auto& t = out.train;
  if (t.num_train_epochs > 0 && t.max_steps > 0) {
    log::info("train.max_steps (", t.max_steps, ") is set, so it counts the run, not train.num_train_epochs (",
              format_number(t.num_train_epochs), "), as in transformers");
  } else if (t.num_train_epochs > 0) {
    const auto& source = r.objective->train_source();
    const int64_t rows = source.rows_per_epoch(), samples = source.samples_per_epoch();
    if (rows <= 0 || !r.objective->plan(1).empty())
      throw ConfigError(concat("train.num_train_epochs: the steps of algorithm ", cfg.algorithm,
                               " do not pass over its training data in rows of train.micro_batch_size, so epochs "
                               "give no step count; set train.max_steps"));
    const int64_t per_step = r.micro_per_step * t.micro_batch_size;
    out.train.max_steps = steps_for_epochs(t.num_train_epochs, rows, per_step);
    log::info("train.num_train_epochs ", format_number(t.num_train_epochs), ": ", out.train.max_steps,
              " steps (an epoch of ", samples, " samples",
              rows != samples ? concat(" in ", rows, " packed rows") : std::string(), " is ",
              steps_for_epochs(1, rows, per_step), " steps of ", per_step, rows != samples ? " rows" : " samples", ")");
  }
  if (cfg.schedule.warmup_ratio > 0) {
    out.schedule.warmup_steps = optim::warmup_steps(cfg.schedule, out.train.max_steps);
    log::info("schedule.warmup_ratio ", format_number(cfg.schedule.warmup_ratio), ": ", out.schedule.warmup_steps,
              " warmup steps of ", out.train.max_steps);
  }
  return out;
}

/// --dry-run: the plan of the run, from the first micro-batch.
void print_plan(RunSetup& r, const config::RunConfig& cfg) {
  int64_t n_params = 0;
  for (const auto& p : r.model->parameters()) n_params += p.numel();
  const int64_t samples_per_step = r.micro_per_step * cfg.train.micro_batch_size;
  auto first = r.objective->train_source().next();
  const auto sample = render_first_row(first, *r.tok);
  const auto label = r.objective->sample_label(first, 0);
  // Each program is started, asked once and stopped, before anything is printed: a failure is the run's error.
  const auto programs = r.objective->check_programs();
  const double tokens_per_sample =
      static_cast<double>(first.num_tokens) / static_cast<double>(std::max<int64_t>(1, cfg.train.micro_batch_size));
  const int64_t world = r.ranks.world;
  std::ostringstream plan;
  plan << "dry run: nothing is trained or written\n"
       << "  model: " << r.model->family() << ", " << n_params << " parameters, " << r.model->max_positions()
       << " positions, on " << r.device.str() << (world > 1 ? concat(", ", world, " ranks") : std::string()) << "\n"
       << "  algorithm: " << cfg.algorithm << "; " << cfg.train.max_steps << " steps of " << samples_per_step
       << " samples (" << r.micro_per_step << (r.micro_per_step == 1 ? " micro-batch" : " micro-batches") << " of "
       << cfg.train.micro_batch_size << ")";
  if (const auto own = r.objective->plan(cfg.train.max_steps); !own.empty()) {
    plan << "\n  " << cfg.algorithm << ": " << own << "\n";
  } else {
    const auto& source = r.objective->train_source();
    if (const auto epoch = source.samples_per_epoch(), rows = source.rows_per_epoch(); epoch > 0 && rows > 0)
      plan << " = "
           << format_number(static_cast<double>(cfg.train.max_steps * samples_per_step) / static_cast<double>(rows), 3)
           << " epochs of " << epoch << " samples" << (rows != epoch ? concat(" in ", rows, " packed rows") : "");
    plan << "\n  tokens per step: about " << std::llround(tokens_per_sample * static_cast<double>(samples_per_step))
         << " (the first micro-batch holds " << first.num_tokens << " tokens and " << first.num_targets << " "
         << r.objective->target_unit() << ")\n";
  }
  plan << describe(held_against(plan_memory(*r.model, cfg, r.comm ? r.comm->world_size() : 1), r.device))
       << "  resume: "
       << (r.latest ? concat("continues ", r.latest->string()) : std::string("starts fresh in ") + r.out_dir.string())
       << "\n";
  for (const auto& p : programs) plan << "  program: " << p << "\n";
  plan << "  first training sample (" << (label.empty() ? "" : label + "; ") << "trained tokens in [[ ]]):\n"
       << sample << "\n";
  log::info(plan.str());
}

std::string format_number(double x, int precision) {
  std::ostringstream os;
  os << std::setprecision(precision) << x;
  return os.str();
}

void print_memory_plan(const config::RunConfig& cfg, int64_t world) {
  if (world < 1) throw ConfigError(concat("--world-size: expected a positive number of ranks, got ", world));
  // A mesh the world cannot take is refused by key, as a launch of that size would be.
  distributed::MeshLayout(world, distributed::MeshShape{cfg.dist.tensor_parallel, cfg.dist.context_parallel});
  const auto tok = build_tokenizer(cfg);
  // The folder's model without its weights (read: config.json, the tensors' shapes), or the config's.
  auto model = build_model(cfg, *tok, cfg.model.from.empty() ? std::nullopt : std::optional<at::Device>(at::kCPU),
                           /*shapes_only=*/true);
  // Held against train.device's memory where this machine has that device (a plan for GPUs may be made on a
  // machine without one: then it is unknown).
  at::Device device(at::kCPU);
  try {
    device = at::Device(cfg.train.device);
  } catch (const c10::Error&) {
    throw ConfigError(concat("train.device: expected cpu, cuda or cuda:N, got \"", cfg.train.device, "\""));
  }
  std::cout << describe(held_against(plan_memory(*model, cfg, world), device));
}

}  // namespace anvil::train
