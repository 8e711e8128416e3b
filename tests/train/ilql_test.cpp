// ILQL: the loss terms, the Polyak update and the shaped scores against an
// independent Python reference (tests/parity/ilql_reference.py, from trlx's
// definitions), batch masks, bad records, and runs from the quickstart SFT
// checkpoint (the ctest fixture): learning, resume after SIGKILL, two
// full_shard ranks, bf16 with activation checkpointing, and sampling from
// the CLI.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "data/datasets.h"
#include "io/safetensors.h"
#include "anvil/models/registry.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/ilql.h"
#include "test_util.h"
#include "train/objectives/ilql/ilql_data.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

const nlohmann::json& reference() {
  static const nlohmann::json cases = anvil::testing::python_reference("ilql_reference.py");
  return cases;
}

at::Tensor tensor(const nlohmann::json& t, at::ScalarType type = at::kDouble) {
  const auto shape = t["shape"].get<std::vector<int64_t>>();
  if (type == at::kLong) return at::tensor(t["data"].get<std::vector<int64_t>>(), at::kLong).view(shape);
  return at::tensor(t["data"].get<std::vector<double>>(), at::kDouble).view(shape);
}

double value(const at::Tensor& t) { return t.item<double>(); }

TEST(IlqlFormulas, LossTermsMatchTheReference) {
  const auto& cases = reference()["loss_cases"];
  ASSERT_GE(cases.size(), 3u);
  for (const auto& c : cases) {
    const auto& in = c["inputs"];
    const auto& o = c["options"];
    const bool two = o["two_qs"].get<bool>();
    std::vector<at::Tensor> qs{tensor(in["q1"])}, tqs{tensor(in["tq1"])};
    if (two) qs.push_back(tensor(in["q2"])), tqs.push_back(tensor(in["tq2"]));
    const IlqlLossOptions opt{o["tau"].get<double>(), o["gamma"].get<double>(), o["cql_scale"].get<double>(),
                              o["awac_scale"].get<double>(), o["beta"].get<double>()};
    const auto t = ilql_loss_sums(tensor(in["logits"]), qs, tqs, tensor(in["vs"]), tensor(in["actions"], at::kLong),
                                  tensor(in["rewards"]), tensor(in["dones"], at::kLong), opt);
    const auto& out = c["outputs"];
    const double n = value(t.count);
    const std::string name = c["name"];
    EXPECT_EQ(n, out["n_nonterminal"].get<double>()) << name;
    EXPECT_NEAR(value(t.loss) / n, out["loss"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(value(t.q) / n, out["loss_q"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(value(t.v) / n, out["loss_v"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(value(t.cql) / n, out["loss_cql"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(value(t.awac) / n, out["loss_awac"].get<double>(), 1e-6) << name;
    const auto& st = c["stats"];
    auto mean_std = [&](const std::string& key) {
      const double mean = value(t.stats.at(key).first) / n;
      return std::make_pair(mean, std::sqrt(std::max(0.0, value(t.stats.at(key).second) / n - mean * mean)));
    };
    EXPECT_NEAR(mean_std("v").first, st["values/mean"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(mean_std("v").second, st["values/std"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(mean_std("q0").first, st["qvalues/0/mean"].get<double>(), 1e-6) << name;
    if (two) EXPECT_NEAR(mean_std("q1").first, st["qvalues/1/mean"].get<double>(), 1e-6) << name;
    EXPECT_NEAR(mean_std("awac_weight").first, st["awac_weight/mean"].get<double>(), 1e-6) << name;
  }
}

TEST(IlqlFormulas, PolyakUpdateAndShapedScoresMatchTheReference) {
  for (const auto& c : reference()["polyak_cases"]) {
    const double alpha = c["alpha"].get<double>();
    for (size_t k = 0; k < c["q"].size(); ++k) {
      auto target = tensor(c["target"][k]);
      for (int s = 0; s < c["steps"].get<int>(); ++s) target = polyak(target, tensor(c["q"][k]), alpha);
      EXPECT_LE((target - tensor(c["new_target"][k])).abs().max().item<double>(), 1e-12) << alpha;
    }
  }
  for (const auto& c : reference()["score_cases"]) {
    std::vector<at::Tensor> tqs{tensor(c["tq1"])};
    if (c["two_qs"].get<bool>()) tqs.push_back(tensor(c["tq2"]));
    const auto scores = ilql_shaped_scores(tensor(c["logits"]), tqs, tensor(c["v"]), c["beta"].get<double>());
    EXPECT_LE((scores - tensor(c["scores"])).abs().max().item<double>(), 1e-6) << c["beta"];
  }
}

/// offline_rl records read with the bundled tokenizer.
data::OfflineRlDataset offline(const TempDir& dir, const std::vector<std::string>& lines) {
  const auto path = dir / "data.jsonl";
  std::ofstream f(path);
  for (const auto& l : lines) f << l << "\n";
  f.close();
  auto tok = tokenizer::load_tokenizer("sentencepiece", anvil::testing::source_dir() + "/data/tokenizer.model");
  data::ReadOptions o;
  o.chat = &chat::ChatTemplate::get("plain");
  return data::OfflineRlDataset::load(path, *tok, o);
}

// Only response tokens (and their end of turn) are actions; prompts and
// padding carry no Q, V, CQL or AWAC term: the loss's gradient there is zero.
TEST(IlqlData, OnlyResponseTokensCarryTermsAndPaddingNever) {
  TempDir dir;
  const auto ds = offline(dir, {R"({"prompt": "upper: ab\n", "response": "AB", "reward": 1})",
                                R"({"prompt": "upper: abcdef\n", "response": "abcdef", "reward": 0})",
                                R"({"prompt": "x\n", "response": "yz", "rewards": [0.5, 0, 1]})"});
  ASSERT_EQ(ds.size(), 3);
  const auto b = collate_offline({&ds[0], &ds[1], &ds[2]}, /*pad_id=*/0, /*mean=*/0.5, /*scale=*/2.0);
  const auto& t = b.tensors;
  const auto A = t.at("actions").size(1);
  int64_t expected_targets = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const auto& s = ds[i];
    std::vector<int64_t> response;  // the labelled tokens
    for (size_t k = 0; k < s.labels.size(); ++k)
      if (s.labels[k] != chat::kIgnoreIndex) response.push_back(static_cast<int64_t>(k));
    const auto n = static_cast<int64_t>(response.size());
    expected_targets += n;
    for (int64_t j = 0; j < A; ++j) {
      const bool action = j < n;
      EXPECT_EQ(t.at("dones")[i][j].item<float>(), action ? 1.f : 0.f) << i << " " << j;
      if (!action) continue;
      const auto pos = response[static_cast<size_t>(j)];
      EXPECT_EQ(t.at("states")[i][j].item<int64_t>(), pos - 1);
      EXPECT_EQ(t.at("actions")[i][j].item<int64_t>(), s.input_ids[static_cast<size_t>(pos)]);
    }
    EXPECT_EQ(t.at("dones")[i][n].item<float>(), 0.f);
    EXPECT_EQ(t.at("states")[i][n].item<int64_t>(), response.back());
  }
  EXPECT_EQ(b.num_targets, expected_targets);
  // Rewards: (r - mean) * scale on the last action; per-token ones scaled, the mean off the last.
  const auto r = t.at("rewards");
  const int64_t n0 = static_cast<int64_t>(t.at("dones")[0].sum().item<float>());
  EXPECT_FLOAT_EQ(r[0][n0 - 1].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(r[0].sum().item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(r[2][0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(r[2][2].item<float>(), 2.0f - 1.0f);

  // Gradients of the loss vanish wherever dones[:, :-1] is 0.
  const int64_t V = 11;
  at::manual_seed(0);
  auto logits = at::randn({3, A, V}, at::kDouble).requires_grad_(true);
  auto q = at::randn({3, A, V}, at::kDouble).requires_grad_(true);
  auto vs = at::randn({3, A + 1}, at::kDouble).requires_grad_(true);
  const auto actions = t.at("actions").remainder(V);
  const auto terms = ilql_loss_sums(logits, {q}, {at::randn({3, A, V}, at::kDouble)}, vs, actions, r.to(at::kDouble),
                                    t.at("dones"), {});
  const auto grads = torch::autograd::grad({terms.loss}, {logits, q, vs});
  const auto m = t.at("dones").narrow(1, 0, A).to(at::kDouble);
  EXPECT_EQ((grads[0] * (1 - m).unsqueeze(-1)).abs().sum().item<double>(), 0.0);
  EXPECT_EQ((grads[1] * (1 - m).unsqueeze(-1)).abs().sum().item<double>(), 0.0);
  // V of state j gets a gradient only from action j (its own regression):
  // V(next) is detached, so the terminal state and padding get none.
  const auto gv = grads[2].narrow(1, 0, A);
  EXPECT_EQ((gv * (1 - m)).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(grads[2].select(1, A).abs().sum().item<double>(), 0.0);
}

TEST(IlqlData, BadRecordsNameTheLine) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "x\n", "response": "yz", "rewards": [1, 2]})", "expected one number per response token"},
      {R"({"prompt": "x\n", "response": "yz", "rewards": [1, 2, 3], "reward": 1})", "not both"},
      {R"({"prompt": "x\n", "response": "yz", "rewards": []})", "non-empty list"},
      {R"({"prompt": "x\n", "response": "yz"})", "reward"},
  };
  for (const auto& [line, expected] : cases) {
    try {
      offline(dir, {R"({"prompt": "a\n", "response": "b", "reward": 1})", line});
      ADD_FAILURE() << "accepted " << line;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("data.jsonl:2"), std::string::npos) << what;
      EXPECT_NE(what.find(expected), std::string::npos) << what;
    }
  }
}

TEST(IlqlHeads, HeadsAreMlpsTargetsStartAsCopiesAndShapedScoresNeedThem) {
  config::ModelConfig mc;
  mc.family = "gpt2";
  mc.vocab_size = 50;
  mc.hidden_size = 16;
  mc.num_hidden_layers = 1;
  mc.num_attention_heads = 2;
  mc.max_position_embeddings = 16;
  auto model = models::family_by_name("gpt2").from_config(mc);
  EXPECT_THROW(ilql_score_fn(*model, 1.0), std::invalid_argument);
  add_ilql_heads(*model, true);
  ASSERT_TRUE(has_ilql_heads(*model));
  auto params = model->named_parameters();
  EXPECT_EQ(params["heads.q1.0.weight"].sizes(), at::IntArrayRef({32, 16}));
  EXPECT_EQ(params["heads.q1.2.weight"].sizes(), at::IntArrayRef({50, 32}));
  EXPECT_EQ(params["heads.v.2.weight"].sizes(), at::IntArrayRef({1, 32}));
  EXPECT_TRUE(params["heads.target_q2.2.weight"].equal(params["heads.q2.2.weight"]));
  EXPECT_FALSE(params["heads.q1.2.weight"].equal(params["heads.q2.2.weight"]));
  // The score function is log-softmax + beta (min target Q - V) on the last hidden state.
  const auto hidden = at::randn({3, 16});
  const auto logits = model->logits(hidden);
  const auto scores = ilql_score_fn(*model, 2.0)(hidden, logits);
  const auto tq = at::minimum(model->head("target_q1", hidden), model->head("target_q2", hidden));
  const auto expected = logits.log_softmax(-1) + 2.0 * (tq - model->head("v", hidden));
  EXPECT_LE((scores - expected).abs().max().item<double>(), 1e-5);
}

// ---- runs from the quickstart SFT checkpoint (the ctest fixture) ----

using anvil::testing::fixture_checkpoint;

/// configs/ilql_tiny.yaml from the fixture with `extra` overrides.
std::string ilql_run(const stdfs::path& out, const std::string& extra, int ranks = 0) {
  std::string log;
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::mpirun(ranks) +
                   anvil::testing::trainer_bin() + " --config configs/ilql_tiny.yaml output_dir=" + out.string() +
                   " model.from=" + fixture_checkpoint().string() + " train.threads=1 " + extra +
                   anvil::testing::seed_override() + " 2>&1";
  EXPECT_EQ(run(cmd, &log), 0) << cmd << "\n" << log;
  return log;
}

double eval_reward(const stdfs::path& eval_json) {
  return nlohmann::json::parse(anvil::testing::read_text(eval_json))["metrics"]["eval/reward"].get<double>();
}

// Logged data right a third of the time: sampling the trained heads at
// ilql.beta beats both beta = 0 (imitation) and the data's own mean reward.
TEST(IlqlRuns, ShapedSamplingBeatsTheDataAndBetaZeroAndResumesExactly) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string common = "train.eval_every=300 train.save_every=100 train.log_every=1";
  ilql_run(dir / "run", common);
  const auto a = anvil::testing::metrics_by_step(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 300u);
  for (const char* key : {"losses/loss", "losses/loss_q", "losses/loss_v", "losses/loss_cql", "losses/loss_awac",
                          "values/mean", "qvalues/0/mean", "qvalues/1/mean", "advantages/mean"})
    EXPECT_TRUE(a.at(1).contains(key)) << key;
  const double shaped = a.at(300)["eval/reward"].get<double>();
  ilql_run(dir / "run", "--eval-only ilql.beta=0");
  const double plain = eval_reward(dir / "run" / "eval-step-300.json");
  double data_mean = 0, n = 0;
  std::ifstream f(anvil::testing::source_dir() + "/data/ilql_train.jsonl");
  for (std::string line; std::getline(f, line); n += 1)
    data_mean += nlohmann::json::parse(line)["reward"].get<double>();
  data_mean /= n;
  std::cout << "[ilql upper] held-out mean reward: data " << data_mean << ", beta 0 " << plain << ", beta 4 " << shaped
            << "\n";
  anvil::testing::record_figure("reward over beta 0", shaped - plain, 0.0, 0.15);
  anvil::testing::record_figure("reward over the data's mean", shaped - data_mean, 0.0, 0.15);
  EXPECT_GE(shaped, plain + 0.15);
  EXPECT_GE(shaped, data_mean + 0.15);
  if (anvil::testing::sweeping()) return;

  // The heads sit beside the HF folder, targets included.
  const auto heads = nlohmann::json::parse(anvil::testing::read_text(dir / "run" / "checkpoint-300" / "heads.json"));
  for (const char* h : {"q1", "q2", "target_q1", "target_q2", "v"}) EXPECT_TRUE(heads["heads"].contains(h)) << h;

  // SIGKILL after checkpoint-200, then resume: the same losses and the same target heads.
  const auto out = dir / "killed";
  const auto cmd = anvil::testing::trainer_bin() + " --config configs/ilql_tiny.yaml output_dir=" + out.string() +
                   " model.from=" + fixture_checkpoint().string() + " train.threads=1 " + common;
  std::string log;
  ASSERT_EQ(anvil::testing::kill_after_checkpoint(cmd, dir / "killed.log", out / "checkpoint-200", &log), 0) << log;
  ASSERT_FALSE(stdfs::exists(out / "checkpoint-300")) << "the run ended before it was killed";
  ilql_run(out, common);
  const auto b = anvil::testing::metrics_by_step(out / "metrics.jsonl");
  ASSERT_EQ(b.size(), 300u);
  for (const auto& [step, m] : a)
    for (const char* key : {"loss", "losses/loss_q", "losses/loss_v", "grad_norm", "eval/reward"}) {
      if (!m.contains(key)) continue;
      ASSERT_TRUE(b.at(step).contains(key)) << step << " " << key;
      EXPECT_EQ(m[key].get<double>(), b.at(step)[key].get<double>()) << "step " << step << " " << key;
    }
  io::SafetensorsFile x(dir / "run" / "checkpoint-300" / "heads.safetensors"),
      y(out / "checkpoint-300" / "heads.safetensors");
  for (const auto& name : x.names()) EXPECT_TRUE(x.get(name).equal(y.get(name))) << name;
}

// Two full_shard ranks give one process's losses; bf16 with activation
// checkpointing trains too (losses close to float32's).
TEST(IlqlRuns, TwoShardedRanksMatchOneProcessAndBf16Trains) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const std::string common =
      "train.max_steps=12 train.eval_every=12 train.save_every=12 train.log_every=1 train.micro_batch_size=16";
  ilql_run(dir / "one", common);
  const auto log = ilql_run(dir / "two", common + " dist.sharding=full_shard", 2);
  ilql_run(dir / "bf16", common + " dist.param_dtype=bfloat16 train.activation_checkpointing=true");
  const auto a = anvil::testing::metrics_by_step(dir / "one" / "metrics.jsonl"),
             b = anvil::testing::metrics_by_step(dir / "two" / "metrics.jsonl"),
             c = anvil::testing::metrics_by_step(dir / "bf16" / "metrics.jsonl");
  ASSERT_EQ(b.size(), 12u) << log;
  ASSERT_EQ(c.size(), 12u);
  // The ranks sum the gradients in another order, and AdamW turns the round-off of the smallest
  // gradient entries into whole updates, so the runs part as they go: on a Zen 4 (AVX-512) the
  // gradient norm of step 8 differed by 8.6e-5 of 7.2 and the losses by 3.2e-6, where the first
  // step's loss was equal and its norm 8e-7 apart. The losses keep the 1e-5 of the other two-rank
  // comparisons.
  for (const auto& [step, m] : a) {
    for (const char* key : {"loss", "losses/loss_q", "losses/loss_v", "losses/loss_awac", "grad_norm"}) {
      const double u = m[key].get<double>(), v = b.at(step)[key].get<double>();
      const double tolerance = std::string(key) == "grad_norm" ? 1e-3 : 1e-5;
      EXPECT_LE(std::abs(u - v), tolerance * std::max(1.0, std::abs(u))) << "step " << step << " " << key;
    }
    const double u = m["loss"].get<double>(), w = c.at(step)["loss"].get<double>();
    EXPECT_LE(std::abs(u - w), 0.05 * std::max(1.0, std::abs(u))) << "bf16, step " << step;
  }
  EXPECT_EQ(a.at(12)["eval/reward"].get<double>(), b.at(12)["eval/reward"].get<double>());
  // The two-rank checkpoint holds the same heads, targets included.
  io::SafetensorsFile x(dir / "one" / "checkpoint-12" / "heads.safetensors"),
      y(dir / "two" / "checkpoint-12" / "heads.safetensors");
  // 3.2e-5 apart at most on the Zen 4 (heads.v.0.weight); AdamW moves a weight by about lr (3e-4) a step.
  for (const auto& name : x.names()) EXPECT_LE((x.get(name) - y.get(name)).abs().max().item<double>(), 2e-4) << name;
}

// anvil generate --ilql-beta samples a checkpoint's heads; a model without them is refused.
TEST(IlqlRuns, GenerateTakesIlqlBeta) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  ilql_run(dir / "run", "train.max_steps=20 train.eval_every=0 train.save_every=20");
  std::string log;
  const auto gen = anvil::testing::cli_bin() + " generate --model ";
  const std::string flags = " --prompt 'upper: abc\n' --temperature 1 --top-k 20 --seed 1 --max-new-tokens 8";
  ASSERT_EQ(run(gen + (dir / "run" / "checkpoint-20").string() + flags + " --ilql-beta 4 2>&1", &log), 0) << log;
  EXPECT_NE(log.find("\"generated\""), std::string::npos) << log;
  EXPECT_NE(run(gen + fixture_checkpoint().string() + flags + " --ilql-beta 4 2>&1", &log), 0);
  EXPECT_NE(log.find("no ILQL heads"), std::string::npos) << log;
}

}  // namespace
}  // namespace anvil::train
