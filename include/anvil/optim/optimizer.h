#pragma once
// Building the optimizer from config and setting its learning rate.

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <memory>

#include "anvil/config/config.h"

namespace anvil::optim {

/// AdamW with torch's fused multi-tensor kernel (`_fused_adamw_`, CPU and
/// CUDA): one pass over parameters, gradients and moments per step instead of
/// a dozen element-wise ops per tensor. Same state as torch::optim::AdamW, so
/// checkpoints move freely between the two; results agree to float round-off.
class FusedAdamW final : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params);

void set_lr(torch::optim::Optimizer& opt, double lr);

/// The AdamW state the optimizer holds for parameter `p`, or nullptr before its first step.
torch::optim::AdamWParamState* adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& p);

}  // namespace anvil::optim
