// Anvil's DPO (dpo.loss_type: sigmoid), ORPO (orpo) and KTO (kto.loss_type:
// kto and apo_zero_unpaired) follow TRL 1.16's own DPOTrainer, ORPOTrainer and
// KTOTrainer step
// for step: from the same weights (a random tiny GPT-2), the same rows in the
// same order (data.shuffle: false; TRL's sequential sampler) and the same
// settings, with gradient accumulation and max_length cutting a third of the
// replies, the loss and every metric TRL logs (but the few each test names,
// with why) agree at each of 100 steps.
// tests/parity/trl_reference.py runs TRL itself (installed into .venv/trl by
// scripts/setup.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

constexpr int kSteps = 100;
// Relative to max(1, |value|): both sum in float32 in different orders (the
// fused head's chunks against whole logits, ATen's vector widths), so round-off
// parts them a little and the parting grows as the models move.
constexpr double kTolerance = 1e-5;

std::string json_number(const nlohmann::json& v) { return v.dump(); }

/// Anvil's run of a spec.json: every setting TRL got.
std::string anvil_yaml(const nlohmann::json& s) {
  const std::string algo = s["algorithm"];
  std::string yaml =
      "algorithm: " + algo + "\nmodel:\n  from: " + s["model"].get<std::string>() +
      "\ntokenizer:\n  path: " + s["tokenizer"].get<std::string>() +
      "\ndata:\n  train:\n    - path: " + s["data"].get<std::string>() +
      "\n  template: " + s["template"].get<std::string>() + "\n  max_length: " + json_number(s["max_length"]) +
      "\n  shuffle: false\n" + "optimizer:\n  lr: " + json_number(s["lr"]) + "\n  betas: [" +
      json_number(s["betas"][0]) + ", " + json_number(s["betas"][1]) + "]\n  eps: " + json_number(s["eps"]) +
      "\n  weight_decay: " + json_number(s["weight_decay"]) +
      "\nschedule:\n  warmup_steps: " + json_number(s["warmup"]) +
      "\n  decay: cosine\n  min_lr_ratio: 0.0\ntrain:\n  max_steps: " + json_number(s["steps"]) +
      "\n  micro_batch_size: " + json_number(s["micro_batch"]) + "\n  grad_accum_steps: " + json_number(s["accum"]) +
      "\n  grad_clip: " + json_number(s["max_grad_norm"]) + "\n  log_every: 1\n  save_every: 1000\n  eval_every: 0\n" +
      "  threads: 1\n";
  if (algo == "dpo")
    yaml += "dpo:\n  loss_type: " + s["loss_type"].get<std::string>() + "\n  beta: " + json_number(s["beta"]) +
            "\n  orpo_nll: prompt_and_reply\n";
  else
    yaml += "kto:\n  loss_type: " + s["loss_type"].get<std::string>() + "\n  beta: " + json_number(s["beta"]) +
            "\n  desirable_weight: " + json_number(s["desirable_weight"]) +
            "\n  undesirable_weight: " + json_number(s["undesirable_weight"]) + "\n";
  return yaml;
}

/// metrics.jsonl's training lines by step.
std::map<int64_t, nlohmann::json> step_lines(const stdfs::path& metrics) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("step") && j.contains("loss")) out[j["step"].get<int64_t>()] = j;
  }
  return out;
}

/// Anvil's name for a name TRL logs: the same, but for the Trainer's learning_rate (lr).
std::string anvil_name(const std::string& trl) { return trl == "learning_rate" ? "lr" : trl; }

