#include "anvil/optim/optimizer.h"

#include <torch/optim/adamw.h>

namespace anvil::optim {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params) {
  torch::optim::AdamWOptions o(c.lr);
  o.betas({c.betas.at(0), c.betas.at(1)}).eps(c.eps).weight_decay(c.weight_decay);
  return std::make_unique<torch::optim::AdamW>(params, o);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

}  // namespace anvil::optim
