#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "generation/sampling.h"
#include "models/gpt2/gpt2.h"
#include "test_util.h"

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

at::Tensor rows_of(const nlohmann::json& rows) {
  std::vector<at::Tensor> out;
  for (const auto& r : rows) {
    std::vector<float> v;
    for (const auto& x : r) v.push_back(x.is_null() ? -INFINITY : x.get<float>());
    out.push_back(at::tensor(v, at::kFloat));
  }
  return at::stack(out);
}

at::Tensor ids_of(const nlohmann::json& rows) {
  std::vector<at::Tensor> out;
  for (const auto& r : rows) out.push_back(at::tensor(r.get<std::vector<int64_t>>(), at::kLong));
  return at::stack(out);
}

TEST(Sampling, PenaltiesAndWarpersEqualTransformers) {
  const auto ref = anvil::testing::python_reference("logits_warpers.py");
  const auto logits = rows_of(ref["logits"]);
  const auto B = logits.size(0), V = logits.size(1);
  const auto ids = ids_of(ref["ids"]), produced = ids_of(ref["produced"]);
  const auto seen = at::zeros({B, V}, at::kFloat).scatter_add_(1, ids, at::ones_like(ids, at::kFloat)) > 0;
  const auto counts = at::zeros({B, V}, at::kFloat).scatter_add_(1, produced, at::ones_like(produced, at::kFloat));
  ASSERT_GE(ref["cases"].size(), 9u);
  for (const auto& c : ref["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    WarpOptions o;
    o.temperature = c.value("temperature", 1.0);
    o.top_k = c.value("top_k", int64_t{0});
    o.top_p = c.value("top_p", 1.0);
    o.min_p = c.value("min_p", 0.0);
    o.repetition_penalty = c.value("repetition_penalty", 1.0);
    o.presence_penalty = c.value("presence_penalty", 0.0);
    o.frequency_penalty = c.value("frequency_penalty", 0.0);
    const auto got = warp(apply_penalties(logits, seen, counts, o), o);
    const auto want = rows_of(c["expected"]);
    ASSERT_TRUE(at::equal(at::isinf(got), at::isinf(want))) << "removed tokens differ";
    const auto kept = ~at::isinf(want);
    EXPECT_LT((got.masked_select(kept) - want.masked_select(kept)).abs().max().item<double>(), 1e-5);
  }
}

TEST(Sampling, DrawsFollowTheDistributionOnAnyRowAndStep) {
  // Probabilities of 8 tokens, one of them removed (-inf): 20,000 rows of distinct keys at one step,
  // and one row over 20,000 steps, each against the expected counts (chi-square, 6 degrees of freedom).
  const std::vector<double> p = {0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.07, 0.0};
  auto scores = at::log(at::tensor(p, at::kDouble)).to(at::kFloat);
  const int64_t N = 20000;
  auto chi2 = [&](const at::Tensor& drawn) {
    const auto n = at::bincount(drawn, {}, 8).to(at::kDouble);
    EXPECT_EQ(n[7].item<double>(), 0) << "a removed token was drawn";
    double x = 0;
    for (int v = 0; v < 7; ++v) {
      const double e = p[static_cast<size_t>(v)] * N;
      x += (n[v].item<double>() - e) * (n[v].item<double>() - e) / e;
    }
    return x;
  };
  // 22.46 is the 0.999 quantile of chi-square with 6 degrees of freedom.
  auto keys = at::arange(N, at::kLong).mul(7919).add(12345);
  const auto across_rows = draw(scores.expand({N, 8}).contiguous(), keys, at::zeros({}, at::kLong));
  EXPECT_LT(chi2(across_rows), 22.46);
  std::vector<int64_t> one_row;
  const auto key = at::tensor(std::vector<int64_t>{static_cast<int64_t>(row_key(42))});
  for (int64_t t = 0; t < N; ++t)
    one_row.push_back(draw(scores.unsqueeze(0), key, at::scalar_tensor(t, at::kLong))[0].item<int64_t>());
  EXPECT_LT(chi2(at::tensor(one_row)), 22.46);
  // Uniforms: a pure function of (key, step, index), strictly inside (0, 1).
  const auto u = counter_uniform(keys.narrow(0, 0, 64), at::scalar_tensor(3, at::kLong), 1000);
  EXPECT_TRUE(at::equal(u, counter_uniform(keys.narrow(0, 0, 64), at::scalar_tensor(3, at::kLong), 1000)));
  EXPECT_GT(u.min().item<double>(), 0);
  EXPECT_LT(u.max().item<double>(), 1);
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.005);
  EXPECT_FALSE(at::equal(u, counter_uniform(keys.narrow(0, 0, 64), at::scalar_tensor(4, at::kLong), 1000)));
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
  ban.logits_processors.push_back([&](const at::Tensor& scores, const std::vector<int64_t>& index,
                                      const std::vector<std::vector<int64_t>>& so_far) {
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

TEST(Generation, SampledRowsDependOnTheirSeedAloneWhateverTheBatch) {
  auto model = tiny_model();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4, 5}, {7, 8}, {9}, {3, 3, 3, 1}};
  SamplingOptions opt;
  opt.max_new_tokens = 12;
  opt.greedy = false;
  opt.temperature = 1.0;
  opt.top_p = 0.95;
  opt.min_p = 0.02;
  opt.seed = 5;
  const auto all = generate(*model, prompts, opt);
  auto one = opt;
  one.batch_size = 1;
  EXPECT_EQ(generate(*model, prompts, one), all) << "one prompt at a time";
  // Explicit row seeds follow their prompt into any batch, in any order.
  opt.row_seeds = {11, 22, 33, 44};
  const auto seeded = generate(*model, prompts, opt);
  EXPECT_NE(seeded, all);
  const std::vector<std::vector<int64_t>> reversed(prompts.rbegin(), prompts.rend());
  auto rev = opt;
  rev.row_seeds = {44, 33, 22, 11};
  rev.batch_size = 3;
  auto back = generate(*model, reversed, rev);
  std::reverse(back.begin(), back.end());
  EXPECT_EQ(back, seeded);
  // An end-of-sequence token ends each row where it first appears, and is kept.
  auto eos = opt;
  eos.eos_id = seeded[0][3];
  const auto stopped = generate(*model, prompts, eos)[0];
  const auto first = std::find(seeded[0].begin(), seeded[0].end(), eos.eos_id);
  EXPECT_EQ(stopped, std::vector<int64_t>(seeded[0].begin(), first + 1));
}

TEST(Generation, RepeatedPromptsShareOnePrefillAndDecodeAsAlone) {
  // A GRPO-shaped batch: prompts repeated in groups, each row its own seed. The rows decode as they
  // do without sharing, greedy and sampled, padded or not.
  auto model = tiny_model();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {1, 2, 3}, {4, 5, 6, 7, 8}, {1, 2, 3}, {4, 5, 6, 7, 8}};
  for (const bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "sampled");
    SamplingOptions opt;
    opt.max_new_tokens = 10;
    opt.greedy = greedy;
    opt.row_seeds = {1, 2, 3, 4, 5};
    const auto g = generate_with_logprobs(*model, prompts, opt);
    auto alone = opt;
    alone.share_prefixes = false;
    const auto ref = generate_with_logprobs(*model, prompts, alone);
    EXPECT_EQ(g.tokens, ref.tokens);
    for (size_t i = 0; i < prompts.size(); ++i)
      for (size_t t = 0; t < ref.logprobs[i].size(); ++t) EXPECT_NEAR(g.logprobs[i][t], ref.logprobs[i][t], 1e-5);
    if (greedy)
      EXPECT_EQ(g.tokens[0], g.tokens[1]);
    else
      EXPECT_NE(g.tokens[0], g.tokens[1]) << "rows of one prompt draw from their own seeds";
  }
}

