#pragma once
// A sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE): a linear router picks
// the top-k of E SwiGLU experts per token, as transformers does it, and
// records what the load-balancing loss needs (CausalLM::take_aux_loss).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "anvil/models/causal_lm.h"
#include "models/layers.h"

namespace anvil::models::moe {

struct MoeOptions {
  TORCH_ARG(int64_t, hidden_size) = 0;
  /// Each expert's MLP width.
  TORCH_ARG(int64_t, intermediate_size) = 0;
  TORCH_ARG(int64_t, num_experts) = 8;
  /// Experts per token (top-k).
  TORCH_ARG(int64_t, top_k) = 2;
  /// The top-k probabilities are divided by their sum (Mixtral always;
  /// Qwen3-MoE's norm_topk_prob).
  TORCH_ARG(bool, norm_topk_prob) = true;
  /// Training only: the layer input is multiplied by U(1 - j, 1 + j) noise
  /// (Mixtral's router_jitter_noise); 0 = none.
  TORCH_ARG(double, jitter_noise) = 0.0;
  TORCH_ARG(std::string, act) = "silu";
  /// Expert parameter names: "w1_w2_w3" (Mixtral: w1 gate, w3 up, w2 down) or
  /// "gate_up_down" (Qwen3-MoE: gate_proj, up_proj, down_proj).
  TORCH_ARG(std::string, expert_names) = "gate_up_down";
};

/// One SwiGLU expert: down(act(gate(x)) * up(x)).
class ExpertImpl : public torch::nn::Module {
 public:
  explicit ExpertImpl(const MoeOptions& o);
  at::Tensor forward(const at::Tensor& x);
  layers::Linear gate{nullptr}, up{nullptr}, down{nullptr};
  std::string act;
};
TORCH_MODULE(Expert);

/// How the experts are computed: one matmul per expert over its tokens (the
/// CPU's way, and any expert carrying a LoRA adapter), or at::_grouped_mm over
/// all of them at once (CUDA).
enum class ExpertCompute { kAuto, kLoop, kGrouped };

class SparseMoeBlockImpl : public torch::nn::Module {
 public:
  explicit SparseMoeBlockImpl(const MoeOptions& o);
  /// x (B, T, C) -> (B, T, C). With args.router, records this call's router
  /// statistics and routes the load-balancing loss's gradient to `gate`.
  at::Tensor forward(const at::Tensor& x, const ForwardArgs& args);
  /// The router: Linear(C -> E), no bias (HF `gate`).
  layers::Dense gate{nullptr};
  torch::nn::ModuleList experts{nullptr};
  MoeOptions options;
  ExpertCompute compute = ExpertCompute::kAuto;

 private:
  at::Tensor loop_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weights);
  at::Tensor grouped_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weights);
};
TORCH_MODULE(SparseMoeBlock);

}  // namespace anvil::models::moe
