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

// A step skipped on the device (skip_next_if, the kernel's found_inf) leaves
// parameters, moments and the device's step counters as they were; once the
// host takes its count back (take_back, possibly after a later step), the
// optimizer equals one that never took the step, state and next steps alike.
TEST(FusedAdamW, StepSkippedOnTheDeviceEqualsNoStep) {
  torch::optim::AdamWOptions o(1e-2);
  o.betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  auto a = make_params(), b = make_params();
  FusedAdamW skipping(a, o), plain(b, o);
  const auto one = at::ones({}, at::kFloat), zero = at::zeros({}, at::kFloat);
  // a: step 1 skipped (no state before it), 2 applied, 3 skipped, 4 and 5 applied; step 3 is taken back only
  // after step 4. b: the applied steps alone, with the same gradients.
  int64_t first = 0, third = 0;
  for (int step = 1; step <= 5; ++step) {
    set_grads(a, step);
    const bool skip = step == 1 || step == 3;
    const int64_t ticket = skipping.skip_next_if(skip ? one : zero);
    if (step == 1) first = ticket;
    if (step == 3) third = ticket;
    const auto before = a.front().detach().clone();
    skipping.step();
    if (skip) EXPECT_TRUE(at::equal(before, a.front())) << "step " << step << " moved the parameters";
    if (step == 1) skipping.take_back(first);
    if (step == 4) skipping.take_back(third);
    if (!skip) {
      set_grads(b, step);
      plain.step();
    }
  }
  EXPECT_EQ(first, 1);
  EXPECT_EQ(third, 3);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i], b[i])) << i;
    const auto* sa = adamw_state(skipping, a[i]);
    const auto* sb = adamw_state(plain, b[i]);
    ASSERT_TRUE(sa && sb);
    EXPECT_EQ(sa->step(), 3) << i;
    EXPECT_EQ(sa->step(), sb->step()) << i;
    EXPECT_TRUE(at::equal(sa->exp_avg(), sb->exp_avg())) << i;
    EXPECT_TRUE(at::equal(sa->exp_avg_sq(), sb->exp_avg_sq())) << i;
  }
  EXPECT_THROW(skipping.take_back(99), c10::Error);  // not a step it took
}

// A step split for a CUDA graph (queue_step with a tensor learning rate and
// a skip flag, then count_step on the host) equals step() after skip_next_if,
// skipped steps and take_back included: parameters, moments, step counts.
TEST(FusedAdamW, QueuedAndCountedStepsEqualSteps) {
  torch::optim::AdamWOptions o(0.015625);  // a power of 2: the float32 tensor holds it exactly
  o.betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  auto a = make_params(), b = make_params();
  FusedAdamW split(a, o), whole(b, o);
  const auto one = at::ones({}, at::kFloat), zero = at::zeros({}, at::kFloat);
  const auto lr = at::full({}, 0.015625, at::kFloat);
  for (int step = 1; step <= 6; ++step) {
    const bool skip = step == 2 || step == 5;
    set_grads(a, step);
    set_grads(b, step);
    const auto queued = split.queue_step(lr, skip ? one : zero);
    EXPECT_EQ(queued.counters_rebuilt, step == 1) << "step " << step;  // made once, then advanced on the device
    EXPECT_TRUE(queued.skippable);
    const int64_t t_split = split.count_step(queued);
    const int64_t t_whole = whole.skip_next_if(skip ? one : zero);
    whole.step();
    EXPECT_EQ(t_split, t_whole);
    if (skip) split.take_back(t_split), whole.take_back(t_whole);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i], b[i])) << i;
    const auto *sa = adamw_state(split, a[i]), *sb = adamw_state(whole, b[i]);
    ASSERT_TRUE(sa && sb);
    EXPECT_EQ(sa->step(), 4) << i;
    EXPECT_EQ(sa->step(), sb->step()) << i;
    EXPECT_TRUE(at::equal(sa->exp_avg(), sb->exp_avg())) << i;
    EXPECT_TRUE(at::equal(sa->exp_avg_sq(), sb->exp_avg_sq())) << i;
  }
  EXPECT_THROW(split.queue_step(at::full({}, 0.01, at::kDouble), zero), c10::Error);  // the kernel reads float32
}

}  // namespace
}  // namespace anvil::optim
