// PPO, GRPO and RLOO: formulas against an independent Python reference
// (tests/parity/ppo_reference.py), rollout masks, the reward program, and
// learning from the quickstart SFT checkpoint (the ctest fixture).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "models/llama/llama.h"
#include "anvil/models/registry.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/ppo.h"
#include "test_util.h"
#include "train/objectives/ppo/ppo_rollout.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

const nlohmann::json& reference() {
  static const nlohmann::json cases = anvil::testing::python_reference("ppo_reference.py");
  return cases;
}

at::Tensor doubles(const nlohmann::json& j) { return at::tensor(j.get<std::vector<double>>(), at::kDouble); }

at::Tensor matrix(const nlohmann::json& c, const char* key) {
  return doubles(c[key]).view({c["shape"][0].get<int64_t>(), c["shape"][1].get<int64_t>()});
}

void expect_close(const at::Tensor& ours, const nlohmann::json& ref, const std::string& what) {
  const auto r = doubles(ref);
  ASSERT_EQ(ours.numel(), r.numel()) << what;
  EXPECT_LE((ours.reshape(-1).to(at::kDouble) - r).abs().max().item<double>(), 1e-6) << what;
}

TEST(PpoFormulas, KlRewardsGaeWhiteningAndClippedLossesMatchTheReference) {
  const auto& cases = reference()["ppo"];
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["estimator"].get<std::string>());
    const auto mask = matrix(c, "mask"), logp_old = matrix(c, "logp_old"), ref = matrix(c, "ref");
    const auto values_old = matrix(c, "values_old");
    const auto kl = kl_estimate(logp_old, ref, *kKlEstimators.find(c["estimator"].get<std::string>())) * mask;
    expect_close(kl, c["kl"], "kl");
    const auto rewards = token_rewards(kl, doubles(c["scores"]), mask, c["kl_coef"]);
    expect_close(rewards, c["rewards"], "rewards");
    const auto [adv, ret] = gae(rewards, values_old, mask, c["gamma"], c["lam"]);
    expect_close(adv, c["advantages"], "advantages");
    expect_close(ret, c["returns"], "returns");
    const auto white = masked_whiten(adv, mask);
    expect_close(white, c["whitened"], "whitened");
    // The same whitening from moments summed elsewhere (several ranks).
    const std::vector<double> moments{mask.sum().item<double>(), (adv * mask).sum().item<double>(),
                                      (adv * adv * mask).sum().item<double>()};
    expect_close(masked_whiten(adv, mask, moments), c["whitened"], "whitened from moments");
    EXPECT_NEAR(kl.sum(1).mean().item<double>(), c["objective_kl"].get<double>(), 1e-9);
    EXPECT_NEAR((-c["kl_coef"].get<double>() * kl).sum(1).mean().item<double>(), c["non_score_reward"].get<double>(),
                1e-9);

    // Losses as masked means: sums over two micro-batches / tokens.
    const auto logp_new = matrix(c, "logp_new"), values_new = matrix(c, "values_new");
    const PpoClip clip{c["cliprange"], c["cliprange_value"]};
    double pg = 0, vf = 0, cf = 0, vcf = 0, akl = 0, ratio = 0;
    const auto B = mask.size(0);
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 2}, {2, B}}) {
      auto s = [&](const at::Tensor& t) { return t.slice(0, a, b); };
      const auto t =
          ppo_loss_sums(s(logp_new), s(logp_old), s(white), s(values_new), s(values_old), s(ret), s(mask), clip);
      pg += t.policy.item<double>(), vf += t.value.item<double>(), cf += t.clipfrac.item<double>();
      vcf += t.vf_clipfrac.item<double>(), akl += t.approxkl.item<double>(), ratio += t.ratio.item<double>();
    }
    const double n = mask.sum().item<double>();
    EXPECT_NEAR(pg / n, c["pg_loss"].get<double>(), 1e-6);
    EXPECT_NEAR(vf / n, c["vf_loss"].get<double>(), 1e-6);
    EXPECT_NEAR(cf / n, c["clipfrac"].get<double>(), 1e-9);
    EXPECT_NEAR(vcf / n, c["vf_clipfrac"].get<double>(), 1e-9);
    EXPECT_NEAR(akl / n, c["approxkl"].get<double>(), 1e-9);
    EXPECT_NEAR(ratio / n, c["ratio"].get<double>(), 1e-9);
  }
  // The reference exercises both clips.
  EXPECT_GT(cases[0]["clipfrac"].get<double>(), 0.0);
  EXPECT_GT(cases[2]["vf_clipfrac"].get<double>(), 0.0);
}

TEST(PpoFormulas, GroupAdvantagesAdaptiveKlAndRewardScalingMatchTheReference) {
  for (const auto& c : reference()["groups"]) {
    const auto scores = doubles(c["scores"]);
    const auto group = c["group"].get<int64_t>();
    expect_close(grpo_advantages(scores, group), c["grpo"], "grpo");
    expect_close(rloo_advantages(scores, group), c["rloo"], "rloo");
  }
  for (const auto& c : reference()["adaptive_kl"])
    EXPECT_NEAR(adaptive_kl_update(c["value"], c["current"], c["target"], c["horizon"], c["n_steps"]),
                c["new_value"].get<double>(), 1e-12);
  const auto& s = reference()["scaling"];
  RunningMoments m;
  for (size_t b = 0; b < s["batches"].size(); ++b) {
    const auto xs = s["batches"][b].get<std::vector<double>>();
    m.update(xs);
    const auto scaled = (at::tensor(xs, at::kDouble) / m.std).clamp(-s["clip"].get<double>(), s["clip"].get<double>());
    expect_close(scaled, s["scaled"][b], "scaled scores");
  }
  EXPECT_NEAR(m.mean, s["mean"].get<double>(), 1e-12);
  EXPECT_NEAR(m.var, s["var"].get<double>(), 1e-12);
  const auto back = RunningMoments::from_json(m.to_json());
  EXPECT_EQ(back.count, m.count);
  EXPECT_EQ(back.std, m.std);
}

// GRPO's variants (DAPO, Dr. GRPO, GSPO; TRL's loss types): the rollout
// collated into two micro-batches with the run's loss weighting, the clipped
// loss and GRPO's KL term summed over them and divided by the step's targets,
// against the reference's loss and clip statistics.
TEST(PpoFormulas, GrpoVariantsMatchTheReference) {
  const auto& cases = reference()["grpo_family"];
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    const auto loss_type = c["loss_type"].get<std::string>();
    SCOPED_TRACE(loss_type + " " + c["level"].get<std::string>());
    const auto mask = matrix(c, "mask"), logp_old = matrix(c, "logp_old"), logp_new = matrix(c, "logp_new");
    const auto ref = matrix(c, "ref");
    const auto ended = doubles(c["ended"]);
    const auto adv = grpo_advantages(doubles(c["scores"]), c["group"].get<int64_t>(),
                                     *kScaleRewards.find(c["scale_rewards"].get<std::string>()));
    expect_close(adv, c["advantages"], "advantages");
    const int64_t B = mask.size(0), R = mask.size(1);
    std::vector<RolloutRow> rows(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      auto& r = rows[static_cast<size_t>(i)];
      r.prompt = {1, 2};
      for (int64_t j = 0; j < R; ++j)
        if (mask[i][j].item<double>() > 0) r.response.push_back(3 + j);
      r.ended = ended[i].item<double>() > 0;
    }
    LossWeighting w;
    w.aggregation = loss_type == "grpo"   ? LossAggregation::kSequenceMean
                    : loss_type == "dapo" ? LossAggregation::kTokenMean
                                          : LossAggregation::kConstant;
    w.constant = c["max_len"].get<double>();
    w.mask_truncated = c["mask_truncated"].get<bool>();
    const PpoClip clip{c["eps_low"], 0.2, c["eps_high"], c["level"] == "sequence"};
    const double beta = c["beta"];
    const auto adv_tokens = (adv.unsqueeze(1) * mask).to(at::kFloat);
    double loss = 0, low = 0, high = 0, tokens = 0;
    int64_t targets = 0;
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 3}, {3, B}}) {
      std::vector<const RolloutRow*> chunk;
      std::vector<int64_t> index;
      for (int64_t i = a; i < b; ++i) chunk.push_back(&rows[static_cast<size_t>(i)]), index.push_back(i);
      const auto batch = collate_rollout(chunk, 0, adv_tokens, at::zeros_like(adv_tokens), index, w);
      targets += batch.num_targets;
      const auto m = batch.tensors.at("mask").to(at::kDouble), wt = batch.tensors.at("weights").to(at::kDouble);
      const auto s = [&](const at::Tensor& t) { return t.slice(0, a, b).narrow(1, 0, m.size(1)); };
      const auto terms = ppo_loss_sums(s(logp_new), s(logp_old), batch.tensors.at("advantages").to(at::kDouble), {}, {},
                                       {}, m, clip, wt);
      auto sum = terms.policy;
      if (beta > 0) sum = sum + beta * (kl_estimate(s(logp_new), s(ref), KlEstimator::kK3) * wt).sum();
      loss += sum.item<double>();
      low += terms.clip_low.item<double>(), high += terms.clip_high.item<double>(), tokens += m.sum().item<double>();
    }
    EXPECT_NEAR(loss / static_cast<double>(targets), c["loss"].get<double>(), 1e-6);
    EXPECT_NEAR(low / tokens, c["clip_low"].get<double>(), 1e-9);
    EXPECT_NEAR(high / tokens, c["clip_high"].get<double>(), 1e-9);
  }
  // The cases clip on both sides.
  EXPECT_GT(cases[0]["clip_low"].get<double>(), 0.0);
  EXPECT_GT(cases[0]["clip_high"].get<double>(), 0.0);
}

