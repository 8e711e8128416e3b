// Activation checkpointing: a block keeps only its input and is run again in
// backward, with the forward's random-number state, so dropout repeats.
#include "models/activation_checkpointing.h"

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>

namespace anvil::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<at::Device> rng_devices(const at::Tensor& x) {
  std::vector<at::Device> d{at::Device(at::kCPU)};
  if (!x.device().is_cpu()) d.push_back(x.device());
  return d;
}

std::vector<at::Tensor> get_rng(const std::vector<at::Device>& devices) {
  std::vector<at::Tensor> out;
  for (const auto& d : devices) {
    auto gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.push_back(gen.get_state());
  }
  return out;
}

void set_rng(const std::vector<at::Device>& devices, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < devices.size(); ++i) {
    auto gen = at::globalContext().defaultGenerator(devices[i]);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(states[i]);
  }
}

struct CheckpointState : torch::CustomClassHolder {
  models::BlockFn block;
  std::vector<at::Device> devices;
  std::vector<at::Tensor> rng;
};

/// Keeps the block's input only; backward re-runs the block (with the RNG
/// state of the forward) and back-propagates through the fresh graph, which
/// accumulates the block's parameter gradients as a normal backward would.
struct CheckpointBlock : public torch::autograd::Function<CheckpointBlock> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<CheckpointState> st) {
    st->devices = rng_devices(x);
    st->rng = get_rng(st->devices);
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return st->block(x);  // grad mode is off here: nothing is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto x = ctx->get_saved_variables()[0];
    const auto now = get_rng(st->devices);
    set_rng(st->devices, st->rng);
    auto xd = x.detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode enable(true);
      y = st->block(xd);
    }
    set_rng(st->devices, now);
    torch::autograd::backward({y}, {grads[0]});
    return {xd.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint_block(const models::BlockFn& block, const at::Tensor& x) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return block(x);
  auto st = c10::make_intrusive<CheckpointState>();
  st->block = block;
  return CheckpointBlock::apply(x, st);
}

}  // namespace anvil::models
