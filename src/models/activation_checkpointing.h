#pragma once
// Activation checkpointing of one block (a plain run installs it as the
// model's block runner; the sharded model uses it inside its own).

#include <ATen/core/Tensor.h>

#include "anvil/models/causal_lm.h"

namespace anvil::models {

/// Runs `block(x)` keeping only `x`: the block is run again in backward, with
/// the random-number state of the forward restored so dropout masks repeat.
/// Without grad mode or when `x` needs no gradient, just calls the block.
at::Tensor checkpoint_block(const BlockFn& block, const at::Tensor& x);

}  // namespace anvil::models