// REINFORCE++ with and without its group baseline, and DAPO's overlong
// punishment, against the reference.
TEST(PpoFormulas, ReinforcePlusPlusAndOverlongPenaltyMatchTheReference) {
  for (const auto& c : reference()["reinforce"]) {
    SCOPED_TRACE(c["baseline"].get<bool>() ? "reinforce_pp_baseline" : "reinforce_pp");
    const auto mask = matrix(c, "mask");
    const auto k = kl_estimate(matrix(c, "logp_old"), matrix(c, "ref"), KlEstimator::kK1) * mask;
    const auto group = c["baseline"].get<bool>() ? c["group"].get<int64_t>() : 0;
    const auto scores = doubles(c["scores"]);
    expect_close(reinforce_pp_advantages(scores, k, mask, c["kl_coef"], group, false), c["returns"], "returns");
    expect_close(reinforce_pp_advantages(scores, k, mask, c["kl_coef"], group, true), c["advantages"], "advantages");
  }
  for (const auto& c : reference()["overlong"])
    EXPECT_NEAR(overlong_penalty(c["tokens"], c["length"], c["buffer"], c["factor"]), c["penalty"].get<double>(), 1e-12)
        << c.dump();
}

// Multi-turn episodes: the KL, rewards, GAE and returns run over each
// response's generated tokens, stepping over the ones an environment
// appended, and GRPO's token_mean / sequence_mean losses average over the
// generated tokens, as the reference writes them in the responses' columns.
TEST(PpoFormulas, EpisodesSkipAppendedTokensAsTheReferenceDoes) {
  const auto& cases = reference()["episodes"];
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    const auto mask = matrix(c, "mask"), appended = matrix(c, "appended"), logp_old = matrix(c, "logp_old");
    const auto ref = matrix(c, "ref"), values_old = matrix(c, "values_old"), logp_new = matrix(c, "logp_new");
    const auto B = mask.size(0), R = mask.size(1);
    std::vector<RolloutRow> rows(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      auto& r = rows[static_cast<size_t>(i)];
      r.prompt = {1};
      for (int64_t t = 0; t < R && mask[i][t].item<double>() > 0; ++t) {
        r.response.push_back(3 + t);
        r.appended.push_back(appended[i][t].item<double>() > 0 ? 1 : 0);
        r.old_logp.push_back(static_cast<float>(logp_old[i][t].item<double>()));
        r.ref_logp.push_back(static_cast<float>(ref[i][t].item<double>()));
        r.values.push_back(static_cast<float>(values_old[i][t].item<double>()));
      }
      r.ended = true;
    }
    const auto g = generated_tokens(rows);
    ASSERT_EQ(g.response_width, R);
    const auto kl = kl_estimate(g.logp, g.ref, KlEstimator::kK1) * g.mask;
    const auto [adv, ret] =
        gae(token_rewards(kl, doubles(c["scores"]), g.mask, c["kl_coef"]), g.values, g.mask, c["gamma"], c["lam"]);
    expect_close(at_response_places(adv, g), c["advantages"], "advantages");
    expect_close(at_response_places(ret, g), c["returns"], "returns");

    // GRPO's clipped loss through the rollout's collation: appended tokens weigh nothing.
    const auto seq_adv = matrix(c, "seq_advantages");
    for (const char* agg : {"token_mean", "sequence_mean"}) {
      SCOPED_TRACE(agg);
      std::vector<const RolloutRow*> ptrs;
      std::vector<int64_t> index;
      for (int64_t i = 0; i < B; ++i) ptrs.push_back(&rows[static_cast<size_t>(i)]), index.push_back(i);
      LossWeighting w;
      w.aggregation = *kLossAggregations.find(agg);
      const auto b = collate_rollout(ptrs, 0, seq_adv.to(at::kFloat), at::zeros({B, R}), index, w);
      const auto t =
          ppo_loss_sums(logp_new.to(at::kFloat), b.tensors.at("old_logp"), b.tensors.at("advantages"), {}, {}, {},
                        b.tensors.at("mask"), {c["eps"].get<double>(), 0.2}, b.tensors.at("weights"));
      EXPECT_NEAR(t.policy.item<double>() / static_cast<double>(b.num_targets),
                  c[std::string(agg) + "_loss"].get<double>(), 1e-6);
    }
  }
}

// Only generated tokens are trained: each response token is scored from the
// logits of the position before it, the prompt and the padding are masked
// out, and a response ends at its EOS (nothing after it is generated).
// ppo.async's correction, from its definition (verl's truncated importance sampling, TRL's vLLM importance
// sampling correction; the ratio against the proximal log-probs as AReaL's decoupled PPO): per token
// w = min(pi_prox / pi_behaviour, C), no gradient, on the policy loss only.
TEST(PpoFormulas, TruncatedImportanceWeightsWeighThePolicyLossAlone) {
  at::manual_seed(3);
  const auto prox = at::randn({3, 5}, at::kDouble) * 0.5 - 2, behav = at::randn({3, 5}, at::kDouble) * 0.5 - 2;
  auto mask = at::ones({3, 5}, at::kDouble);
  mask[2][4] = 0, mask[1][0] = 0;
  const double cap = 1.5;
  const auto w = truncated_is_weights(prox, behav, mask, cap);
  int capped = 0;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      const double ratio = std::exp(prox[i][j].item<double>() - behav[i][j].item<double>());
      capped += ratio > cap;
      EXPECT_NEAR(w[i][j].item<double>(), mask[i][j].item<double>() * std::min(ratio, cap), 1e-12);
    }
  EXPECT_GT(capped, 0) << "the draw has ratios above the cap";
  EXPECT_LT(capped, 13) << "and below it";
  // The policy term is weighed token by token; the value term is not.
  const auto logp = (prox + 0.1 * at::randn({3, 5}, at::kDouble)).requires_grad_(true);
  const auto adv = at::randn({3, 5}, at::kDouble), values = at::randn({3, 5}, at::kDouble),
             old_values = at::randn({3, 5}, at::kDouble), returns = at::randn({3, 5}, at::kDouble);
  const PpoClip clip{0.2, 0.2, 0, false};
  const auto plain = ppo_loss_sums(logp, prox, adv, values, old_values, returns, mask, clip);
  const auto weighed = ppo_loss_sums(logp, prox, adv, values, old_values, returns, mask, clip, {}, w);
  const auto ratio = at::exp(logp.detach() - prox);
  const auto per_token =
      at::maximum(-adv * ratio, -adv * at::clamp(ratio, 0.8, 1.2));  // the clipped surrogate, unweighed
  EXPECT_NEAR(weighed.policy.item<double>(), (per_token * w * mask).sum().item<double>(), 1e-10);
  EXPECT_NEAR(plain.policy.item<double>(), (per_token * mask).sum().item<double>(), 1e-10);
  EXPECT_EQ(weighed.value.item<double>(), plain.value.item<double>());
  EXPECT_EQ(weighed.clipfrac.item<double>(), plain.clipfrac.item<double>());
  // No gradient flows into the weights.
  EXPECT_FALSE(w.requires_grad());
}

