// train.fused_loss: the LM head and the cross-entropy computed together, a
// chunk of target rows at a time, with the gradients taken in the forward
// pass, equal the plain path (logits, then cross_entropy) and its gradients
// on every family, at any chunk size, with packing and without; the fused
// function alone handles a bias, a padded vocabulary, a frozen head and rows
// without a target.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>

#include "anvil/config/config.h"
#include "anvil/chat/chat.h"
#include "anvil/models/registry.h"
#include "anvil/train/sft.h"
#include "test_util.h"
#include "train/objectives/lm_loss.h"

namespace anvil::train {
namespace {

std::shared_ptr<models::CausalLM> build_flavor(const std::string& flavor) {
  const auto src = anvil::testing::source_dir();
  auto cfg = config::load_config({src + "/configs/quickstart.yaml", src + "/configs/models/" + flavor + ".yaml"},
                                 {"output_dir=unused"});
  auto mc = cfg.model;
  mc.vocab_size = 97;
  mc.dropout = 0;
  return models::family_by_name(mc.family).from_config(mc);
}

/// Loss and every parameter's gradient of one batch.
std::pair<double, std::map<std::string, at::Tensor>> loss_and_grads(models::CausalLM& model, const Batch& b,
                                                                    const LmLossOptions& o) {
  model.zero_grad();
  const auto loss = lm_batch_loss_sum(model, b, o);
  loss.backward();
  std::map<std::string, at::Tensor> g;
  for (const auto& p : model.named_parameters())
    if (p.value().grad().defined()) g.emplace(p.key(), p.value().grad().clone());
  return {loss.item<double>(), g};
}

class FusedLoss : public ::testing::TestWithParam<std::string> {};

TEST_P(FusedLoss, EqualsThePlainLossAndGradients) {
  at::manual_seed(5);
  auto model = build_flavor(GetParam());
  model->train();
  Batch b;
  auto ids = at::randint(97, {3, 17}, at::kLong);
  auto labels = ids.clone();
  labels.narrow(1, 0, 6).fill_(chat::kIgnoreIndex);      // prompts
  labels[2].narrow(0, 12, 5).fill_(chat::kIgnoreIndex);  // padding
  b.tensors["input_ids"] = ids;
  b.tensors["labels"] = labels;
  const auto [want, want_g] = loss_and_grads(*model, b, {/*fused=*/false, 0});
  EXPECT_GT(want, 0.0);
  for (const int64_t chunk : {0, 1, 7, 1000}) {
    const auto [got, got_g] = loss_and_grads(*model, b, {/*fused=*/true, chunk});
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "chunk " << chunk;
    ASSERT_EQ(got_g.size(), want_g.size());
    for (const auto& [name, g] : want_g) {
      // A key bias's gradient is zero up to round-off (softmax ignores it): an absolute floor.
      const double scale = g.abs().max().item<double>();
      EXPECT_LE((got_g.at(name) - g).abs().max().item<double>(), 1e-5 * scale + 1e-7) << name << ", chunk " << chunk;
    }
  }
  // Every target (pretraining rows): nothing is skipped, the same sums.
  b.tensors["labels"] = ids.clone();
  const auto [all_want, all_want_g] = loss_and_grads(*model, b, {false, 0});
  const auto [all_got, all_got_g] = loss_and_grads(*model, b, {true, 5});
  EXPECT_NEAR(all_got, all_want, 1e-5 * all_want);
  for (const auto& [name, g] : all_want_g)
    EXPECT_LE((all_got_g.at(name) - g).abs().max().item<double>(), 1e-5 * g.abs().max().item<double>() + 1e-7) << name;
  // No target at all: zero, and backward still runs.
  b.tensors["labels"] = at::full_like(ids, chat::kIgnoreIndex);
  const auto [none, none_g] = loss_and_grads(*model, b, {true, 7});
  EXPECT_EQ(none, 0.0);
  EXPECT_FALSE(none_g.empty());
}

INSTANTIATE_TEST_SUITE_P(Families, FusedLoss, ::testing::ValuesIn(anvil::testing::debug_flavors()));

/// The plain composition the fused function must equal.
at::Tensor plain_loss(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b, const at::Tensor& y) {
  const auto logits = at::linear(h, w, b);
  return at::cross_entropy_loss(logits.to(logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat), y, {},
                                at::Reduction::Sum, -100);
}

TEST(FusedLinearCrossEntropy, BiasPaddingAndAFrozenHeadEqualThePlainComposition) {
  at::manual_seed(11);
  const int64_t N = 23, C = 16, V = 45;
  auto y = at::randint(V, {N}, at::kLong);
  y.narrow(0, 3, 4).fill_(-100);
  for (const int64_t pad_to : {1, 64})
    for (const bool frozen : {false, true})
      for (const int64_t chunk : {0, 4, 100}) {
        auto h = at::randn({N, C}, at::kDouble).requires_grad_();
        auto w = (at::randn({V, C}, at::kDouble) * 0.3).requires_grad_(!frozen);
        auto b = at::randn({V}, at::kDouble).requires_grad_();
        const auto want = plain_loss(h, w, b, y);
        const auto want_g = torch::autograd::grad(
            {want * 1.7}, frozen ? std::vector<at::Tensor>{h, b} : std::vector<at::Tensor>{h, w, b});
        FusedLossOptions o;
        o.chunk = chunk;
        o.pad_to = pad_to;
        const auto got = fused_linear_cross_entropy(h, w, b, y, o);
        EXPECT_EQ(got.scalar_type(), at::kDouble);
        const auto got_g = torch::autograd::grad(
            {got * 1.7}, frozen ? std::vector<at::Tensor>{h, b} : std::vector<at::Tensor>{h, w, b});
        const std::string where =
            "pad_to " + std::to_string(pad_to) + (frozen ? ", frozen" : "") + ", chunk " + std::to_string(chunk);
        EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-12 * std::abs(want.item<double>())) << where;
        for (size_t i = 0; i < want_g.size(); ++i) {
          EXPECT_EQ(got_g[i].sizes(), want_g[i].sizes()) << where;
          EXPECT_LE((got_g[i] - want_g[i]).abs().max().item<double>(), 1e-12) << where << ", gradient " << i;
        }
      }
  // Without grad mode (evaluation): the same loss, no graph.
  at::NoGradGuard no_grad;
  auto h = at::randn({N, C});
  auto w = at::randn({V, C});
  const auto got = fused_linear_cross_entropy(h, w, {}, y, {3, int64_t{1} << 30, 64, -100});
  EXPECT_FALSE(got.requires_grad());
  EXPECT_NEAR(got.item<double>(), plain_loss(h, w, {}, y).item<double>(), 1e-5 * got.item<double>());
}

TEST(FusedLinearCrossEntropy, BFloat16KeepsItsDtypeAndFollowsTheFloatComputation) {
  at::manual_seed(12);
  const int64_t N = 40, C = 32, V = 70;
  auto y = at::randint(V, {N}, at::kLong);
  auto h32 = at::randn({N, C});
  auto w32 = at::randn({V, C}) * 0.2;
  auto h = h32.to(at::kBFloat16).requires_grad_();
  auto w = w32.to(at::kBFloat16).requires_grad_();
  const auto got = fused_linear_cross_entropy(h, w, {}, y, {8, int64_t{1} << 30, 0, -100});
  EXPECT_EQ(got.scalar_type(), at::kFloat);  // the loss is summed in float
  got.backward();
  EXPECT_EQ(h.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(w.grad().scalar_type(), at::kBFloat16);
  auto hf = h.detach().to(at::kFloat).requires_grad_();
  auto wf = w.detach().to(at::kFloat).requires_grad_();
  const auto want = plain_loss(hf, wf, {}, y);
  want.backward();
  EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-2 * want.item<double>());
  EXPECT_LE((h.grad().to(at::kFloat) - hf.grad()).abs().max().item<double>(),
            2e-2 * hf.grad().abs().max().item<double>());
  EXPECT_LE((w.grad().to(at::kFloat) - wf.grad()).abs().max().item<double>(),
            2e-2 * wf.grad().abs().max().item<double>());
}

TEST(FusedLinearLogprobs, EqualTheLogSoftmaxOfThePlainLogitsWithGradients) {
  at::manual_seed(13);
  const int64_t N = 19, C = 12, V = 37;
  auto y = at::randint(V, {N}, at::kLong);
  y.narrow(0, 5, 3).fill_(-100);
  const auto upstream = at::randn({N}, at::kDouble);
  for (const double temperature : {1.0, 0.7})
    for (const int64_t pad_to : {1, 64})
      for (const int64_t chunk : {0, 3, 50}) {
        auto h = at::randn({N, C}, at::kDouble).requires_grad_();
        auto w = (at::randn({V, C}, at::kDouble) * 0.4).requires_grad_();
        auto b = at::randn({V}, at::kDouble).requires_grad_();
        const auto all = (at::linear(h, w, b) / temperature).log_softmax(-1);
        const auto valid = y.ne(-100);
        const auto want = all.gather(1, y.clamp_min(0).unsqueeze(1)).squeeze(1) * valid;
        const auto want_ent = -(all.exp() * all).sum(-1);
        const auto want_g = torch::autograd::grad({(want * upstream).sum()}, {h, w, b});
        FusedLossOptions o;
        o.chunk = chunk;
        o.pad_to = pad_to;
        at::Tensor ent;
        const auto got = fused_linear_logprobs(h, w, b, y, temperature, o, &ent);
        const auto got_g = torch::autograd::grad({(got * upstream).sum()}, {h, w, b});
        const std::string where = "temperature " + std::to_string(temperature) + ", pad_to " + std::to_string(pad_to) +
                                  ", chunk " + std::to_string(chunk);
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-12) << where;
        EXPECT_EQ(got.masked_select(valid.logical_not()).abs().sum().item<double>(), 0.0) << where;
        EXPECT_FALSE(ent.requires_grad());
        EXPECT_LE((ent - want_ent).abs().max().item<double>(), 1e-12) << where;
        for (size_t i = 0; i < want_g.size(); ++i)
          EXPECT_LE((got_g[i] - want_g[i]).abs().max().item<double>(), 1e-12) << where << ", gradient " << i;
      }
}

