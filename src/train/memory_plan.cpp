#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "anvil/core/error.h"
#include "core/device.h"
#include "distributed/sharding.h"
#include "models/lora.h"
#include "models/tensor_parallel.h"

namespace anvil::train {
namespace {

double dtype_bytes(config::Dtype dtype) { return dtype == config::Dtype::kFloat32 ? 4.0 : 2.0; }

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

/// The first of `keys` config.json holds as a positive number, else `otherwise`.
double number_of(const nlohmann::json& c, std::initializer_list<const char*> keys, double otherwise) {
  for (const char* k : keys)
    if (c.contains(k) && c[k].is_number() && c[k].get<double>() > 0) return c[k].get<double>();
  return otherwise;
}

/// Elements per token a layer keeps for its backward, and what the step keeps
/// beside the layers (the embeddings' output, the final norm, the gradients
/// in flight at the backward's peak), counted from Anvil's layers as ATen
/// runs them on the CPU: a LayerNorm keeps its input and the next
/// projection its output (2 hidden-sized tensors), an RMSNorm composition
/// 3; attention keeps q, k, v after RoPE and its output (SDPA's flash
/// kernels keep no scores), eager soft-capped attention (Gemma 2) its
/// scores, their tanh and the probabilities; a GELU MLP its projection and
/// activation (2 intermediate-sized tensors), a gated one gate, up, the
/// activation and the product (4). A mixture of experts counts its top-k
/// experts per token. tests/distributed/sharding_test.cpp checks the sum
/// against the counted peak of GPT-2 and LLaMA steps within 10 %.
/// Under tensor parallelism (tp > 1) a rank keeps 1/tp of what lives between a column- and a row-parallel layer
/// (the heads' q, k, v and output, the MLP's intermediates) and, with sequence parallelism (`sequence`), 1/tp of
/// the norms' and residuals' too. `kv` is the elements per token of a layer's keys and values (what context
/// parallelism's all-gather holds whole); `ring` what ring attention's backward holds at once beside them, for
/// one layer: keys and values repeated for the query heads, the gradients of q, k and v (a share's and the
/// running sums, float32), and the key/value share and its gradients in transit.
struct ActivationCounts {
  double layer = 0, outside = 0, kv = 0, ring = 0;
};
ActivationCounts activation_counts(const nlohmann::json& c, double h, double s, double tp = 1, bool sequence = false) {
  const std::string type = c.value("model_type", std::string());
  const bool layer_norm = type == "gpt2" || type == "gpt_neox" || type == "opt";
  const bool gated = !layer_norm;
  const double heads = number_of(c, {"num_attention_heads", "n_head"}, 1);
  const double kv_heads = number_of(c, {"num_key_value_heads"}, heads);
  const double head_dim = number_of(c, {"head_dim"}, h / heads);
  double inter = number_of(c, {"n_inner", "ffn_dim", "intermediate_size"}, 4 * h);
  if (const double k = number_of(c, {"num_experts_per_tok"}, 0); k > 0)
    inter = k * number_of(c, {"moe_intermediate_size"}, inter);
  const double norms = type.rfind("gemma", 0) == 0 ? 4 : 2;  // Gemma's pre and post norms
  const double split = sequence ? tp : 1;
  ActivationCounts a;
  a.layer = norms * (layer_norm ? 2 : 3) * h / split +
            ((heads + 2 * kv_heads) * head_dim + heads * head_dim + (gated ? 4 : 2) * inter) / tp;
  if (number_of(c, {"attn_logit_softcapping"}, 0) > 0) a.layer += 3 * heads * s / tp;
  a.outside = 4 * h + (gated ? 2 : 1) * inter / tp;
  a.kv = 2 * kv_heads * head_dim / tp;
  a.ring = (6 * heads + 8 * kv_heads) * head_dim / tp;
  return a;
}

/// The parameters dist.tensor_parallel cuts (1/tp of each per rank): the block layers its family's plan makes
/// column- or row-parallel (a column-parallel layer's bias too) and, with dist.vocab_parallel, the input embedding
/// and an untied LM head (distributed/tensor_parallel.h).
std::unordered_set<std::string> cut_parameters(const models::CausalLM& model, bool vocab_parallel) {
  std::unordered_set<std::string> cut;
  const auto plan = models::tensor_parallel_plan(model);
  std::vector<std::string> prefixes;
  for (int64_t i = 0; i < model.num_layers(); ++i) prefixes.push_back(model.block_prefix(i) + ".");
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    for (const auto& prefix : prefixes)
      if (item.key().rfind(prefix, 0) == 0)
        for (const auto& rule : plan)
          if (item.key().substr(prefix.size()) == rule.name &&
              (rule.style == models::ParallelStyle::kColumn || rule.style == models::ParallelStyle::kRow)) {
            cut.insert(item.key() + ".weight");
            if (rule.style == models::ParallelStyle::kColumn) cut.insert(item.key() + ".bias");
          }
  if (vocab_parallel) {
    cut.insert(model.token_embedding_parameter());
    for (const auto& name : model.lm_head_parameters()) cut.insert(name);
  }
  return cut;
}

/// One micro-batch's activations on a rank (`data` data-parallel ranks; tensor parallelism tp, context
/// parallelism cp): what Anvil's layers keep for the backward, per token (activation_counts), in `pb`-byte elements.
double activation_bytes(const models::CausalLM& model, const config::RunConfig& cfg, int64_t data, int64_t tp,
                        int64_t cp, double pb) {
  const auto L = static_cast<double>(model.num_layers());
  const double s = static_cast<double>(cfg.data.max_length > 0 ? cfg.data.max_length : model.max_positions());
  // train.micro_batch_size: auto starts from the step's whole batch per data-parallel rank.
  const int64_t micro = cfg.train.micro_batch_size == config::TrainConfig::kAutoMicroBatch
                            ? std::max<int64_t>(1, cfg.train.global_batch_size / data)
                            : cfg.train.micro_batch_size;
  // Context parallelism: a rank runs 1/cp of each row's positions.
  const double rows = static_cast<double>(micro), tokens = s * rows / static_cast<double>(cp),
               h = static_cast<double>(model.hidden_size());
  const bool sequence = tp > 1 && cfg.dist.sequence_parallel;
  const auto counts = activation_counts(model.hf_config(), h, s, static_cast<double>(tp), sequence);
  const double between = sequence ? h / static_cast<double>(tp) : h;  // a layer's input, a checkpoint keeps
  const bool checkpointed = cfg.train.activation_checkpointing;
  double bytes =
      pb * tokens * (checkpointed ? L * between + counts.layer + 4.0 * h : L * counts.layer + counts.outside);
  // The all-gather mode holds each layer's keys and values of the whole row for its backward (ring mode only the
  // rank's share, counted above, and one layer's buffers in its backward).
  if (cp > 1 && cfg.dist.context_parallel_mode == config::ContextParallelMode::kAllGather)
    bytes += pb * s * rows * counts.kv * (checkpointed ? 1.0 : L) * (1.0 - 1.0 / static_cast<double>(cp));
  else if (cp > 1)
    bytes += 4.0 * tokens * counts.ring;
  // The loss's logits: (b, s, V) float32, unless the fused head computes them a chunk at a time.
  if (!cfg.train.fused_loss) bytes += 4.0 * tokens * static_cast<double>(model.vocab_size());
  return bytes;
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
  // Tensor parallelism: each rank holds its share of the cut parameters, whole ones beside them.
  const int64_t tp = std::max<int64_t>(cfg.dist.tensor_parallel, 1),
                cp = std::max<int64_t>(cfg.dist.context_parallel, 1);
  p.tensor_parallel = tp, p.context_parallel = cp;
  const auto cut = tp > 1 ? cut_parameters(model, cfg.dist.vocab_parallel) : std::unordered_set<std::string>{};
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;  // tied
    size_t u = embeddings.count(item.key()) ? embed : root;
    for (int64_t i = 0; i < L; ++i)
      if (item.key().rfind(model.block_prefix(i) + ".", 0) == 0) {
        u = static_cast<size_t>(i);
        break;
      }
    const int64_t n = cut.count(item.key()) ? item.value().numel() / tp : item.value().numel();
    units[u] += n;
    p.parameters_whole += item.value().numel();
    if (lora && !models::lora_trains(item.key())) frozen[u] += n;
  }
  for (const auto n : units) p.parameters += n;
  p.root = units[root];
  if (!embeddings.empty()) p.embeddings = units[embed];
  for (int64_t i = 0; i < L; ++i) p.largest_block = std::max(p.largest_block, units[static_cast<size_t>(i)]);