TEST(PpoRollout, MasksCoverExactlyTheGeneratedTokens) {
  RolloutRow a, b;
  a.prompt = {5, 6, 7};
  a.response = {8, 9, 2};  // ended at EOS (2)
  a.ended = true;
  b.prompt = {5};
  b.response = {10, 11, 12, 13, 14};  // cut by max_new_tokens
  for (auto* r : {&a, &b}) r->old_logp.assign(r->response.size(), -1.0f);
  const auto batch = collate_rollout({&a, &b}, /*pad_id=*/0);
  EXPECT_EQ(batch.num_targets, 8);
  const auto mask = batch.tensors.at("mask"), pos = batch.tensors.at("positions"), tok = batch.tensors.at("tokens");
  ASSERT_EQ(mask.sizes(), (at::IntArrayRef{2, 5}));
  EXPECT_TRUE(mask[0].equal(at::tensor({1.f, 1.f, 1.f, 0.f, 0.f})));
  EXPECT_TRUE(mask[1].equal(at::ones({5})));
  EXPECT_EQ(pos[0][0].item<int64_t>(), 2);  // token 8 is predicted from position 2 (the prompt's last)
  EXPECT_EQ(pos[1][0].item<int64_t>(), 0);
  EXPECT_EQ(tok[0][2].item<int64_t>(), 2);
  const auto ids = batch.tensors.at("input_ids");
  EXPECT_TRUE(ids[0].equal(at::tensor({5L, 6L, 7L, 8L, 9L, 2L})));
  EXPECT_TRUE(ids[1].equal(at::tensor({5L, 10L, 11L, 12L, 13L, 14L})));

  // The gathered log-probs are those of a plain forward at those positions,
  // and only masked tokens receive a gradient through the policy loss.
  config::ModelConfig mc;
  mc.family = "gpt2", mc.vocab_size = 16, mc.hidden_size = 16, mc.num_hidden_layers = 1, mc.num_attention_heads = 2;
  mc.max_position_embeddings = 16;
  torch::manual_seed(3);
  auto model = models::family_by_name("gpt2").from_config(mc);
  model->eval();
  const auto hidden = model->hidden_states(ids, {});
  const auto sel = hidden.gather(1, pos.unsqueeze(-1).expand({2, 5, hidden.size(-1)}));
  const auto logp = model->logits(sel).log_softmax(-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1);
  const auto full = model->forward(ids).log_softmax(-1).detach();
  EXPECT_NEAR(logp[0][0].item<double>(), full[0][2][8].item<double>(), 1e-5);
  EXPECT_NEAR(logp[1][4].item<double>(), full[1][4][14].item<double>(), 1e-5);
  auto adv = at::ones({2, 5}, at::kFloat);
  const auto terms = ppo_loss_sums(logp, batch.tensors.at("old_logp"), adv, {}, {}, {}, mask, {});
  const auto grad = torch::autograd::grad({terms.policy}, {logp})[0];
  EXPECT_TRUE((grad * (1 - mask)).abs().sum().item<double>() == 0);
  EXPECT_TRUE((grad.abs() > 0).eq(mask > 0).all().item<bool>());
}

// ---- configs ------------------------------------------------------------------

/// The trainer on configs/ppo_tiny.yaml with a fresh tiny model (no checkpoint needed).
int tiny_ppo(const TempDir& dir, const std::string& extra, std::string* log) {
  const auto cmd =
      "cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
      " --config configs/ppo_tiny.yaml output_dir=" + (dir / "out").string() +
      " model.from= model.family=gpt2 model.hidden_size=32 model.num_hidden_layers=1 model.num_attention_heads=2"
      " model.max_position_embeddings=32 tokenizer.path=data/tokenizer.model train.threads=1 " +
      extra + " 2>&1";
  return run(cmd, log);
}

// --dry-run plans PPO in rollouts (not in epochs of steps x samples): the run
// then makes as many rollouts, drawing the prompts it said.
TEST(PpoConfig, DryRunPlansTheRolloutsTheRunMakes) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(tiny_ppo(dir, "--dry-run train.max_steps=6", &log), 0) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex(R"(ppo: (\d+) rollouts of 64 prompts x 1 sample = 64 responses of up to 8 new tokens; each rollout )"
                 R"(trains 4 steps \(2 epochs x 2 minibatches of 32 responses\); the rollouts draw (\d+) prompts = )"
                 R"(([0-9.e+-]+) epochs of (\d+) prompts)")))
      << log;
  EXPECT_EQ(m[1].str(), "2");
  EXPECT_EQ(m[2].str(), "128");
  EXPECT_NEAR(std::stod(m[3].str()), 128.0 / std::stod(m[4].str()), 2e-3);
  EXPECT_NE(log.find("tokens per step: up to 256 response tokens"), std::string::npos) << log;
  EXPECT_EQ(log.find("0 response tokens"), std::string::npos) << log;

  ASSERT_EQ(tiny_ppo(dir, "train.max_steps=6 data.eval=null", &log), 0) << log;
  int rollouts = 0, steps = 0;
  std::ifstream in(dir / "out" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++steps;
    rollouts += j.contains("time/rollout_s");
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(rollouts, 2);
}

// The eval table's third column holds each reply's reward, and says so: on
// the console, in eval-step-N.json and TensorBoard's eval/samples (it once
// read "reference", SFT's column of the record's response).
TEST(PpoConfig, TheEvalTableNamesItsRewardColumn) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(tiny_ppo(dir, "--eval-only eval.generate_samples=4 logging.level=info", &log), 0) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(\n\s*prompt +generated +reward\n)"))) << log;
  EXPECT_EQ(log.find("reference\n"), std::string::npos) << log;
  const auto j = nlohmann::json::parse(anvil::testing::read_text(dir / "out" / "eval-step-0.json"));
  ASSERT_EQ(j["samples"].size(), 4u) << j.dump();
  for (const auto& row : j["samples"]) {
    ASSERT_TRUE(row.contains("reward")) << row.dump();
    EXPECT_FALSE(row.contains("reference")) << row.dump();
    // exact_match: 0 or 1, as the reward of eval/reward's mean.
    EXPECT_TRUE(row["reward"] == "0" || row["reward"] == "1") << row.dump();
  }
}

// A causal LM folder given as the reward model: the error names the config
// key that named it, not a command-line flag.
TEST(PpoConfig, ACausalLmAsTheRewardModelIsNamedByItsKey) {
  TempDir dir;
  models::llama::LlamaOptions o;
  o.vocab_size(326)
      .hidden_size(16)
      .intermediate_size(32)
      .num_hidden_layers(1)
      .num_attention_heads(2)
      .num_key_value_heads(2)
      .max_position_embeddings(32);
  models::llama::LlamaForCausalLM lm(o);
  const auto tok = tokenizer::load_tokenizer("auto", anvil::testing::source_dir() + "/data/tokenizer.model");
  stdfs::create_directories(dir / "lm");
  checkpoint::save_model_dir(dir / "lm", lm, tok.get());
  std::string log;
  EXPECT_NE(tiny_ppo(dir, "ppo.reward.exact_match= ppo.reward.model=" + (dir / "lm").string(), &log), 0);
  EXPECT_NE(log.find("ppo.reward.model: " + (dir / "lm").string() + " is not a reward model"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("--model"), std::string::npos) << log;
}

TEST(PpoConfig, BadSettingsAndRecordsNameTheKeyOrTheLine) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(tiny_ppo(dir, "--dry-run", &log), 0) << log;
  EXPECT_NE(log.find("algorithm: ppo"), std::string::npos) << log;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ppo.reward.regex=response",
       "ppo.reward: expected exactly one of model, command, exact_match, regex or function, got 2"},
      {"ppo.reward.exact_match=",
       "ppo.reward: expected exactly one of model, command, exact_match, regex or function, got 0"},
      {"ppo.advantage=grpo",
       "ppo.samples_per_prompt: advantage grpo compares the samples of a prompt, so it needs at least 2"},
      {"ppo.prompts_per_rollout=40",
       "ppo.prompts_per_rollout: a rollout of 40 x 1 = 40 sequences does not split into minibatches of 32"},
      {"ppo.reward.exact_match= ppo.reward.function=nope",
       "ppo.reward.function: no reward function \"nope\" is registered"},
      {"ppo.kl_estimator=k2", "ppo.kl_estimator"},
      {"ppo.reward.model=/nonexistent", "ppo.reward.model"},
      {"ppo.critic_from=/nonexistent", "ppo.critic_from"},
      {"ppo.advantage=rloo ppo.samples_per_prompt=2 ppo.critic_from=configs",
       "ppo.critic_from: advantage rloo has no critic; a separate critic serves gae"},
      {"ppo.reward.exact_match=answer train.max_steps=4 train.save_every=0",
       "ppo.reward.exact_match compares the response with field \"answer\", which this record lacks"},
  };
  for (const auto& [overrides, expected] : cases) {
    const bool at_scoring = overrides.find("answer") != std::string::npos;  // found by the first rollout
    EXPECT_NE(tiny_ppo(dir, (at_scoring ? "" : "--dry-run ") + overrides, &log), 0) << overrides;
    EXPECT_NE(log.find(expected), std::string::npos) << overrides << "\n" << log;
  }
  EXPECT_TRUE(std::regex_search(log, std::regex("data/sft_add_train.jsonl:[0-9]+: ppo.reward"))) << log;
}

// ---- learning and runs, from the quickstart SFT checkpoint (the ctest fixture) ----

