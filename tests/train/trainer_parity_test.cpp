// Anvil's SFT follows transformers' Trainer step for step: from the same
// weights (a random tiny GPT-2 that transformers writes), the same rows in
// the same order (data.shuffle: false; the Trainer with a sequential
// sampler) and the same settings, the loss of every one of 200 steps is the
// Trainer's, with and without gradient accumulation, and with weight decay
// applied as the Trainer applies it (not to biases and LayerNorm weights).
// tests/parity/trainer_reference.py runs the Trainer itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "anvil/config/config.h"
#include "anvil/checkpoint/hf_model.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

constexpr int kSteps = 200;
// Per step, relative to max(1, |loss|) (the losses are 3-6). The two runs sum
// in different orders (the fused loss's chunks, the vector width of the CPU's
// kernels), so float32 round-off parts them, and the parting grows as the
// models move: on a Zen 4 (AVX-512) they agree within 1.5e-7 over the first
// 10 steps and within 2.4e-6 over the 200 (accumulation 2, weight decay 0),
// which the 2e-6 this test once asserted did not allow (docs/algorithms.md).
// A difference in what the step computes is far larger: decaying biases and
// LayerNorm weights too (optimizer.decay_biases_and_norms, weight decay 0.1)
// parts the curves by 2.5e-5 within 10 steps and 1.9e-2 by step 128.
constexpr int kEarlySteps = 10;
constexpr double kEarlyTolerance = 1e-6, kTolerance = 1e-5;

struct Case {
  int64_t accum;
  double weight_decay;
};

std::string case_name(const Case& c) {
  return "accum" + std::to_string(c.accum) + (c.weight_decay > 0 ? "_decay" : "_nodecay");
}

/// A number of spec.json as YAML reads it back exactly (JSON's shortest round-trip form).
std::string json_number(const nlohmann::json& v) { return v.dump(); }

/// Anvil's run of the spec: every setting the Trainer got, read from spec.json.
std::vector<double> anvil_losses(const nlohmann::json& s, const std::string& name) {
  const auto yaml =
      "algorithm: sft\nmodel:\n  from: " + s["model"].get<std::string>() +
      "\ntokenizer:\n  type: sentencepiece\n  path: " + s["tokenizer"].get<std::string>() +
      "\ndata:\n  train:\n    - path: " + s["data"].get<std::string>() +
      "\n  template: plain\n  max_length: " + std::to_string(s["max_length"].get<int64_t>()) +
      "\n  shuffle: false\n"
      "optimizer:\n  lr: " +
      json_number(s["lr"]) + "\n  betas: [" + json_number(s["betas"][0]) + ", " + json_number(s["betas"][1]) +
      "]\n  eps: " + json_number(s["eps"]) + "\n  weight_decay: " + json_number(s["weight_decay"]) +
      "\nschedule:\n  warmup_steps: " + std::to_string(s["warmup"].get<int64_t>()) +
      "\n  decay: cosine\n  min_lr_ratio: 0.0\n"
      "train:\n  max_steps: " +
      std::to_string(kSteps) + "\n  micro_batch_size: " + std::to_string(s["micro_batch"].get<int64_t>()) +
      "\n  grad_accum_steps: " + std::to_string(s["accum"].get<int64_t>()) +
      "\n  grad_clip: " + json_number(s["max_grad_norm"]) +
      "\n  log_every: 1\n  save_every: 1000\n  eval_every: 0\n  threads: 1\n";
  TempDir run_dir;
  std::string log;
  EXPECT_EQ(anvil::testing::train_in(run_dir, yaml, "", &log), 0) << log;
  std::vector<double> out;
  for (const auto& [step, loss] : anvil::testing::read_losses(run_dir / "out" / "metrics.jsonl")) out.push_back(loss);
  EXPECT_EQ(out.size(), static_cast<size_t>(kSteps)) << name << "\n" << log;
  return out;
}

class TrainerParity : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerParity, SftLossCurveEqualsTransformersTrainer) {
  const auto c = GetParam();
  // The Trainer's runs of every case, made once per ctest run by the ParityReferences.Trainer fixture
  // (tests/CMakeLists.txt); a test run alone makes its own case's.
  const anvil::testing::ReferenceFolder refs("ANVIL_TRAINER_REFERENCES", "trainer_reference.py", case_name(c));
  ASSERT_TRUE(refs.ok()) << refs.log();
  const auto dir = refs / case_name(c);
  const auto s = nlohmann::json::parse(anvil::testing::read_text(dir / "spec.json"));
  ASSERT_EQ(s["accum"].get<int64_t>(), c.accum);
  ASSERT_EQ(s["weight_decay"].get<double>(), c.weight_decay);
  ASSERT_EQ(s["steps"].get<int64_t>(), kSteps);
  ASSERT_EQ(s["schedule"].get<std::string>(), "cosine");  // Anvil's decay: cosine to 0 (min_lr_ratio 0)
  const auto ref = nlohmann::json::parse(anvil::testing::read_text(dir / "ref.json"));
  const auto want = ref["losses"].get<std::vector<double>>();
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  // The parameters the Trainer leaves undecayed are the ones Anvil does.
  config::OptimizerConfig opt;
  opt.weight_decay = c.weight_decay;
  auto model = checkpoint::load_model_dir(s["model"].get<std::string>());
  auto ours = optim::no_decay_parameters(opt, *model);
  std::sort(ours.begin(), ours.end());
  EXPECT_EQ(ours, ref["not_decayed"].get<std::vector<std::string>>());

  const auto got = anvil_losses(s, case_name(c));
  ASSERT_EQ(got.size(), want.size());
  // The first losses differ by float32 round-off already (the order of the
  // token sums): 5.6e-7 of 5.78 on a Zen 3.
  double worst = 0, worst_early = 0;
  size_t at = 0, at_early = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    if (d > worst) worst = d, at = i;
    if (i < kEarlySteps && d > worst_early) worst_early = d, at_early = i;
  }
  std::cout << "[trainer parity] accum " << c.accum << ", weight decay " << c.weight_decay << ": first loss "
            << got.front() << " (Trainer " << want.front() << "), last " << got.back() << " (Trainer " << want.back()
            << "), largest relative difference " << worst_early << " in the first " << kEarlySteps << " steps, "
            << worst << " in all (step " << at + 1 << ")\n";
  EXPECT_LE(worst_early, kEarlyTolerance)
      << "step " << at_early + 1 << ": anvil " << got[at_early] << ", Trainer " << want[at_early];
  EXPECT_LE(worst, kTolerance) << "step " << at + 1 << ": anvil " << got[at] << ", Trainer " << want[at];
  // The run learns, so the comparison covers a moving model.
  EXPECT_LT(want.back(), 0.8 * want.front());
}

INSTANTIATE_TEST_SUITE_P(Steps, TrainerParity,
                         ::testing::Values(Case{1, 0.0}, Case{2, 0.0}, Case{1, 0.1}, Case{2, 0.1}),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace anvil::train