  const bool sharded_run =
      p.world > 1 || cfg.dist.sharding != config::Sharding::kNoShard || cfg.dist.param_dtype != config::Dtype::kFloat32;
  p.strategy = sharded_run ? std::string(config::kShardings.name(cfg.dist.sharding)) : std::string("none");
  const bool shards_state = sharded_run && cfg.dist.sharding != config::Sharding::kNoShard;
  int64_t per_rank = 0, frozen_per_rank = 0;  // master elements; frozen units' elements
  // FSDP shards over the ranks that hold the same tensor-parallel share (world / tp, context-parallel ranks
  // included), hybrid sharding within groups of those / dist.replicate.
  const int64_t holders = std::max<int64_t>(p.world / tp, 1);
  const int64_t group =
      cfg.dist.replicate > 1 && holders % cfg.dist.replicate == 0 ? holders / cfg.dist.replicate : holders;
  for (size_t u = 0; u < units.size(); ++u) {
    // A sharded run keeps frozen parameters in units of their own (distributed/sharding.h).
    const int64_t f = frozen[u], t = units[u] - f;
    per_rank += shards_state ? shard_of(t, group) : t;
    frozen_per_rank += shards_state ? shard_of(f, group) : f;
    p.frozen_parameters += f;
  }
  if (shards_state) p.replicas = holders / group;
  const double pb = dtype_bytes(cfg.dist.param_dtype), rb = dtype_bytes(cfg.dist.reduce_dtype);
  p.masters = 4.0 * static_cast<double>(per_rank);
  p.gradients = p.masters;
  // Frozen parameters: the rank's param_dtype shards under full_shard; elsewhere the whole parameters, counted
  // below where whole param_dtype parameters stay beside the masters, else here (float32, one process).
  if (p.strategy == "full_shard")
    p.frozen = pb * static_cast<double>(frozen_per_rank);
  else if (!(sharded_run &&
             (cfg.dist.sharding == config::Sharding::kShardGradOp || cfg.dist.param_dtype != config::Dtype::kFloat32)))
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
  } else if (sharded_run &&
             (cfg.dist.sharding == config::Sharding::kShardGradOp || cfg.dist.param_dtype != config::Dtype::kFloat32)) {
    p.gathered = pb * static_cast<double>(p.parameters);  // whole param_dtype parameters beside the masters
  }
  // Eval samples, rollouts (ppo and its GRPO/RLOO/REINFORCE++ estimators), ILQL's samples, on-policy distillation.
  const bool generates =
      cfg.eval.generate_samples > 0 || cfg.algorithm == "ppo" || cfg.algorithm == "ilql" || cfg.algorithm == "distill";
  if (p.strategy == "full_shard" && generates) p.generation = pb * static_cast<double>(p.parameters);