using anvil::testing::fixture_checkpoint;

/// A quickstart model weak on one task: the fixture's checkpoint-1000,
/// fine-tuned for 100 steps on `upper` examples whose answers are in lower
/// case 60% of the time. Greedy, it answers most held-out `upper` prompts in
/// lower case; sampled, it is right about 40% of the time.
struct WeakUpper {
  stdfs::path model, prompts, eval;
};

/// Makes the weak model, its prompts and held-out prompts in `dir`.
WeakUpper make_weak_upper(const stdfs::path& dir) {
  WeakUpper out{dir / "sft" / "checkpoint-100", dir / "upper_prompts.jsonl", dir / "upper_eval.jsonl"};
  const auto src = anvil::testing::source_dir();
  std::ofstream noisy(dir / "noisy.jsonl"), prompts(out.prompts), eval(out.eval);
  std::ifstream train(src + "/data/sft_train.jsonl"), held(src + "/data/sft_eval.jsonl");
  uint64_t x = 12345;
  for (std::string line; std::getline(train, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["prompt"].get<std::string>().rfind("upper:", 0) != 0) continue;
    prompts << line << "\n";
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    if ((x >> 33) % 10 >= 4) {
      auto r = j["response"].get<std::string>();
      for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      j["response"] = r;
    }
    noisy << j.dump() << "\n";
  }
  for (std::string line; std::getline(held, line);)
    if (nlohmann::json::parse(line)["prompt"].get<std::string>().rfind("upper:", 0) == 0) eval << line << "\n";
  noisy.close(), prompts.close(), eval.close();
  std::string log;
  EXPECT_EQ(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config configs/quickstart.yaml output_dir=" +
                    (dir / "sft").string() + " model.from=" + fixture_checkpoint().string() + " 'data.train=[{path: " +
                    (dir / "noisy.jsonl").string() + "}]' data.eval[0].path=" + out.eval.string() +
                    " train.max_steps=100 train.save_every=100 train.eval_every=100 schedule.warmup_steps=10"
                    " optimizer.lr=1e-3 eval.generate_samples=1000 train.threads=1" +
                    anvil::testing::seed_override(),
                &log),
            0)
      << log;
  return out;
}

/// The weak model: under ctest, the one the PpoFixtures.WeakUpperModel
/// fixture made once for every PPO entry (tests/CMakeLists.txt names its
/// folder in $ANVIL_WEAK_UPPER); a test run alone makes its own, once per
/// process.
const WeakUpper& weak_upper() {
  static const WeakUpper w = [] {
    if (const char* shared = std::getenv("ANVIL_WEAK_UPPER"); shared && *shared) {
      const stdfs::path dir = shared;
      WeakUpper out{dir / "sft" / "checkpoint-100", dir / "upper_prompts.jsonl", dir / "upper_eval.jsonl"};
      EXPECT_TRUE(stdfs::exists(out.model / "model.safetensors"))
          << "$ANVIL_WEAK_UPPER names " << dir << ", which holds no weak model (did PpoFixtures.WeakUpperModel fail?)";
      return out;
    }
    static TempDir* dir = new TempDir();  // kept for the whole test program
    return make_weak_upper(dir->path());
  }();
  return w;
}

// The ctest fixture: the weak model, made in $ANVIL_WEAK_UPPER for every
// PPO entry of this ctest run (in a temp folder when run alone).
TEST(PpoFixtures, WeakUpperModel) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const char* shared = std::getenv("ANVIL_WEAK_UPPER");
  TempDir temp;
  const stdfs::path dir = shared && *shared ? stdfs::path(shared) : temp.path();
  stdfs::remove_all(dir);
  stdfs::create_directories(dir);
  const auto w = make_weak_upper(dir);
  EXPECT_TRUE(stdfs::exists(w.model / "model.safetensors"));
  // Weak on its task, as the PPO tests need (0.08 here, against the quickstart's ~0.9).
  const double exact = [&] {
    for (const auto& m : anvil::testing::metric_lines(dir / "sft" / "metrics.jsonl"))
      if (m.contains("eval/exact_match")) return m["eval/exact_match"].get<double>();
    return -1.0;
  }();
  EXPECT_GE(exact, 0.0) << "no eval line";
  EXPECT_LT(exact, 0.5);
}

/// Runs `config` on the weak `upper` model, its prompts and held-out prompts, with `extra` overrides.
std::string ppo_run(const stdfs::path& out, const std::string& extra, int ranks = 0,
                    const std::string& config = "configs/ppo_tiny.yaml") {
  const auto& w = weak_upper();
  std::string log;
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::mpirun(ranks) +
                   anvil::testing::trainer_bin() + " --config " + config + " output_dir=" + out.string() +
                   " model.from=" + w.model.string() + " 'data.train=[{path: " + w.prompts.string() +
                   "}]' data.eval[0].path=" + w.eval.string() + " eval.generate_samples=1000 eval.batch_size=100" +
                   " train.threads=1 " + extra + anvil::testing::seed_override() + " 2>&1";
  const int rc = run(cmd, &log);
  EXPECT_EQ(rc, 0) << cmd << "\n" << log;
  return log;
}

double first_eval(const stdfs::path& sft_metrics) {
  for (const auto& m : anvil::testing::metric_lines(sft_metrics))
    if (m.contains("eval/exact_match")) return m["eval/exact_match"].get<double>();
  ADD_FAILURE() << "no eval in " << sft_metrics;
  return 0;
}

TEST(PpoLearning, ExactMatchRewardRaisesHeldOutExactMatchWithBoundedKl) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  ppo_run(dir / "ppo", "train.max_steps=200 train.eval_every=200 train.save_every=200");
  const double before = first_eval(weak_upper().model.parent_path() / "metrics.jsonl");
  const auto lines = anvil::testing::metric_lines(dir / "ppo" / "metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  const auto last = lines.back();
  const double after = last["eval/exact_match"].get<double>();
  std::cout << "[ppo upper] held-out exact match: SFT " << before << " -> PPO " << after << "\n";
  anvil::testing::record_figure("held-out exact match gain", after - before, 0.0, 0.15);
  EXPECT_LT(before, 0.5);
  EXPECT_GE(after, before + 0.15) << last.dump();
  double max_kl = 0;
  for (const auto& m : lines)
    if (m.contains("objective/kl")) max_kl = std::max(max_kl, m["objective/kl"].get<double>());
  EXPECT_LT(max_kl, 5.0);  // nats per response: the policy stays near the reference
  // Every iteration logs its time split: generation, scoring, the previous iteration's steps.
  int64_t iterations = 0, with_train = 0;
  for (const auto& m : lines) {
    if (!m.contains("objective/kl")) continue;
    ++iterations;
    EXPECT_GT(m.value("time/rollout_s", 0.0), 0.0) << m.dump();
    EXPECT_GT(m.value("time/reward_s", 0.0), 0.0) << m.dump();
    EXPECT_GT(m.value("rollout/tokens_per_s", 0.0), 0.0) << m.dump();
    with_train += m.contains("time/train_s") ? 1 : 0;
  }
  EXPECT_GT(iterations, 1);
  EXPECT_GE(with_train + 1, iterations) << "time/train_s on every iteration after the first";
  // The checkpoint holds the value head beside the HF files and the objective's state.
  EXPECT_TRUE(stdfs::exists(dir / "ppo" / "checkpoint-200" / "heads.safetensors"));
  const auto state =
      nlohmann::json::parse(anvil::testing::read_text(dir / "ppo" / "checkpoint-200" / "trainer_state.json"));
  EXPECT_TRUE(state["objective"].contains("kl_coef")) << state.dump();
}

TEST(PpoLearning, GrpoAndRlooRaiseTheVerifiableReward) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const double before = first_eval(weak_upper().model.parent_path() / "metrics.jsonl");
  // configs/grpo_tiny.yaml (160 steps); the same with RLOO's baseline; and, for 80 steps, with DAPO's and
  // Dr. GRPO's choices, and REINFORCE++ with its group baseline.
  const std::map<std::string, std::string> variants{
      {"grpo", "ppo.advantage=grpo train.max_steps=160 train.eval_every=160 train.save_every=160"},
      {"rloo", "ppo.advantage=rloo train.max_steps=160 train.eval_every=160 train.save_every=160"},
      {"dapo",
       "ppo.advantage=grpo ppo.cliprange_high=0.28 ppo.mask_truncated_completions=true ppo.kl_coef=0"
       " train.max_steps=80 train.eval_every=80 train.save_every=80"},
      {"dr_grpo",
       "ppo.advantage=grpo ppo.loss_aggregation=constant ppo.scale_rewards=none train.max_steps=80"
       " train.eval_every=80 train.save_every=80"},
      {"reinforce_pp_baseline",
       "ppo.advantage=reinforce_pp_baseline train.max_steps=80 train.eval_every=80"
       " train.save_every=80"}};
  for (const auto& [name, keys] : variants) {
    const char* adv = name.c_str();
    TempDir dir;
    ppo_run(dir / "run", keys, 0, "configs/grpo_tiny.yaml");
    const auto last = anvil::testing::metric_lines(dir / "run" / "metrics.jsonl").back();
    std::cout << "[" << adv << " upper] held-out exact match: SFT " << before << " -> "
              << last["eval/exact_match"].get<double>() << "\n";
    anvil::testing::record_figure(std::string(adv) + " held-out exact match gain",
                                  last["eval/exact_match"].get<double>() - before, 0.0, 0.15);
    EXPECT_GE(last["eval/exact_match"].get<double>(), before + 0.15) << adv << " " << last.dump();
    EXPECT_FALSE(stdfs::exists(dir / "run" / "checkpoint-160" / "heads.safetensors")) << adv << ": no critic";
    EXPECT_FALSE(stdfs::exists(dir / "run" / "checkpoint-80" / "heads.safetensors")) << adv << ": no critic";
  }
}

