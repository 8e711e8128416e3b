#pragma once
// The bytes each rank will hold (trainer --plan-memory, --dry-run and the
// first lines of every run): the model's parameter count per sharding unit
// (blocks and the root), the strategy, the world size and the dtypes give
// the state exactly as ShardedModel lays it out; activations are an
// estimate: per token, the tensors Anvil's layers keep for the backward
// (memory_plan.cpp's activation_counts, in the spirit of Korthikanti et al.
// 2022, "Reducing Activation Recomputation in Large Transformer Models",
// whose 34·s·b·h bytes per layer count Megatron's layers at 16 bits), with
// activation checkpointing each layer's input and one layer recomputed.
// docs/distributed.md, "How many GPUs do I need".

#include <cstdint>
#include <string>

#include "anvil/config/config.h"
#include "anvil/models/causal_lm.h"

namespace anvil::train {

struct MemoryPlan {
  int64_t world = 1;
  int64_t tensor_parallel = 1, context_parallel = 1;  // dist.tensor_parallel, dist.context_parallel
  int64_t parameters_whole = 0;                       // the model's, each tied one once
  int64_t parameters = 0;     // of them, a rank's tensor-parallel share (all of them without tensor parallelism)
  int64_t largest_block = 0;  // elements of the largest transformer block
  int64_t root = 0;           // elements outside the blocks (final norm, heads; the embeddings when not apart)
  int64_t embeddings = 0;     // the input embeddings' unit (untied embeddings: sharding gathers them apart)
  std::string strategy;       // dist.sharding, or "none" on one process
  int64_t replicas = 1;       // dist.replicate: replica groups, each sharding over world / replicas ranks
  // Bytes per rank.
  int64_t frozen_parameters = 0;  // of them, those LoRA's base leaves untrained
  double masters = 0;             // float32 master parameters (the rank's shards, or whole) of what trains
  double frozen = 0;              // frozen parameters: param_dtype shards (full_shard), or whole
  double gradients = 0;           // the masters' gradients
  double moments = 0;             // AdamW's two moments
  double gathered = 0;            // whole param_dtype parameters beyond the masters at once in a step
  double reductions = 0;          // flat gradients in flight (full_shard: two blocks)
  double activations = 0;         // one micro-batch's saved activations (estimate)
  double generation = 0;          // the whole param_dtype model generation gathers (full_shard, when it generates)
  bool offload = false;           // dist.cpu_offload: state() lives in host memory
  double device_shards = 0;       // under offload: the param_dtype shards the device keeps
  // What the step is held against (held_against): the device's memory, or -1 where unknown.
  double device_memory = -1;
  bool host = false;  // the device is the CPU: the host's memory, which the ranks on it share
  double state() const { return masters + gradients + moments; }
  /// What the device (or, on CPU runs, the process) holds at a step; under offload state() is host memory.
  double step_peak() const {
    return (offload ? device_shards : state()) + frozen + gathered + reductions + activations;
  }
};

/// The plan of `model` (built or deferred: only shapes are read) for
/// `world` ranks under cfg.dist, at cfg.train's micro batch and
/// data.max_length (the model's context when 0).
MemoryPlan plan_memory(const models::CausalLM& model, const config::RunConfig& cfg, int64_t world);

/// `plan` held against the memory of `device` (core/device.h's
/// device_memory_bytes): its last line says whether the step fits.
MemoryPlan held_against(MemoryPlan plan, const c10::Device& device);

/// Its lines, indented by two spaces, "memory per rank (...)" first.
std::string describe(const MemoryPlan& plan);

}  // namespace anvil::train