  // Activations of one micro-batch, on the ranks of each data-parallel one (holders / cp of them).
  p.activations = activation_bytes(model, cfg, std::max<int64_t>(holders / cp, 1), tp, cp, pb);
  return p;
}

MemoryPlan held_against(MemoryPlan plan, const c10::Device& device) {
  const auto bytes = device_memory_bytes(device);
  plan.device_memory = bytes > 0 ? static_cast<double>(bytes) : -1;
  plan.host = device.is_cpu();
  return plan;
}

std::string describe(const MemoryPlan& p) {
  std::ostringstream os;
  os << "  memory per rank (" << p.world << " rank(s), " << (p.strategy == "none" ? "one process" : p.strategy)
     << (p.replicas > 1 ? concat(" in ", p.replicas, " replica groups") : std::string())
     << (p.tensor_parallel > 1 ? concat(", tensor parallel ", p.tensor_parallel) : std::string())
     << (p.context_parallel > 1 ? concat(", context parallel ", p.context_parallel) : std::string()) << "; "
     << p.parameters_whole << " parameters"
     << (p.tensor_parallel > 1 ? concat(", ", p.parameters, " in a rank's tensor-parallel share") : std::string())
     << "): " << bytes_str(p.step_peak()) << " at a step\n"
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
  if (p.device_memory > 0) {
    // What the device holds at a step: under offload the state is host memory, and so is all of it on the CPU.
    // Generation's whole copy is held beside the shards while it decodes, not during a step.
    const double offloaded = p.host && p.offload ? p.state() : 0.0;
    const double held = (p.offload ? p.device_shards : p.state()) + p.frozen + offloaded;
    const double need = std::max(p.step_peak() + offloaded, held + p.generation);
    const double percent = 100.0 * need / p.device_memory;
    const std::string share = percent < 1 ? std::string("under 1 %") : concat(std::lround(percent), " %");
    os << "    against " << (p.host ? "this host's memory" : "the device's memory") << ", "
       << bytes_str(p.device_memory) << (p.host ? " (shared by the ranks on it)" : "") << ": "
       << (need <= p.device_memory ? concat("fits, ", share, " of it per rank")
                                   : concat("does not fit: ", bytes_str(need), " per rank"))
       << ", before the process's own (LibTorch" << (p.host ? "" : ", the CUDA context") << ")\n";
  }
  return os.str();
}

}  // namespace anvil::train