// configs/grpo_tiny.yaml on the one-step-off schedule with a rollout rank
// (3 ranks: 2 train while 1 samples the next batch; truncated importance
// weights): each update trains the batch sampled before the previous one,
// and the verifiable reward still rises as the synchronous run's does (its
// threshold; docs/reliability.md).
TEST(PpoLearning, OneStepOffGrpoRaisesTheVerifiableReward) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const double before = first_eval(weak_upper().model.parent_path() / "metrics.jsonl");
  TempDir dir;
  ppo_run(dir / "run",
          "ppo.async.rollout_ranks=1 train.micro_batch_size=16 train.max_steps=80 train.eval_every=80 "
          "train.save_every=80 train.log_every=1",
          3, "configs/grpo_tiny.yaml");
  const auto lines = anvil::testing::metric_lines(dir / "run" / "metrics.jsonl");
  int stale = 0;
  for (const auto& m : lines)
    if (m.contains("rollout/staleness")) stale += m["rollout/staleness"].get<double>() == 1.0;
  EXPECT_GE(stale, 5) << "iterations after the first train a batch one update old";
  const double after = lines.back()["eval/exact_match"].get<double>();
  std::cout << "[one-step-off grpo upper] held-out exact match: SFT " << before << " -> " << after << "\n";
  anvil::testing::record_figure("one-step-off grpo held-out exact match gain", after - before, 0.0, 0.15);
  EXPECT_GE(after, before + 0.15) << lines.back().dump();
}

// DAPO with dynamic sampling, scored by two weighted sources (exact match,
// and half a point when the answer appears anywhere): groups the weak model
// answers alike are dropped and refilled, and the held-out exact match (the
// exact source's eval/rewards/exact) rises as GRPO's does.
TEST(PpoLearning, DapoWithDynamicSamplingAndTwoRewardSourcesRaisesTheReward) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const double before = first_eval(weak_upper().model.parent_path() / "metrics.jsonl");
  TempDir dir;
  ppo_run(dir / "run",
          "ppo.advantage=grpo ppo.cliprange_high=0.28 ppo.mask_truncated_completions=true ppo.kl_coef=0"
          " ppo.dynamic_sampling=true ppo.reward.exact_match=null"
          " 'ppo.rewards=[{exact_match: response, name: exact}, {regex: response, weight: 0.5}]'"
          " train.max_steps=80 train.eval_every=80 train.save_every=80",
          0, "configs/grpo_tiny.yaml");
  const auto lines = anvil::testing::metric_lines(dir / "run" / "metrics.jsonl");
  double dropped = 0;
  for (const auto& m : lines) {
    if (!m.contains("dynamic_sampling/dropped_groups")) continue;
    dropped += m["dynamic_sampling/dropped_groups"].get<double>();
    EXPECT_TRUE(m.contains("rewards/exact/mean") && m.contains("rewards/regex_1/mean")) << m.dump();
  }
  EXPECT_GT(dropped, 0) << "no group was ever dropped: the test would not exercise dynamic sampling";
  const auto& last = lines.back();
  ASSERT_TRUE(last.contains("eval/rewards/exact") && !last.contains("eval/exact_match")) << last.dump();
  const double after = last["eval/rewards/exact"].get<double>();
  std::cout << "[dapo dynamic upper] held-out exact match: SFT " << before << " -> " << after << "\n";
  anvil::testing::record_figure("held-out exact match gain", after - before, 0.0, 0.15);
  EXPECT_GE(after, before + 0.15) << last.dump();
}

/// configs/rm_tiny.yaml from the fixture for `steps` steps in `out`; returns its last checkpoint.
stdfs::path tiny_reward_model(const stdfs::path& out, int steps) {
  std::string log;
  const auto s = std::to_string(steps);
  EXPECT_EQ(run("cd " + anvil::testing::source_dir() + " && " + anvil::testing::trainer_bin() +
                    " --config configs/rm_tiny.yaml output_dir=" + out.string() + " model.from=" +
                    fixture_checkpoint().string() + " train.max_steps=" + s + " train.save_every=" + s +
                    " train.eval_every=0 train.threads=1" + anvil::testing::seed_override() + " 2>&1",
                &log),
            0)
      << log;
  return out / ("checkpoint-" + s);
}

// A reward model trained for 100 steps (configs/rm_tiny.yaml from the
// fixture) scores the responses: its held-out mean reward rises. The reward
// model is frozen, and the eval's greedy answers become right.
TEST(PpoLearning, RewardModelRewardRaisesTheHeldOutMeanReward) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string reward = " ppo.reward.exact_match= ppo.reward.model=" + tiny_reward_model(dir / "rm", 100).string();
  ppo_run(dir / "before", "--eval-only" + reward);
  const auto before = nlohmann::json::parse(anvil::testing::read_text(dir / "before" / "eval-step-0.json"));
  ppo_run(dir / "ppo", "train.max_steps=80 train.eval_every=80 train.save_every=80" + reward);
  const auto last = anvil::testing::metric_lines(dir / "ppo" / "metrics.jsonl").back();
  const double r0 = before["metrics"]["eval/reward"].get<double>();
  std::cout << "[ppo upper, reward model] held-out mean reward: SFT " << r0 << " -> PPO "
            << last["eval/reward"].get<double>() << "\n";
  // The reward model's scale moves with its training: over 4 fixtures x 2
  // seeds here the gain was 1.4-2.8, and +0.28 on a Zen 5 under the previous
  // weight decay rule (docs/reliability.md).
  anvil::testing::record_figure("held-out mean reward gain", last["eval/reward"].get<double>() - r0, 0.0, 0.2);
  EXPECT_GE(last["eval/reward"].get<double>(), r0 + 0.2) << last.dump();
}

// One process and two MPI ranks under full_shard: the same rollouts (per-sample
// seeds), so the same scores, KL and losses.
TEST(PpoRuns, TwoShardedRanksMatchOneProcess) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string common =
      "train.max_steps=12 train.eval_every=12 train.save_every=0 train.log_every=1 train.micro_batch_size=16";
  ppo_run(dir / "one", common);
  const auto log = ppo_run(dir / "two", common + " dist.sharding=full_shard", 2);
  const auto a = anvil::testing::metrics_by_step(dir / "one" / "metrics.jsonl"),
             b = anvil::testing::metrics_by_step(dir / "two" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u) << log;
  for (const auto& [step, m] : a)
    for (const char* key : {"loss", "objective/scores", "objective/kl", "loss/policy_avg", "loss/value_avg",
                            "val/num_eos_tokens", "eval/exact_match"}) {
      if (!m.contains(key)) continue;
      ASSERT_TRUE(b.at(step).contains(key)) << step << " " << key;
      const double x = m[key].get<double>(), y = b.at(step)[key].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-5 * std::max(1.0, std::abs(x))) << "step " << step << " " << key;
    }
  EXPECT_NE(log.find("full_shard"), std::string::npos);
}

