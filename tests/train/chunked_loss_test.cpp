// train.loss_chunk_size: the language-model loss computed a chunk of target
// positions at a time (logits recomputed in backward, positions without a
// target never projected) equals the unchunked loss and its gradients, on
// every family (OPT's project_out included), with packing and without.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "anvil/config/config.h"
#include "anvil/data/chat.h"
#include "anvil/models/registry.h"
#include "anvil/train/sft.h"
#include "test_util.h"

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
                                                                    int64_t chunk) {
  model.zero_grad();
  const auto loss = lm_batch_loss_sum(model, b, chunk);
  loss.backward();
  std::map<std::string, at::Tensor> g;
  for (const auto& p : model.named_parameters())
    if (p.value().grad().defined()) g.emplace(p.key(), p.value().grad().clone());
  return {loss.item<double>(), g};
}

class ChunkedLoss : public ::testing::TestWithParam<std::string> {};

TEST_P(ChunkedLoss, EqualsTheUnchunkedLossAndGradients) {
  at::manual_seed(5);
  auto model = build_flavor(GetParam());
  model->train();
  Batch b;
  auto ids = at::randint(97, {3, 17}, at::kLong);
  auto labels = ids.clone();
  labels.narrow(1, 0, 6).fill_(data::kIgnoreIndex);      // prompts
  labels[2].narrow(0, 12, 5).fill_(data::kIgnoreIndex);  // padding
  b.tensors["input_ids"] = ids;
  b.tensors["labels"] = labels;
  const auto [want, want_g] = loss_and_grads(*model, b, 0);
  for (const int64_t chunk : {1, 7, 1000}) {
    const auto [got, got_g] = loss_and_grads(*model, b, chunk);
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "chunk " << chunk;
    ASSERT_EQ(got_g.size(), want_g.size());
    for (const auto& [name, g] : want_g) {
      // A key bias's gradient is zero up to round-off (softmax ignores it): an absolute floor.
      const double scale = g.abs().max().item<double>();
      EXPECT_LE((got_g.at(name) - g).abs().max().item<double>(), 1e-5 * scale + 1e-7) << name << ", chunk " << chunk;
    }
  }
  // No target at all: zero, and backward still runs.
  b.tensors["labels"] = at::full_like(ids, data::kIgnoreIndex);
  const auto [none, none_g] = loss_and_grads(*model, b, 7);
  EXPECT_EQ(none, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Families, ChunkedLoss,
                         ::testing::Values("gpt2-debug", "llama-debug", "pythia-debug", "opt-debug"));

// A trainer run with the chunked loss (packed rows, eval included) logs the
// losses of the unchunked one.
TEST(ChunkedLossRun, TrainsLikeTheUnchunkedLoss) {
  anvil::testing::TempDir dir;
  const std::string yaml = R"(
model: {family: llama, max_position_embeddings: 32, hidden_size: 32, num_layers: 2, num_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}], packing: true, max_length: 32}
optimizer: {lr: 3.0e-3}
train: {max_steps: 8, micro_batch_size: 4, eval_every: 8, log_every: 1, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 0}
)";
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(dir, yaml, "", &log), 0) << log;
  const auto want = anvil::testing::metrics_by_step(dir / "out" / "metrics.jsonl");
  std::filesystem::rename(dir / "out", dir / "unchunked");
  ASSERT_EQ(anvil::testing::train_in(dir, yaml, "train.loss_chunk_size=16", &log), 0) << log;
  const auto got = anvil::testing::metrics_by_step(dir / "out" / "metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, m] : want)
    for (const char* key : {"loss", "grad_norm", "eval/loss"}) {
      if (!m.contains(key)) continue;
      const double a = m[key].get<double>(), c = got.at(step)[key].get<double>();
      EXPECT_NEAR(c, a, 1e-4 * std::abs(a)) << "step " << step << " " << key;
    }
}

}  // namespace
}  // namespace anvil::train
