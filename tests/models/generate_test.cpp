#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

namespace anvil::generation {
namespace {

std::set<int64_t> drawn(const at::Tensor& logits, const SamplingOptions& opt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::set<int64_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sample_next(logits, opt, gen));
  return seen;
}

TEST(Sampling, GreedyTopKAndTopPKeepTheRightTokens) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625.
  auto logits = at::log(at::tensor({0.0625, 0.5, 0.125, 0.25, 0.0625}));
  SamplingOptions opt;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  EXPECT_EQ(sample_next(logits, opt, gen), 1);  // greedy by default

  opt.greedy = false;
  EXPECT_EQ(drawn(logits, opt), (std::set<int64_t>{0, 1, 2, 3, 4}));
  opt.top_k = 2;
  EXPECT_EQ(drawn(logits, opt), (std::set<int64_t>{1, 3}));
  opt.top_k = 0;
  opt.top_p = 0.7;  // 0.5 + 0.25 reaches 0.7: the third-ranked token is dropped
  EXPECT_EQ(drawn(logits, opt), (std::set<int64_t>{1, 3}));
  opt.top_p = 0.3;  // the top token alone
  EXPECT_EQ(drawn(logits, opt), (std::set<int64_t>{1}));
}

}  // namespace
}  // namespace anvil::generation