/// Runs the case and compares every step's loss and every metric TRL logged
/// (ref.json's names, read from TRL's own log lines: the list is TRL's, not
/// ours) but those in `not_logged`, each of which says why Anvil does not log
/// it. A TRL null, a step where TRL logged nothing, must be absent.
void follows_trl(const std::string& case_name, const std::map<std::string, std::string>& not_logged) {
  const anvil::testing::ReferenceFolder refs("ANVIL_TRL_REFERENCES", "trl_reference.py", case_name);
  ASSERT_TRUE(refs.ok()) << refs.log();
  const auto s = nlohmann::json::parse(anvil::testing::read_text(refs / case_name / "spec.json"));
  const auto ref = nlohmann::json::parse(anvil::testing::read_text(refs / case_name / "ref.json"));
  ASSERT_EQ(s["steps"].get<int>(), kSteps);
  ASSERT_GT(ref["truncated_rows"].get<int64_t>(), 0);  // max_length cuts rows: the truncation rules are compared
  std::vector<std::string> names;
  for (auto it = ref["metrics"].begin(); it != ref["metrics"].end(); ++it)
    if (it.key() != "loss" && !not_logged.count(it.key())) names.push_back(it.key());
  for (const auto& [name, why] : not_logged)
    EXPECT_TRUE(ref["metrics"].contains(name)) << case_name << ": TRL no longer logs " << name << " (" << why << ")";
  ASSERT_GE(names.size(), 6u) << ref["metrics"].dump();
  TempDir run_dir;
  std::string log;
  ASSERT_EQ(anvil::testing::train_in(run_dir, anvil_yaml(s), "", &log), 0) << log;
  const auto got = step_lines(run_dir / "out" / "metrics.jsonl");
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << log;
  const auto want_loss = ref["losses"].get<std::vector<double>>();
  std::map<std::string, std::pair<double, int64_t>> worst;  // name -> (difference, step)
  // The implicit rewards are beta x a difference of summed log-probs: their round-off is that of the sums, so
  // they are compared relative to beta x the step's largest mean log-prob (TRL's) when that is larger.
  const double beta = s["beta"].get<double>();
  const auto scale_of = [&](const std::string& name, int64_t step, double b) {
    double scale = std::max(1.0, std::abs(b));
    if (name.rfind("rewards/", 0) == 0 && name != "rewards/accuracies")
      for (const char* logps : {"logps/chosen", "logps/rejected"})
        if (const auto& v = ref["metrics"][logps][static_cast<size_t>(step - 1)]; v.is_number())
          scale = std::max(scale, beta * std::abs(v.get<double>()));
    return scale;
  };
  auto compare = [&](const std::string& name, int64_t step, double a, double b) {
    const double d = std::abs(a - b) / scale_of(name, step, b);
    auto& w = worst[name];
    if (d >= w.first) w = {d, step};
    EXPECT_LE(d, kTolerance) << case_name << " step " << step << " " << name << ": anvil " << a << ", TRL " << b;
  };
  for (int64_t step = 1; step <= kSteps; ++step) {
    const auto& line = got.at(step);
    compare("loss", step, line["loss"].get<double>(), want_loss[static_cast<size_t>(step - 1)]);
    for (const auto& name : names) {
      const auto& want = ref["metrics"][name][static_cast<size_t>(step - 1)];
      const auto ours = anvil_name(name);
      if (want.is_null()) {
        EXPECT_FALSE(line.contains(ours)) << case_name << " step " << step << ": TRL logs no " << name;
        continue;
      }
      ASSERT_TRUE(line.contains(ours)) << case_name << " step " << step << ": no " << ours << " (TRL's " << name
                                       << ") in " << line.dump();
      compare(name, step, line[ours].get<double>(), want.get<double>());
    }
  }
  std::cout << "[trl parity] " << case_name << ": loss " << got.at(1)["loss"] << " -> " << got.at(kSteps)["loss"]
            << " (TRL " << want_loss.front() << " -> " << want_loss.back() << "); largest relative differences:";
  for (const auto& [name, w] : worst) std::cout << " " << name << " " << w.first << " (step " << w.second << ")";
  std::cout << "\n";
  // The curve moves, so the comparison covers a changing model.
  EXPECT_GT(std::abs(want_loss.back() - want_loss.front()), 0.05);
}

// ORPOTrainer's logits/chosen and logits/rejected average the logits over
// every vocabulary entry at every position of the padded rows, the padding's
// included: a figure of how its model masks padding, which Anvil's forward
// (right padding that no real token attends to) does not reproduce; its DPO
// and KTO trainers average over the completions' tokens, as Anvil's kto does.
const std::map<std::string, std::string> kOrpoNotLogged{{"logits/chosen", "TRL's mean over padded positions"},
                                                        {"logits/rejected", "TRL's mean over padded positions"}};

// DPO (sigmoid) against the initial weights, as DPOTrainer builds its
// reference when given none: every name it logs, its token statistics
// (entropy, logits/*, mean_token_accuracy) included.
TEST(TrlParity, DpoFollowsTrlsDpoTrainer) { follows_trl("dpo", {}); }

TEST(TrlParity, OrpoFollowsTrlsOrpoTrainer) { follows_trl("orpo", kOrpoNotLogged); }

TEST(TrlParity, KtoFollowsTrlsKtoTrainer) { follows_trl("kto", {}); }

// kto.loss_type: apo_zero_unpaired, TRL's unpaired APO-zero: no KL rows, kl logged as 0.
TEST(TrlParity, KtoApoZeroUnpairedFollowsTrlsKtoTrainer) { follows_trl("kto_apo", {}); }

}  // namespace
}  // namespace anvil::train