// DPO and PPO runs with the fused head log the losses of the plain one.
TEST(FusedLossRun, DpoAndGrpoTrainLikeThePlainHead) {
  anvil::testing::TempDir dir;
  const std::string model =
      "model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: "
      "2, dropout: 0.0}\n"
      "tokenizer: {path: data/tokenizer.model}\n"
      "optimizer: {lr: 1.0e-3}\n"
      "eval: {generate_samples: 0}\n";
  const std::string dpo = model + R"(
algorithm: dpo
data: {train: [{path: data/dpo_train.jsonl}], template: plain, max_length: 32}
train: {max_steps: 4, micro_batch_size: 4, log_every: 1, threads: 1}
)";
  const std::string grpo = model + R"(
algorithm: ppo
data: {train: [{path: data/sft_add_train.jsonl}], template: plain, max_length: 32}
train: {max_steps: 4, micro_batch_size: 8, global_batch_size: 8, log_every: 1, threads: 1}
ppo: {advantage: grpo, prompts_per_rollout: 4, samples_per_prompt: 2, max_new_tokens: 6, kl_coef: 0.04,
      reward: {exact_match: response}}
)";
  for (const auto* yaml : {&dpo, &grpo}) {
    std::string log;
    ASSERT_EQ(anvil::testing::train_in(dir, *yaml, "train.fused_loss=false", &log), 0) << log;
    const auto want = anvil::testing::metrics_by_step(dir / "out" / "metrics.jsonl");
    std::filesystem::remove_all(dir / "out");
    ASSERT_EQ(anvil::testing::train_in(dir, *yaml, "", &log), 0) << log;
    const auto got = anvil::testing::metrics_by_step(dir / "out" / "metrics.jsonl");
    std::filesystem::remove_all(dir / "out");
    ASSERT_EQ(got.size(), want.size());
    int compared = 0;
    for (const auto& [step, m] : want)
      for (const char* key : {"loss", "grad_norm", "objective/entropy", "policy/entropy_avg"}) {
        if (!m.contains(key)) continue;
        const double a = m[key].get<double>(), c = got.at(step)[key].get<double>();
        EXPECT_NEAR(c, a, 1e-4 * std::abs(a) + 1e-7) << "step " << step << " " << key;
        ++compared;
      }
    EXPECT_GE(compared, 8);
  }
}