// Near the model's last position (32 here) each reply gets every position
// its own prompt leaves: a longer prompt in the call no longer cuts a shorter
// one's reply (a batch decodes as many steps as its longest prompt leaves
// room for, so such prompts are batched by length), and the tokens are those
// the prompt gets alone. Prompts with room for max_new_tokens batch as before.
TEST(Generation, EachReplyGetsThePositionsItsOwnPromptLeaves) {
  auto model = tiny_model();
  const std::vector<int64_t> longer(26, 4), shorter(20, 5), roomy = {7, 8}, same(26, 6), near(24, 3);
  const std::vector<std::vector<int64_t>> prompts = {longer, roomy, shorter, same, near};
  SamplingOptions opt;
  opt.max_new_tokens = 10;  // eos_id -1: every reply runs to its limit
  for (const int64_t batch : {0, 2}) {
    SCOPED_TRACE(batch);
    opt.batch_size = batch;
    const auto g = generate_with_logprobs(*model, prompts, opt);
    ASSERT_EQ(g.tokens.size(), 5u);
    EXPECT_EQ(g.tokens[0].size(), 6u);   // 32 - 26
    EXPECT_EQ(g.tokens[1].size(), 10u);  // max_new_tokens
    EXPECT_EQ(g.tokens[2].size(), 10u);  // min(10, 32 - 20): not 6, as beside the 26-token prompt
    EXPECT_EQ(g.tokens[3].size(), 6u);
    EXPECT_EQ(g.tokens[4].size(), 8u);  // 32 - 24
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(g.tokens[i], generate(*model, {prompts[i]}, opt)[0]) << i;
      ASSERT_EQ(g.logprobs[i].size(), g.tokens[i].size()) << i;
    }
  }
}

TEST(Generation, PenaltiesSteerAwayFromRepeats) {
  auto model = tiny_model();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4, 5}, {7, 8}};
  SamplingOptions opt;
  opt.max_new_tokens = 20;
  auto distinct = [](const std::vector<int64_t>& t) { return std::set<int64_t>(t.begin(), t.end()).size(); };
  const auto plain = generate(*model, prompts, opt);
  auto pen = opt;
  pen.presence_penalty = 100;  // any token already produced scores far below the rest
  const auto fresh = generate(*model, prompts, pen);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(distinct(fresh[i]), fresh[i].size()) << "a token repeated under a presence penalty";
    EXPECT_LT(distinct(plain[i]), plain[i].size())
        << "the tiny model repeats without one (else the test shows nothing)";
  }
}

}  // namespace
}  // namespace anvil::generation
