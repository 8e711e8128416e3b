#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "anvil/models/gpt2.h"

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

std::shared_ptr<models::gpt2::GPT2LMHeadModel> tiny_model() {
  at::manual_seed(3);
  models::gpt2::GPT2Options o;
  o.vocab_size(50).n_positions(32).n_embd(32).n_layer(2).n_head(4);
  return std::make_shared<models::gpt2::GPT2LMHeadModel>(o);
}

/// log p(tokens[i] | prompt + tokens[:i]) from one forward pass over the whole sequence.
std::vector<double> forward_logprobs(models::CausalLM& model, const std::vector<int64_t>& prompt,
                                     const std::vector<int64_t>& tokens, double temperature = 1.0) {
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  at::NoGradGuard no_grad;
  model.eval();
  const auto logits = model.forward(at::tensor(all, at::kLong).unsqueeze(0))[0].to(at::kDouble) / temperature;
  const auto lp = logits.log_softmax(-1);
  std::vector<double> out;
  for (size_t i = 0; i < tokens.size(); ++i)
    out.push_back(lp[static_cast<int64_t>(prompt.size() + i - 1)][tokens[i]].item<double>());
  return out;
}

TEST(Generation, LogprobsEqualAForwardPassAndProcessorsReshapeScores) {
  auto model = tiny_model();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4, 5}, {7, 8}};
  SamplingOptions opt;
  opt.max_new_tokens = 6;
  const auto g = generate_with_logprobs(*model, prompts, opt);
  ASSERT_EQ(g.tokens, generate(*model, prompts, opt));  // the same tokens as without logprobs
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(g.logprobs[i].size(), g.tokens[i].size());
    const auto ref = forward_logprobs(*model, prompts[i], g.tokens[i]);
    for (size_t t = 0; t < ref.size(); ++t) EXPECT_NEAR(g.logprobs[i][t], ref[t], 1e-4) << i << " " << t;
  }

  // Sampling at a temperature: the log-probability under the scaled distribution.
  SamplingOptions hot = opt;
  hot.greedy = false;
  hot.temperature = 0.7;
  hot.seed = 11;
  const auto s = generate_with_logprobs(*model, prompts, hot);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto ref = forward_logprobs(*model, prompts[i], s.tokens[i], 0.7);
    for (size_t t = 0; t < ref.size(); ++t) EXPECT_NEAR(s.logprobs[i][t], ref[t], 1e-4) << i << " " << t;
  }

  // A processor that bans the greedy first token of prompt 0 everywhere; it
  // sees each row's prompt index and what the row produced so far.
  const int64_t banned = g.tokens[0][0];
  std::vector<std::pair<int64_t, size_t>> seen;
  SamplingOptions ban = opt;
  ban.logits_processors.push_back(
      [&](const at::Tensor& scores, const std::vector<int64_t>& index, const std::vector<std::vector<int64_t>>& so_far) {
        for (size_t r = 0; r < index.size(); ++r) seen.emplace_back(index[r], so_far[r].size());
        auto out = scores.clone();
        out.select(1, banned).fill_(-INFINITY);
        return out;
      });
  const auto b = generate_with_logprobs(*model, prompts, ban);
  for (const auto& toks : b.tokens)
    for (auto t : toks) EXPECT_NE(t, banned);
  EXPECT_EQ(seen.front(), (std::pair<int64_t, size_t>{0, 0}));
  EXPECT_EQ(seen[1], (std::pair<int64_t, size_t>{1, 0}));
  EXPECT_EQ(seen[2], (std::pair<int64_t, size_t>{0, 1}));
  for (const auto& lps : b.logprobs)
    for (auto lp : lps) EXPECT_TRUE(std::isfinite(lp));
}

}  // namespace
}  // namespace anvil::generation