TEST(FusedLinearCrossEntropy, AutomaticChunksKeepTheFloatLogitsWithinTheBudget) {
  FusedLossOptions o;
  EXPECT_EQ(fused_loss_chunk_rows(16384, 50304, o), 4096);  // GPT-2, 16 x 1024: 5,336 rows fit, 4 equal chunks
  EXPECT_EQ(fused_loss_chunk_rows(5336, 50304, o), 5336);
  EXPECT_EQ(fused_loss_chunk_rows(100, 50304, o), 100);  // all at once
  o.chunk = 7;
  EXPECT_EQ(fused_loss_chunk_rows(16384, 50304, o), 7);
}

// A trainer run with the fused loss (packed rows, eval included) logs the
// losses of the plain one.
TEST(FusedLossRun, TrainsLikeThePlainLoss) {
  anvil::testing::TempDir dir;
  const std::string yaml = R"(
model: {family: llama, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}], packing: true, max_length: 32}
optimizer: {lr: 3.0e-3}
train: {max_steps: 8, micro_batch_size: 4, eval_every: 8, log_every: 1, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 0}
)";
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(dir, yaml, "train.fused_loss=false", &log), 0) << log;
  const auto want = anvil::testing::metrics_by_step(dir / "out" / "metrics.jsonl");
  std::filesystem::rename(dir / "out", dir / "plain");
  ASSERT_EQ(anvil::testing::train_in(dir, yaml, "train.loss_chunk_size=16", &log), 0) << log;
  const auto got = anvil::testing::metrics_by_step(dir / "out" / "metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  int compared = 0;
  for (const auto& [step, m] : want)
    for (const char* key : {"loss", "grad_norm", "eval/loss"}) {
      if (!m.contains(key)) continue;
      const double a = m[key].get<double>(), c = got.at(step)[key].get<double>();
      EXPECT_NEAR(c, a, 1e-4 * std::abs(a)) << "step " << step << " " << key;
      ++compared;
    }
  EXPECT_GE(compared, 17);  // 8 losses, 8 norms, 1 eval loss
  // Chunks belong to the fused loss.
  std::filesystem::remove_all(dir / "out");
  EXPECT_NE(anvil::testing::train_in(dir, yaml, "train.fused_loss=false train.loss_chunk_size=16", &log), 0);
  EXPECT_NE(log.find("train.loss_chunk_size: chunks are the fused loss's"), std::string::npos) << log;
}

}  // namespace
}  // namespace anvil::train
