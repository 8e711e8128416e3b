#pragma once
// Building the optimizer from config and setting its learning rate.

#include <torch/optim/optimizer.h>

#include <memory>

#include "anvil/config/config.h"

namespace anvil::optim {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params);

void set_lr(torch::optim::Optimizer& opt, double lr);

}  // namespace anvil::optim
