#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "anvil/core/error.h"
#include "distributed/sharding.h"
#include "models/lora.h"

namespace anvil::train {
namespace {

double dtype_bytes(const std::string& name) { return name == "float32" ? 4.0 : 2.0; }

/// A rank's shard of n elements as ShardedModel pads it (a multiple of the world).
int64_t shard_of(int64_t n, int64_t world) { return (n + world - 1) / world; }

std::string bytes_str(double b) {
  std::ostringstream os;
  os.precision(3);
  if (b >= 1e12)
    os << b / 1e12 << " TB";
  else if (b >= 1e9)
    os << b / 1e9 << " GB";
  else if (b >= 1e6)
    os << b / 1e6 << " MB";
  else
    os << b / 1e3 << " kB";
  return os.str();
}

int64_t heads_of(const nlohmann::json& c) {
  for (const char* k : {"num_attention_heads", "n_head"})
    if (c.contains(k) && c[k].is_number_integer()) return c[k].get<int64_t>();
  return 1;
}

}  // namespace

MemoryPlan plan_memory(const models::CausalLM& model, const config::RunConfig& cfg, int64_t world) {
  MemoryPlan p;
  p.world = std::max<int64_t>(world, 1);
  const int64_t L = model.num_layers();
  // The sharding's slots (distributed/sharding.h): the blocks, the root, and the input embeddings when apart.
  const auto embeddings = distributed::input_embedding_unit(const_cast<models::CausalLM&>(model));
  std::vector<int64_t> units(static_cast<size_t>(L) + (embeddings.empty() ? 1 : 2), 0);
  const size_t root = static_cast<size_t>(L), embed = units.size() - 1;
  std::vector<int64_t> frozen(units.size(), 0);  // of each, the parameters a LoRA run does not train
  bool lora = false;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    lora = lora || models::is_lora_parameter(item.key());
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;  // tied
    size_t u = embeddings.count(item.key()) ? embed : root;
    for (int64_t i = 0; i < L; ++i)
      if (item.key().rfind(model.block_prefix(i) + ".", 0) == 0) {
        u = static_cast<size_t>(i);
        break;
      }
    units[u] += item.value().numel();
    if (lora && !models::lora_trains(item.key())) frozen[u] += item.value().numel();
  }
  for (const auto n : units) p.parameters += n;
  p.root = units[root];
  if (!embeddings.empty()) p.embeddings = units[embed];
  for (int64_t i = 0; i < L; ++i) p.largest_block = std::max(p.largest_block, units[static_cast<size_t>(i)]);

  const bool sharded_run = p.world > 1 || cfg.dist.sharding != "no_shard" || cfg.dist.param_dtype != "float32";
  p.strategy = sharded_run ? cfg.dist.sharding : std::string("none");
  const bool shards_state = sharded_run && cfg.dist.sharding != "no_shard";
  int64_t per_rank = 0, frozen_per_rank = 0;  // master elements; frozen units' elements
  // Hybrid sharding shards within groups of world / dist.replicate ranks.
  const int64_t group =
      cfg.dist.replicate > 1 && p.world % cfg.dist.replicate == 0 ? p.world / cfg.dist.replicate : p.world;
  for (size_t u = 0; u < units.size(); ++u) {
    // A sharded run keeps frozen parameters in units of their own (distributed/sharding.h).
    const int64_t f = frozen[u], t = units[u] - f;
    per_rank += shards_state ? shard_of(t, group) : t;
    frozen_per_rank += shards_state ? shard_of(f, group) : f;
    p.frozen_parameters += f;
  }
  if (shards_state) p.replicas = p.world / group;
  const double pb = dtype_bytes(cfg.dist.param_dtype), rb = dtype_bytes(cfg.dist.reduce_dtype);
  p.masters = 4.0 * static_cast<double>(per_rank);
  p.gradients = p.masters;
  // Frozen parameters: the rank's param_dtype shards under full_shard; elsewhere the whole parameters, counted
  // below where whole param_dtype parameters stay beside the masters, else here (float32, one process).
  if (p.strategy == "full_shard")
    p.frozen = pb * static_cast<double>(frozen_per_rank);
  else if (!(sharded_run && (cfg.dist.sharding == "shard_grad_op" || cfg.dist.param_dtype != "float32")))
    p.frozen = 4.0 * static_cast<double>(frozen_per_rank);
  // AdamW's two moments, in optimizer.state_dtype.
  p.moments = 2.0 * dtype_bytes(cfg.optimizer.state_dtype) * static_cast<double>(per_rank);
  if (cfg.dist.cpu_offload && p.strategy == "full_shard") {
    p.offload = true;
    p.device_shards = pb * static_cast<double>(per_rank);
  }
  if (p.strategy == "full_shard") {
    // The root (final norm, heads), the block that runs and the one prefetched; or, at a forward's start, the
    // input embeddings (when apart) and the first block. Two blocks' reductions.
    p.gathered = pb * static_cast<double>(std::max(p.root + 2 * p.largest_block, p.embeddings + p.largest_block));
    p.reductions = 2.0 * rb * static_cast<double>(p.largest_block);
  } else if (sharded_run && (cfg.dist.sharding == "shard_grad_op" || cfg.dist.param_dtype != "float32")) {
    p.gathered = pb * static_cast<double>(p.parameters);  // whole param_dtype parameters beside the masters
  }
  // Eval samples, rollouts (ppo and its GRPO/RLOO/REINFORCE++ estimators), ILQL's samples, on-policy distillation.
  const bool generates =
      cfg.eval.generate_samples > 0 || cfg.algorithm == "ppo" || cfg.algorithm == "ilql" || cfg.algorithm == "distill";
  if (p.strategy == "full_shard" && generates) p.generation = pb * static_cast<double>(p.parameters);