// GRPO with every variant key off its default (sequence_mean, GSPO's sequence
// ratio with clip-higher, batch-scaled rewards, truncated responses masked,
// the overlong penalty):
// two full_shard ranks log what one process logs, and a run stopped at a
// checkpoint and resumed logs what the straight run logs, bit for bit.
TEST(PpoRuns, GrpoVariantsShardAndResumeExactly) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string grpo =
      "ppo.loss_aggregation=sequence_mean ppo.importance_sampling_level=sequence ppo.cliprange=0.05 "
      "ppo.cliprange_high=0.08 ppo.scale_rewards=batch ppo.mask_truncated_completions=true ppo.max_new_tokens=4 "
      "ppo.overlong_penalty.buffer=2 ppo.overlong_penalty.factor=0.5 "
      "ppo.dynamic_sampling=true ppo.dynamic_sampling_max_rounds=2 ppo.reward.exact_match=null "
      "'ppo.rewards=[{exact_match: response, name: exact}, {regex: response, weight: 0.5}]' "
      "train.eval_every=0 train.log_every=1 train.save_every=4 train.micro_batch_size=16 ";
  const std::string config = "configs/grpo_tiny.yaml";
  ppo_run(dir / "one", grpo + "train.max_steps=12", 0, config);
  const auto log = ppo_run(dir / "two", grpo + "train.max_steps=12 dist.sharding=full_shard", 2, config);
  // The resumed run also keeps its decoder's buckets from one rollout to the next: the same values.
  ppo_run(dir / "resumed", grpo + "train.max_steps=8 ppo.keep_decoder=true", 0, config);
  stdfs::remove_all(dir / "resumed" / "checkpoint-8");  // resume from step 4, as after a kill
  ppo_run(dir / "resumed", grpo + "train.max_steps=12 ppo.keep_decoder=true", 0, config);
  const auto a = anvil::testing::metrics_by_step(dir / "one" / "metrics.jsonl");
  const auto b = anvil::testing::metrics_by_step(dir / "two" / "metrics.jsonl");
  const auto c = anvil::testing::metrics_by_step(dir / "resumed" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u) << log;
  ASSERT_EQ(c.size(), 12u);
  bool masked = false, clipped = false, penalised = false, dropped = false;
  for (const auto& [step, m] : a) {
    if (m.contains("dynamic_sampling/dropped_groups")) {
      dropped |= m["dynamic_sampling/dropped_groups"].get<double>() > 0;
      EXPECT_TRUE(m.contains("rewards/exact/mean") && m.contains("rewards/regex_1/std")) << m.dump();
    }
    if (m.contains("val/num_eos_tokens")) masked |= m["val/num_eos_tokens"].get<double>() < 64;
    clipped |= m["clip_ratio/region_mean"].get<double>() > 0;
    if (m.contains("objective/overlong_penalty")) penalised |= m["objective/overlong_penalty"].get<double>() < 0;
    for (const char* key :
         {"loss", "objective/scores", "objective/kl", "loss/policy_avg", "policy/kl_avg", "clip_ratio/low_mean",
          "clip_ratio/high_mean", "grad_norm", "objective/overlong_penalty", "objective/rlhf_reward",
          "rewards/exact/mean", "rewards/regex_1/mean", "rewards/regex_1/std", "dynamic_sampling/rounds",
          "dynamic_sampling/dropped_groups", "dynamic_sampling/short_groups"}) {
      if (!m.contains(key)) continue;
      ASSERT_TRUE(b.at(step).contains(key) && c.at(step).contains(key)) << step << " " << key;
      const double x = m[key].get<double>(), y = b.at(step)[key].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-5 * std::max(1.0, std::abs(x))) << "2 ranks, step " << step << " " << key;
      EXPECT_EQ(x, c.at(step)[key].get<double>()) << "resumed, step " << step << " " << key;
    }
  }
  EXPECT_TRUE(masked) << "some responses were cut by max_new_tokens";
  EXPECT_TRUE(clipped) << "some ratios were clipped";
  EXPECT_TRUE(penalised) << "some responses were long enough for the overlong penalty";
  EXPECT_TRUE(dropped) << "some groups scored alike and were dropped";
}

