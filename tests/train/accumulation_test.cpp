// Token-weighted gradient accumulation: N micro-batches must give exactly the
// gradients of one batch holding all their samples.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "data/collate.h"
#include "models/gpt2/gpt2.h"
#include "anvil/train/sft.h"
#include "train/step_engine.h"
#include "data/datasets.h"

namespace anvil::train {
namespace {

struct FixedSource final : BatchSource {
  Batch next() override { return {}; }
  nlohmann::json state() const override { return {}; }
  void restore(const nlohmann::json&) override {}
};

/// The SFT loss on given batches, without a dataset.
struct SftLossOnly final : Objective {
  std::string name() const override { return "sft"; }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& b, Sums&) override {
    return causal_lm_loss_sum(model.forward(b.tensors.at("input_ids")), b.tensors.at("labels"));
  }
  EvalResult evaluate(models::CausalLM&) override { return {}; }
  BatchSource& train_source() override { return source; }
  FixedSource source;
};

Batch to_batch(const std::vector<const data::LmSample*>& samples) {
  auto b = data::collate_unpacked(samples, 0);
  Batch out;
  out.tensors = {{"input_ids", b.input_ids}, {"labels", b.labels}};
  out.num_targets = b.num_targets;
  out.num_tokens = b.num_tokens;
  return out;
}

void check_accumulation(at::ScalarType dtype) {
  torch::manual_seed(3);
  models::gpt2::GPT2Options o;
  o.vocab_size(40).n_positions(32).n_embd(32).n_layer(2).n_head(4).resid_pdrop(0).embd_pdrop(0).attn_pdrop(0);
  auto model = std::make_shared<models::gpt2::GPT2LMHeadModel>(o);
  model->to(dtype);

  // 8 samples of very different lengths and target counts.
  std::vector<data::LmSample> samples;
  for (int i = 0; i < 8; ++i) {
    data::LmSample s;
    const int len = 4 + 3 * i, prompt = 2 + i % 3;
    for (int t = 0; t < len; ++t) s.input_ids.push_back((7 * i + 3 * t) % 40);
    s.labels = s.input_ids;
    for (int t = 0; t < prompt; ++t) s.labels[t] = chat::kIgnoreIndex;
    samples.push_back(s);
  }
  std::vector<const data::LmSample*> all;
  for (const auto& s : samples) all.push_back(&s);

  SftLossOnly objective;
  auto grads = [&](const std::vector<Batch>& batches) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    const auto stats = accumulate_gradients(objective, *model, batches);
    std::vector<at::Tensor> g;
    for (auto& p : model->parameters()) g.push_back(p.grad().clone());
    return std::make_pair(stats, g);
  };
  auto [big_stats, big] = grads({to_batch(all)});
  std::vector<Batch> micro;
  for (int m = 0; m < 4; ++m) micro.push_back(to_batch({all[2 * m], all[2 * m + 1]}));
  auto [acc_stats, acc] = grads(micro);

  EXPECT_EQ(acc_stats.num_targets, big_stats.num_targets);
  EXPECT_NEAR(acc_stats.loss, big_stats.loss, 1e-6);
  for (size_t i = 0; i < big.size(); ++i) {
    const double diff = (big[i] - acc[i]).abs().max().item<double>();
    EXPECT_LT(diff, 1e-6) << "parameter " << i;
  }

  // A mean of micro-batch means would differ: make sure the test can tell.
  double mean_of_means = 0;
  for (const auto& b : micro) mean_of_means += train::lm_batch_loss_sum(*model, b).item<double>() / b.num_targets / 4;
  EXPECT_GT(std::abs(mean_of_means - big_stats.loss), 1e-4);
}

}  // namespace
}  // namespace anvil::train

namespace anvil::train {
namespace {

// float64 isolates the accumulation math from summation order; float32 is
// what training uses, and must hold the same 1e-6 bound.
TEST(Accumulation, FourMicroBatchesEqualOneBigBatchFloat64) { check_accumulation(at::kDouble); }
TEST(Accumulation, FourMicroBatchesEqualOneBigBatchFloat32) { check_accumulation(at::kFloat); }

}  // namespace
}  // namespace anvil::train