  // Activations of one micro-batch (Korthikanti et al. 2022, at 16 bits; float32 doubles them).
  const double s = static_cast<double>(cfg.data.max_length > 0 ? cfg.data.max_length : model.max_positions());
  // train.micro_batch_size: auto starts from the step's whole batch per rank.
  const int64_t micro = cfg.train.micro_batch_size == config::TrainConfig::kAutoMicroBatch
                            ? std::max<int64_t>(1, cfg.train.global_batch_size / p.world)
                            : cfg.train.micro_batch_size;
  const double b = static_cast<double>(micro), h = static_cast<double>(model.hidden_size());
  const double a = static_cast<double>(heads_of(model.hf_config()));
  const double scale = pb / 2.0;
  const double layer = s * b * h * (34.0 + 5.0 * a * s / h) * scale;
  p.activations = cfg.train.activation_checkpointing
                      ? static_cast<double>(L) * s * b * h * 2.0 * scale + layer  // inputs, one layer recomputed
                      : static_cast<double>(L) * layer;
  // The loss's logits: (b, s, V) float32, unless the fused head computes them a chunk at a time.
  if (!cfg.train.fused_loss) p.activations += 4.0 * b * s * static_cast<double>(model.vocab_size());
  return p;
}

std::string describe(const MemoryPlan& p) {
  std::ostringstream os;
  os << "  memory per rank (" << p.world << " rank(s), " << (p.strategy == "none" ? "one process" : p.strategy)
     << (p.replicas > 1 ? concat(" in ", p.replicas, " replica groups") : std::string()) << "; " << p.parameters
     << " parameters): " << bytes_str(p.step_peak()) << " at a step\n"
     << "    state" << (p.offload ? ", in host memory (dist.cpu_offload)" : "") << ": " << bytes_str(p.state())
     << " (float32 masters " << bytes_str(p.masters) << ", gradients " << bytes_str(p.gradients) << ", AdamW moments "
     << bytes_str(p.moments) << ")\n";
  if (p.frozen > 0)
    os << "    frozen parameters (" << p.frozen_parameters << ", no gradient or moments): " << bytes_str(p.frozen)
       << "\n";
  if (p.offload) os << "    parameter shards on the device: " << bytes_str(p.device_shards) << "\n";
  if (p.gathered > 0) os << "    whole parameters held at once in a step: " << bytes_str(p.gathered) << "\n";
  if (p.reductions > 0) os << "    gradient reductions in flight: " << bytes_str(p.reductions) << "\n";
  os << "    activations of a micro-batch (estimate): " << bytes_str(p.activations) << "\n";
  if (p.generation > 0)
    os << "    generation gathers the whole model: " << bytes_str(p.generation)
       << " more while it decodes (tensor parallelism is the way past it)\n";
  return os.str();
}

}  // namespace anvil::train