// ppo.async.emulate, the one-step-off schedule on the training process (PPO
// with a value head, whose values are recomputed with the log-probs): the
// first iteration trains the batch its own weights sampled (staleness 0, every
// weight 1), so its steps equal the synchronous run's; later iterations train
// the batch sampled before the last update (staleness 1) with the truncated
// importance weights. A stop mid-iteration saves the batch in flight, and the
// resumed run logs every value the uninterrupted one does, bit for bit.
TEST(PpoRuns, OneStepOffEmulationIsOneStepStaleAndResumesExactly) {
  TempDir dir;
  const auto trainer = [&](const std::string& out, const std::string& env, const std::string& extra, std::string* log) {
    return run("cd " + anvil::testing::source_dir() + " && " + env + " " + anvil::testing::trainer_bin() +
                   " --config configs/ppo_tiny.yaml output_dir=" + (dir / out).string() +
                   " model.from= model.family=gpt2 model.hidden_size=32 model.num_hidden_layers=1 "
                   "model.num_attention_heads=2 model.max_position_embeddings=32 tokenizer.path=data/tokenizer.model"
                   " train.threads=1 train.max_steps=12 train.save_every=100 train.eval_every=0 data.eval=null "
                   "train.log_every=1 train.micro_batch_size=16 " +
                   extra + " 2>&1",
               log);
  };
  std::string log;
  ASSERT_EQ(trainer("sync", "", "", &log), 0) << log;
  ASSERT_EQ(trainer("async", "", "ppo.async.emulate=true", &log), 0) << log;
  ASSERT_EQ(trainer("stopped", "ANVIL_TEST_SIGNALS_AT_STEP=5:INT", "ppo.async.emulate=true", &log), 0) << log;
  ASSERT_TRUE(stdfs::exists(dir / "stopped" / "checkpoint-8" / "trainer_state.json"));
  EXPECT_NE(anvil::testing::read_text(dir / "stopped" / "checkpoint-8" / "trainer_state.json").find("in_flight"),
            std::string::npos);
  ASSERT_EQ(trainer("stopped", "", "ppo.async.emulate=true", &log), 0) << log;
  const auto sync = anvil::testing::metrics_by_step(dir / "sync" / "metrics.jsonl");
  const auto a = anvil::testing::metrics_by_step(dir / "async" / "metrics.jsonl");
  const auto b = anvil::testing::metrics_by_step(dir / "stopped" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  // Staleness 0 on the first iteration, then 1; weights 1 at staleness 0, never above the cap.
  for (const int64_t step : {1, 5, 9}) {
    const auto& m = a.at(step);
    ASSERT_TRUE(m.contains("rollout/staleness") && m.contains("rollout/is_weight_mean")) << m.dump();
    EXPECT_EQ(m["rollout/staleness"].get<double>(), step == 1 ? 0.0 : 1.0);
    EXPECT_LE(m["rollout/is_weight_max"].get<double>(), 2.0);
    if (step == 1) EXPECT_EQ(m["rollout/is_weight_mean"].get<double>(), 1.0);
  }
  // Once the weights have moved, the batch's behaviour log-probs are not the proximal ones.
  EXPECT_NE(a.at(9)["rollout/is_weight_mean"].get<double>(), 1.0) << a.at(9).dump();
  const auto measured = [](const std::string& key) {  // timings, speeds and memory differ between any two runs
    return key.find("time") != std::string::npos || key.find("_per_s") != std::string::npos ||
           key.find("memory") != std::string::npos;
  };
  // The first iteration trains what the synchronous run trains (the sampling metrics, rewards/ and rollout/,
  // are the next batch's); the second trains another, older batch.
  int first = 0;
  for (int64_t step = 1; step <= 4; ++step)
    for (const auto& [key, v] : sync.at(step).items()) {
      if (measured(key) || !v.is_number() || key.rfind("rewards/", 0) == 0 || key.rfind("rollout/", 0) == 0) continue;
      ASSERT_TRUE(a.at(step).contains(key)) << step << " " << key;
      EXPECT_EQ(a.at(step)[key].get<double>(), v.get<double>()) << "step " << step << " " << key;
      ++first;
    }
  EXPECT_GE(first, 4 * 3);
  EXPECT_NE(a.at(5)["grad_norm"].get<double>(), sync.at(5)["grad_norm"].get<double>())
      << a.at(5).dump() << sync.at(5).dump();
  int compared = 0;
  for (const auto& [step, m] : a)
    for (const auto& [key, v] : m.items()) {
      if (measured(key) || !v.is_number()) continue;
      ASSERT_TRUE(b.at(step).contains(key)) << "step " << step << " " << key;
      EXPECT_EQ(v.get<double>(), b.at(step)[key].get<double>()) << "resumed, step " << step << " " << key;
      ++compared;
    }
  EXPECT_GE(compared, 12 * 5);
  // The batch in flight at step 8 was sampled by the weights after step 4 (checkpoint-4): its behaviour
  // log-probs are theirs, recomputed here from the saved model.
  ASSERT_EQ(trainer("saved", "", "ppo.async.emulate=true train.max_steps=8 train.save_every=4", &log), 0) << log;
  const auto state = nlohmann::json::parse(
      anvil::testing::read_text(dir / "saved" / "checkpoint-8" / "trainer_state.json"))["objective"]["in_flight"];
  EXPECT_EQ(state["sampled_by_iteration"].get<int64_t>(), 1);
  ASSERT_EQ(state["rows"].size(), 64u);
  {
    const auto before = checkpoint::load_model_dir(dir / "saved" / "checkpoint-4");
    torch::NoGradGuard no_grad;
    before->eval();
    double worst = 0;
    for (const auto& row : state["rows"]) {
      const auto prompt = row["prompt"].get<std::vector<int64_t>>(),
                 response = row["response"].get<std::vector<int64_t>>();
      const auto logp = row["old_logp"].get<std::vector<double>>();
      ASSERT_EQ(logp.size(), response.size());
      std::vector<int64_t> ids = prompt;
      ids.insert(ids.end(), response.begin(), response.end());
      const auto lsm = before->forward(at::tensor(ids, at::kLong).unsqueeze(0)).log_softmax(-1)[0];
      for (size_t j = 0; j < response.size(); ++j)
        worst = std::max(
            worst, std::abs(lsm[static_cast<int64_t>(prompt.size() + j - 1)][response[j]].item<double>() - logp[j]));
    }
    EXPECT_LT(worst, 1e-5) << "the batch in flight's log-probs are those of the weights that sampled it";
  }
  // Two sharded ranks run the same schedule: each samples its share of the next batch, and the batch in flight
  // is every rank's.
  ASSERT_EQ(trainer("two", anvil::testing::mpirun(2), "ppo.async.emulate=true dist.sharding=full_shard", &log), 0)
      << log;
  const auto two = anvil::testing::metrics_by_step(dir / "two" / "metrics.jsonl");
  ASSERT_EQ(two.size(), 12u) << log;
  for (const auto& [step, m] : a)
    for (const char* key : {"loss", "grad_norm", "objective/scores", "objective/kl", "rollout/is_weight_mean"}) {
      if (!m.contains(key)) continue;
      ASSERT_TRUE(two.at(step).contains(key)) << step << " " << key;
      const double x = m[key].get<double>(), y = two.at(step)[key].get<double>();
      EXPECT_LE(std::abs(x - y), 1e-5 * std::max(1.0, std::abs(x))) << "2 ranks, step " << step << " " << key;
    }
  // bypass: the behaviour log-probs are the old ones; no weights.
  ASSERT_EQ(trainer("bypass", "", "ppo.async.emulate=true ppo.async.correction=bypass train.max_steps=8", &log), 0)
      << log;
  const auto c = anvil::testing::metrics_by_step(dir / "bypass" / "metrics.jsonl");
  EXPECT_EQ(c.at(5)["rollout/staleness"].get<double>(), 1.0);
  EXPECT_FALSE(c.at(5).contains("rollout/is_weight_mean"));
  // Its keys do nothing on the synchronous schedule, so they are refused there.
  EXPECT_NE(trainer("refused", "", "ppo.async.is_cap=3", &log), 0);
  EXPECT_NE(log.find("ppo.async.is_cap: applies to the one-step-off schedule"), std::string::npos) << log;
  // A checkpoint saved without the schedule does not resume into it.
  ASSERT_NE(trainer("sync", "", "ppo.async.emulate=true train.max_steps=16", &log), 0);
  EXPECT_NE(log.find("ppo.async"), std::string::npos) << log;
}

// kill -9 mid-run, then resume: the same losses as the uninterrupted run
// (saves fall at rollout boundaries, and a resumed run starts a fresh rollout).
// SIGINT / SIGTERM in the middle of an iteration (4 steps on one rollout):
// the run finishes the iteration, saves at its boundary and exits 0; the
// rerun logs every value the uninterrupted run logs, bit for bit. ILQL,
// whose iterations are single steps, stops after the step.
TEST(PpoRuns, InterruptedMidIterationResumesExactly) {
  struct Case {
    const char* config;
    const char* signals;  // ANVIL_TEST_SIGNALS_AT_STEP: raised when this many steps are done
    int64_t saved_at;
  };
  for (const auto& c : {Case{"configs/ppo_tiny.yaml", "5:INT", 8}, Case{"configs/grpo_tiny.yaml", "6:TERM", 8},
                        Case{"configs/ppo_tiny.yaml", "1:TERM", 4},
                        Case{"configs/ilql_tiny.yaml", "5:INT", 6}}) {  // ILQL: one step an iteration
    SCOPED_TRACE(std::string(c.config) + " " + c.signals);
    TempDir dir;
    const auto trainer = [&](const std::string& out, const std::string& env, std::string* log) {
      return run("cd " + anvil::testing::source_dir() + " && " + env + " " + anvil::testing::trainer_bin() +
                     " --config " + c.config + " output_dir=" + (dir / out).string() +
                     " model.from= model.family=gpt2 model.hidden_size=32 model.num_hidden_layers=1 "
                     "model.num_attention_heads=2"
                     " model.max_position_embeddings=32 tokenizer.path=data/tokenizer.model train.threads=1"
                     " train.max_steps=12 train.save_every=100 train.eval_every=0 data.eval=null 2>&1",
                 log);
    };
    std::string log;
    ASSERT_EQ(trainer("straight", "", &log), 0) << log;
    ASSERT_EQ(trainer("stopped", std::string("ANVIL_TEST_SIGNALS_AT_STEP=") + c.signals, &log), 0) << log;
    EXPECT_NE(log.find("stop requested: saved step " + std::to_string(c.saved_at) + " and exiting"), std::string::npos)
        << log;
    ASSERT_TRUE(stdfs::exists(dir / "stopped" / ("checkpoint-" + std::to_string(c.saved_at)) / "trainer_state.json"));
    ASSERT_EQ(trainer("stopped", "", &log), 0) << log;
    EXPECT_NE(log.find("at step " + std::to_string(c.saved_at)), std::string::npos) << log;
    const auto a = anvil::testing::metrics_by_step(dir / "straight" / "metrics.jsonl");
    const auto b = anvil::testing::metrics_by_step(dir / "stopped" / "metrics.jsonl");
    ASSERT_EQ(a.size(), 12u);
    ASSERT_EQ(b.size(), 12u);
    int compared = 0;
    for (const auto& [step, m] : a)
      for (const auto& [key, v] : m.items()) {
        // Timings, speeds and memory differ between any two runs.
        if (key.find("time") != std::string::npos || key.find("_per_s") != std::string::npos ||
            key.find("memory") != std::string::npos || !v.is_number())
          continue;
        ASSERT_TRUE(b.at(step).contains(key)) << "step " << step << " " << key;
        EXPECT_EQ(v.get<double>(), b.at(step)[key].get<double>()) << "step " << step << " " << key;
        ++compared;
      }
    EXPECT_GE(compared, 12 * 5);
  }
}

TEST(PpoRuns, KilledAndResumedRunMatchesTheUninterruptedOne) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  // Killed after checkpoint-32, then 16 steps resumed: a fresh rollout, the adaptive KL coefficient
  // and the optimizer's moments all carry over (it was 160 steps, 128 of them after the resume).
  const std::string common = "train.max_steps=48 train.eval_every=0 train.save_every=16 train.log_every=1000";
  ppo_run(dir / "straight", common);
  const auto& w = weak_upper();
  const auto out = dir / "killed";
  const auto cmd = anvil::testing::trainer_bin() + " --config configs/ppo_tiny.yaml output_dir=" + out.string() +
                   " model.from=" + w.model.string() + " 'data.train=[{path: " + w.prompts.string() +
                   "}]' data.eval[0].path=" + w.eval.string() + " train.threads=1 " + common;
  std::string log;
  ASSERT_EQ(anvil::testing::kill_after_checkpoint(cmd, dir / "killed.log", out / "checkpoint-32", &log), 0) << log;
  ASSERT_TRUE(stdfs::exists(out / "checkpoint-32" / "trainer_state.json"));
  ASSERT_FALSE(stdfs::exists(out / "checkpoint-48")) << "the run ended before it was killed";
  ppo_run(out, common);  // resumes from the newest checkpoint
  const auto a = anvil::testing::metrics_by_step(dir / "straight" / "metrics.jsonl"),
             b = anvil::testing::metrics_by_step(out / "metrics.jsonl");
  ASSERT_EQ(a.size(), 48u);
  ASSERT_EQ(b.size(), 48u);
  for (const auto& [step, m] : a)
    for (const char* key : {"loss", "objective/scores", "objective/kl", "objective/kl_coef", "grad_norm"}) {
      if (!m.contains(key)) continue;
      ASSERT_TRUE(b.at(step).contains(key)) << step << " " << key;
      EXPECT_EQ(m[key].get<double>(), b.at(step)[key].get<double>()) << "step " << step << " " << key;
    }
}

