#include "optim/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

namespace anvil::optim {
namespace {

std::vector<at::Tensor> make_params() {
  at::manual_seed(3);
  return {at::randn({7, 5}).requires_grad_(), at::randn({11}).requires_grad_(), at::randn({2, 3, 4}).requires_grad_()};
}

void set_grads(std::vector<at::Tensor>& ps, int step) {
  at::manual_seed(100 + step);
  for (auto& p : ps) p.mutable_grad() = at::randn_like(p);
}

TEST(FusedAdamW, MatchesTorchAdamWAndSharesItsCheckpointState) {
  torch::optim::AdamWOptions o(1e-2);
  o.betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  auto a = make_params(), b = make_params();
  FusedAdamW fused(a, o);
  torch::optim::AdamW plain(b, o);
  for (int step = 0; step < 6; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    fused.step();
    plain.step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-6) << i;
    EXPECT_FALSE(at::equal(a[i], make_params()[i])) << "parameters moved";
  }
  // Saved by the fused optimizer, loaded by the plain one: the same next step.
  std::stringstream buf;
  {
    torch::serialize::OutputArchive ar;
    fused.save(ar);
    ar.save_to(buf);
  }
  auto c = std::vector<at::Tensor>{};
  for (auto& p : a) c.push_back(p.detach().clone().requires_grad_());
  torch::optim::AdamW reloaded(c, o);
  {
    torch::serialize::InputArchive ar;
    ar.load_from(buf);
    reloaded.load(ar);
  }
  set_grads(a, 99);
  set_grads(c, 99);
  fused.step();
  reloaded.step();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE((a[i] - c[i]).abs().max().item<double>(), 1e-6) << i;
}

}  // namespace
}  // namespace anvil::optim