// train.overlap_step_reads on PPO (value head on the policy, the adaptive KL
// controller in after_step) and GRPO: each step is read while the next runs,
// an iteration's last step before the next rollout. With step 3 not finite
// and skipped, every line and the final checkpoint equal reading each step
// at once.
TEST(PpoRuns, StepsReadWhileTheNextRunsEqualReadAtOnce) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string common =
      "train.max_steps=12 train.eval_every=0 train.save_every=12 train.log_every=1 train.on_nonfinite=skip";
  weak_upper();  // made first, without the fault below (when this test is the first to ask for it)
  ::setenv("ANVIL_TEST_NONFINITE", "grad@3", 1);
  for (const std::string config : {"configs/ppo_tiny.yaml", "configs/grpo_tiny.yaml"}) {
    const auto name = stdfs::path(config).stem().string();
    const auto late = ppo_run(dir / (name + "-late"), common, 0, config);
    const auto now = ppo_run(dir / (name + "-now"), common + " train.overlap_step_reads=false", 0, config);
    EXPECT_NE(late.find("each step read while the next runs"), std::string::npos) << late;
    EXPECT_EQ(now.find("each step read while the next runs"), std::string::npos) << now;
    EXPECT_NE(late.find("step 3: the gradient norm is nan; step skipped (1 so far)"), std::string::npos) << late;
    const auto a = anvil::testing::metrics_by_step(dir / (name + "-late") / "metrics.jsonl"),
               b = anvil::testing::metrics_by_step(dir / (name + "-now") / "metrics.jsonl");
    ASSERT_EQ(a.size(), 12u) << name;
    ASSERT_EQ(b.size(), 12u) << name;
    for (const auto& [step, m] : a)
      for (const auto& [key, value] : m.items()) {
        if (key.rfind("time/", 0) == 0 || key.find("per_s") != std::string::npos) continue;  // timings
        // The host's allocation peaks: overlapped reads hold a step's outputs a step longer.
        if (key.rfind("memory/cpu_", 0) == 0) continue;
        ASSERT_TRUE(b.at(step).contains(key)) << name << " step " << step << " " << key;
        EXPECT_EQ(value.dump(), b.at(step)[key].dump()) << name << " step " << step << " " << key;
      }
    std::string out;
    for (const auto* file : {"model.safetensors", "optimizer.safetensors", "optimizer.json", "trainer_state.json"})
      EXPECT_EQ(run("cmp " + (dir / (name + "-late") / "checkpoint-12" / file).string() + " " +
                        (dir / (name + "-now") / "checkpoint-12" / file).string(),
                    &out),
                0)
          << name << " " << file << ": " << out;
  }
  ::unsetenv("ANVIL_TEST_NONFINITE");
}

// ppo.critic_from: a separate critic initialised from a reward model (its
// score head becomes the value head) trains beside the policy with its own
// optimizer and gradient norm. The policy still learns the task; checkpoints
// hold the critic as an HF sequence-classification folder with its AdamW
// state (and no value head on the policy); a run resumed from a checkpoint
// gives the uninterrupted run's losses; two full_shard ranks give one
// process's.
TEST(PpoRuns, SeparateCriticLearnsResumesAndShards) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const auto rm = tiny_reward_model(dir / "rm", 40);
  const std::string critic = " ppo.critic_from=" + rm.string() + " ppo.critic_learning_rate=3e-4";
  // Saves at step 144 (a rollout boundary) for the resume below, and at the end.
  const std::string common = "train.max_steps=160 train.eval_every=160 train.save_every=144 train.log_every=1" + critic;
  ppo_run(dir / "straight", common);
  const auto a = anvil::testing::metrics_by_step(dir / "straight" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 160u);
  for (const auto& [step, m] : a) {
    ASSERT_TRUE(m.contains("critic/grad_norm") && m.contains("loss/value_avg")) << m.dump();
    EXPECT_GT(m["critic/grad_norm"].get<double>(), 0) << "step " << step;
  }
  const double before = first_eval(weak_upper().model.parent_path() / "metrics.jsonl");
  const double after = a.at(160)["eval/exact_match"].get<double>();
  std::cout << "[ppo upper, separate critic] held-out exact match: SFT " << before << " -> PPO " << after << "\n";
  anvil::testing::record_figure("held-out exact match gain", after - before, 0.0, 0.15);
  EXPECT_GE(after, before + 0.15) << a.at(160).dump();
  if (anvil::testing::sweeping()) return;

  const auto ckpt = dir / "straight" / "checkpoint-160";
  EXPECT_FALSE(stdfs::exists(ckpt / "heads.safetensors")) << "the policy carries no value head";
  for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", "optimizer.json"})
    EXPECT_TRUE(stdfs::exists(ckpt / "critic" / f)) << f;
  const auto cfg = nlohmann::json::parse(anvil::testing::read_text(ckpt / "critic" / "config.json"));
  EXPECT_NE(cfg["architectures"][0].get<std::string>().find("ForSequenceClassification"), std::string::npos);
  {
    io::SafetensorsFile trained(ckpt / "critic" / "model.safetensors"), initial(rm / "model.safetensors");
    EXPECT_FALSE(at::equal(trained.get("score.weight"), initial.get("score.weight"))) << "the critic trained";
  }

  // Resumed from checkpoint-144 in a fresh folder: steps 145..160 as before.
  stdfs::create_directories(dir / "resumed");
  stdfs::copy(dir / "straight" / "checkpoint-144", dir / "resumed" / "checkpoint-144", stdfs::copy_options::recursive);
  ppo_run(dir / "resumed", common);
  const auto b = anvil::testing::metrics_by_step(dir / "resumed" / "metrics.jsonl");
  ASSERT_EQ(b.size(), 16u);
  for (const auto& [step, m] : b)
    for (const char* key : {"loss", "loss/value_avg", "critic/grad_norm", "objective/scores", "eval/exact_match"}) {
      if (!a.at(step).contains(key)) continue;
      EXPECT_EQ(a.at(step)[key].get<double>(), m[key].get<double>()) << "step " << step << " " << key;
    }

  // One process and two full_shard ranks.
  const std::string shortrun =
      "train.max_steps=12 train.eval_every=0 train.save_every=12 train.log_every=1 train.micro_batch_size=16" + critic;
  ppo_run(dir / "one", shortrun);
  const auto log = ppo_run(dir / "two", shortrun + " dist.sharding=full_shard", 2);
  const auto x = anvil::testing::metrics_by_step(dir / "one" / "metrics.jsonl"),
             y = anvil::testing::metrics_by_step(dir / "two" / "metrics.jsonl");
  ASSERT_EQ(y.size(), 12u) << log;
  for (const auto& [step, m] : x)
    for (const char* key : {"loss", "loss/value_avg", "critic/grad_norm", "objective/scores", "objective/kl"}) {
      if (!m.contains(key)) continue;  // the rollout's metrics are on its first step
      ASSERT_TRUE(y.at(step).contains(key)) << step << " " << key;
      const double u = m[key].get<double>(), v = y.at(step)[key].get<double>();
      EXPECT_LE(std::abs(u - v), 1e-5 * std::max(1.0, std::abs(u))) << "step " << step << " " << key;
    }
  // The two-rank checkpoint's critic folder is the same whole model.
  io::SafetensorsFile one(dir / "one" / "checkpoint-12" / "critic" / "model.safetensors"),
      two(dir / "two" / "checkpoint-12" / "critic" / "model.safetensors");
  EXPECT_LE((one.get("score.weight") - two.get("score.weight")).abs().max().item<double>(), 1e-5);

  // bf16 on one process (the sharded engine on one rank): the checkpoint
  // takes the single-process layout, critic folder included, and a run
  // resumed from it in a fresh folder continues bit for bit.
  const std::string bf16 = shortrun + " dist.param_dtype=bfloat16 train.save_every=4";  // 4 steps a rollout
  ppo_run(dir / "bf16", bf16);
  EXPECT_FALSE(stdfs::exists(dir / "bf16" / "checkpoint-8" / "sharding.json"));
  EXPECT_TRUE(stdfs::exists(dir / "bf16" / "checkpoint-8" / "critic" / "optimizer.safetensors"));
  stdfs::create_directories(dir / "bf16-resumed");
  stdfs::copy(dir / "bf16" / "checkpoint-8", dir / "bf16-resumed" / "checkpoint-8", stdfs::copy_options::recursive);
  ppo_run(dir / "bf16-resumed", bf16);
  const auto c = anvil::testing::metrics_by_step(dir / "bf16" / "metrics.jsonl"),
             d = anvil::testing::metrics_by_step(dir / "bf16-resumed" / "metrics.jsonl");
  ASSERT_EQ(d.size(), 4u);
  for (const auto& [step, m] : d)
    for (const char* key : {"loss", "loss/value_avg", "critic/grad_norm"})
      EXPECT_EQ(c.at(step)[key].get<double>(), m[key].get<double>()) << "bf16, step " << step << " " << key;
}

}  // namespace
}  // namespace anvil::train
