// Reward-model and DPO objectives: formula parity with an independent Python
// reference (tests/parity/preference_reference.py, TRL's and Open-Assistant's
// published definitions), log-prob masking, the HF sequence-classification
// export, precomputed vs in-process reference, and learning on the bundled
// preference data from the quickstart SFT checkpoint (the ctest fixture).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/checkpoint/hf_model.h"
#include "anvil/models/registry.h"
#include "anvil/train/preference.h"
#include "train/objectives/preference/preference_data.h"
#include "test_util.h"
#include "data/datasets.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

nlohmann::json reference_cases() {
  static const nlohmann::json cases = anvil::testing::python_reference("preference_reference.py");
  return cases;
}

std::vector<int64_t> longs(const at::Tensor& t) {
  auto c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

at::Tensor doubles(const nlohmann::json& j) { return at::tensor(j.get<std::vector<double>>(), at::kDouble); }

void expect_close(const at::Tensor& ours, const nlohmann::json& ref, const std::string& what) {
  const auto r = doubles(ref);
  ASSERT_EQ(ours.numel(), r.numel()) << what;
  EXPECT_LE((ours.to(at::kDouble) - r).abs().max().item<double>(), 1e-6) << what;
}

TEST(PreferenceFormulas, DpoLossesAndMetricsMatchTheReference) {
  const auto cases = reference_cases()["dpo"];
  ASSERT_EQ(cases.size(), 9u);
  for (const auto& c : cases) {
    const DpoLossOptions opt{*kDpoLosses.find(c["loss_type"].get<std::string>()), c["beta"], c["label_smoothing"]};
    SCOPED_TRACE(anvil::concat(kDpoLosses.name(opt.loss_type), " beta ", opt.beta, " eps ", opt.label_smoothing));
    const auto lc = at::tensor(c["chosen_lengths"].get<std::vector<int64_t>>(), at::kLong);
    const auto lr = at::tensor(c["rejected_lengths"].get<std::vector<int64_t>>(), at::kLong);
    auto pc = dpo_logps(doubles(c["policy_chosen_logps"]), lc, opt.loss_type);
    auto pr = dpo_logps(doubles(c["policy_rejected_logps"]), lr, opt.loss_type);
    auto rc = dpo_logps(doubles(c["ref_chosen_logps"]), lc, opt.loss_type);
    auto rr = dpo_logps(doubles(c["ref_rejected_logps"]), lr, opt.loss_type);
    const auto out = dpo_loss(pc, pr, rc, rr, opt);
    expect_close(out.losses, c["losses"], "losses");
    expect_close(out.chosen_rewards, c["chosen_rewards"], "chosen_rewards");
    expect_close(out.rejected_rewards, c["rejected_rewards"], "rejected_rewards");
    // Metrics through the step reduction, split over two micro-batches.
    Sums sums;
    const auto n = pc.size(0);
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 5}, {5, n}}) {
      auto part = dpo_loss(pc.slice(0, a, b), pr.slice(0, a, b), rc.slice(0, a, b), rr.slice(0, a, b), opt);
      add_dpo_sums(part, pc.slice(0, a, b), pr.slice(0, a, b), sums);
    }
    const auto m = dpo_metrics(sums);
    for (const auto& [k, v] : c["metrics"].items()) {
      if (k == "loss") {
        EXPECT_NEAR(out.losses.mean().item<double>(), v.get<double>(), 1e-6);
        continue;
      }
      ASSERT_TRUE(m.count(k)) << k;
      EXPECT_NEAR(m.at(k), v.get<double>(), 1e-6) << k;
    }
  }
}

TEST(PreferenceFormulas, ReferenceFreeLossesMatchTheReference) {
  const auto cases = reference_cases()["reference_free"];
  ASSERT_EQ(cases.size(), 6u);
  for (const auto& c : cases) {
    const DpoLossOptions opt{*kDpoLosses.find(c["loss_type"].get<std::string>()), c["beta"], c["label_smoothing"],
                             c["simpo_gamma"]};
    SCOPED_TRACE(anvil::concat(kDpoLosses.name(opt.loss_type), " beta ", opt.beta, " eps ", opt.label_smoothing));
    ASSERT_TRUE(reference_free(opt.loss_type));
    const auto lc = at::tensor(c["chosen_lengths"].get<std::vector<int64_t>>(), at::kLong);
    const auto lr = at::tensor(c["rejected_lengths"].get<std::vector<int64_t>>(), at::kLong);
    const auto sum_c = doubles(c["policy_chosen_logps"]);
    auto pc = dpo_logps(sum_c, lc, opt.loss_type);
    auto pr = dpo_logps(doubles(c["policy_rejected_logps"]), lr, opt.loss_type);
    const auto out = dpo_loss(pc, pr, {}, {}, opt);  // no reference log-probs at all
    expect_close(out.losses, c["losses"], "losses");
    expect_close(out.chosen_rewards, c["chosen_rewards"], "chosen_rewards");
    expect_close(out.rejected_rewards, c["rejected_rewards"], "rejected_rewards");
    // The objective's per-pair total: the NLL of the chosen reply's mean token.
    const double w = c["nll_weight"];
    expect_close(out.losses - w * (sum_c / lc.to(at::kDouble)), c["total_losses"], "total_losses");
    Sums sums;
    const auto n = pc.size(0);
    for (auto [a, b] : {std::pair<int64_t, int64_t>{0, 7}, {7, n}}) {
      auto part = dpo_loss(pc.slice(0, a, b), pr.slice(0, a, b), {}, {}, opt);
      add_dpo_sums(part, pc.slice(0, a, b), pr.slice(0, a, b), sums);
    }
    const auto m = dpo_metrics(sums);
    for (const auto& [k, v] : c["metrics"].items()) {
      ASSERT_TRUE(m.count(k)) << k;
      EXPECT_NEAR(m.at(k), v.get<double>(), 1e-6) << k;
    }
  }
}

TEST(PreferenceFormulas, RewardLossesAndMetricsMatchTheReference) {
  const auto cases = reference_cases()["reward"];
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& c : cases) {
    std::vector<double> flat;
    std::vector<int64_t> per;
    std::vector<std::optional<double>> margins;
    for (const auto& g : c["groups"]) {
      for (const auto& r : g) flat.push_back(r.get<double>());
      per.push_back(static_cast<int64_t>(g.size()));
    }
    for (const auto& m : c["margins"]) margins.push_back(m.is_null() ? std::nullopt : std::optional<double>(m));
    const auto rewards = at::tensor(flat, at::kDouble);
    const auto pairs = ranking_pairs(per, margins);
    const double coef = c["center_rewards_coefficient"];
    const double loss = ranking_loss_sum(rewards, pairs, coef).item<double>() / static_cast<double>(per.size());
    EXPECT_NEAR(loss, c["loss"].get<double>(), 1e-6);
    Sums sums;
    add_ranking_sums(rewards, pairs, sums);
    for (const auto& [k, v] : c["metrics"].items())
      EXPECT_NEAR(ranking_metrics(sums).at(k), v.get<double>(), 1e-6) << k;
  }
}

TEST(PreferenceLogps, OnlyReplyTokensCount) {
  data::PreferenceSample a, b;
  a.prompt_ids = {5, 6, 7};
  a.replies = {{8, 9, 2}, {10, 2}};
  b.prompt_ids = {5};
  b.replies = {{11, 12, 13, 14, 2}, {9, 2}};
  const auto batch = collate_preferences({&a, &b}, {{0, 0}, {0, 1}}, /*pad_id=*/3);
  const auto& ids = batch.tensors.at("input_ids");
  const auto& labels = batch.tensors.at("labels");
  ASSERT_EQ(ids.sizes(), at::IntArrayRef({4, 6}));
  EXPECT_EQ(batch.num_targets, 2);
  at::manual_seed(0);
  auto logits = at::randn({4, 6, 16}, at::kFloat);
  const auto [sums, counts] = sequence_logps(logits, labels);
  EXPECT_EQ(longs(counts), (std::vector<int64_t>{3, 2, 5, 2}));
  // By hand: position t - 1 predicts reply token t.
  auto logp = logits.log_softmax(-1);
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> rows = {
      {{8, 9, 2}, 3}, {{10, 2}, 3}, {{11, 12, 13, 14, 2}, 1}, {{9, 2}, 1}};
  for (int64_t r = 0; r < 4; ++r) {
    double expect = 0;
    const auto& [reply, start] = rows[static_cast<size_t>(r)];
    for (size_t i = 0; i < reply.size(); ++i)
      expect += logp[r][start + static_cast<int64_t>(i) - 1][reply[i]].item<double>();
    EXPECT_NEAR(sums[r].item<double>(), expect, 1e-5) << r;
  }
  // Changing what the prompt and padding positions predict changes nothing.
  auto other = logits.clone();
  other.select(1, 0).select(0, 0).fill_(9.0);      // row 0, position 0 predicts a prompt token
  other.select(0, 3).narrow(0, 2, 4).fill_(-4.0);  // row 3's padding
  EXPECT_TRUE(at::equal(sequence_logps(other, labels).first, sums));
  // Pairs: every (better, worse) within an example.
  EXPECT_EQ(longs(batch.tensors.at("better")), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(longs(batch.tensors.at("worse")), (std::vector<int64_t>{1, 3}));
  // A ranked example of 3 replies has 3 pairs, each weighing 1/3.
  const auto k = ranking_pairs({3}, {std::nullopt});
  EXPECT_EQ(longs(k.better), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(longs(k.worse), (std::vector<int64_t>{1, 2, 2}));
  EXPECT_NEAR(k.weight[0].item<double>(), 1.0 / 3, 1e-7);
}

std::vector<nlohmann::json> metric_lines(const stdfs::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string tiny_run(const std::string& algorithm, const std::string& train, const std::string& extra = "") {
  return anvil::concat("algorithm: ", algorithm, R"(
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: )",
                       train, R"(, size: 256}], eval: [{path: data/pref_eval.jsonl}], max_length: 32}
optimizer: {lr: 1.0e-3, weight_decay: 0.0}
schedule: {warmup_steps: 1}
train: {max_steps: 4, micro_batch_size: 8, log_every: 1000, eval_every: 0, threads: 1}
eval: {generate_samples: 0, batch_size: 50, max_batches: 1}
)",
                       extra);
}

TEST(RewardModel, ExportLoadsInTransformersWithTheSameScores) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  anvil::testing::write_text(dir / "rm.yaml", tiny_run("reward", "data/pref_train.jsonl"));
  for (const std::string flavor : {"gpt2-debug", "llama-debug", "neox-debug"}) {
    SCOPED_TRACE(flavor);
    const auto run_dir = dir / ("run-" + flavor);
    ASSERT_EQ(
        run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "rm.yaml").string() +
                " --config configs/models/" + flavor + ".yaml output_dir=" + run_dir.string() + " logging.level=warn",
            &out),
        0)
        << out;
    const auto exported = dir / ("export-" + flavor);
    ASSERT_EQ(run(anvil::testing::cli_bin() + " export --checkpoint " + (run_dir / "checkpoint-4").string() +
                      " --output " + exported.string(),
                  &out),
              0)
        << out;
    // Our reload, on right-padded rows (pad 3) of different lengths.
    auto model = checkpoint::load_model_dir(exported);
    ASSERT_TRUE(model->has_score_head());
    EXPECT_EQ(model->special_tokens.pad, 3);
    model->eval();
    const std::vector<std::vector<int64_t>> rows = {{261, 262, 269, 4, 281, 283, 2, 3, 3},
                                                    {265, 270, 4, 290, 2, 3, 3, 3, 3},
                                                    {261, 263, 264, 272, 283, 281, 4, 300, 2}};
    anvil::testing::write_text(dir / "ids.json", nlohmann::json(rows).dump());
    std::vector<int64_t> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    auto ids = at::tensor(flat, at::kLong).view({3, 9});
    at::NoGradGuard no_grad;
    auto ours = model->score(model->hidden_states(ids, {}), models::last_non_pad_index(ids, 3));
    // Scores do not depend on the padding.
    auto alone = model->score(model->hidden_states(ids.slice(0, 1, 2).narrow(1, 0, 5), {}), at::tensor({4}, at::kLong));
    EXPECT_NEAR(alone.item<double>(), ours[1].item<double>(), 1e-5);
    // transformers' AutoModelForSequenceClassification on the exported folder.
    ASSERT_EQ(run(anvil::testing::python_bin() + " " + src + "/tests/parity/score_in_transformers.py " +
                      exported.string() + " " + (dir / "ids.json").string() + " " + (dir / "hf.json").string(),
                  &out),
              0)
        << out;
    const auto hf = nlohmann::json::parse(anvil::testing::read_text(dir / "hf.json"));
    EXPECT_TRUE(hf["class"].get<std::string>().ends_with("ForSequenceClassification")) << hf.dump();
    EXPECT_EQ(hf["num_labels"], 1);
    EXPECT_EQ(hf["pad_token_id"], 3);
    const auto theirs = at::tensor(hf["scores"].get<std::vector<double>>(), at::kDouble);
    EXPECT_LE((ours.to(at::kDouble) - theirs).abs().max().item<double>(), 1e-4) << hf.dump();
    EXPECT_GT(ours.abs().max().item<double>(), 1e-3);  // a real score, not zeros
    // The folder holds score.weight and no LM head.
    const auto cfg = anvil::testing::read_text(exported / "config.json");
    EXPECT_EQ(cfg.find("ForCausalLM"), std::string::npos);
  }
  // A reward model is not a language model: SFT from it is refused, with the reason.
  anvil::testing::write_text(dir / "sft.yaml", anvil::concat("model: {from: ", (dir / "export-gpt2-debug").string(),
                                                             "}\ndata: {train: [{path: data/sft_train.jsonl}]}\n"
                                                             "train: {max_steps: 1}\n"));
  EXPECT_NE(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "sft.yaml").string() +
                    " output_dir=" + (dir / "sft").string(),
                &out),
            0);
  EXPECT_NE(out.find("is a reward model"), std::string::npos) << out;
  // generate needs an LM head, which a reward model does not keep.
  EXPECT_NE(run(anvil::testing::cli_bin() + " generate --model " + (dir / "export-gpt2-debug").string() +
                    " --prompt 'add: 1+2\\n'",
                &out),
            0);
  EXPECT_NE(out.find("is a reward model"), std::string::npos) << out;
  // anvil score needs a reward model.
  ASSERT_EQ(run("cd " + src + " && " + anvil::testing::trainer_bin() +
                    " --config configs/quickstart.yaml --config configs/models/gpt2-debug.yaml output_dir=" +
                    (dir / "lm").string() +
                    " train.max_steps=1 schedule.warmup_steps=0 eval.generate_samples=0 "
                    "train.threads=1 logging.level=warn",
                &out),
            0)
      << out;
  EXPECT_NE(run(anvil::testing::cli_bin() + " score --model " + (dir / "lm" / "checkpoint-1").string() +
                    " --input data/pref_eval.jsonl 2>&1 >/dev/null",
                &out),
            0);
  EXPECT_NE(out.find("is not a reward model"), std::string::npos) << out;
}

// A LLaMA reward model (untied LM head, which its checkpoints leave out)
// resumed from step 2 continues with the uninterrupted run's losses.
TEST(RewardModel, ResumedRunMatchesTheUninterruptedOne) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  anvil::testing::write_text(dir / "rm.yaml", tiny_run("reward", "data/pref_ranked_train.jsonl"));
  auto train = [&](const std::string& name, const std::string& extra) {
    return run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "rm.yaml").string() +
                   " --config configs/models/llama-debug.yaml output_dir=" + (dir / name).string() +
                   " reward.center_rewards_coefficient=0.01 " + extra,
               &out);
  };
  ASSERT_EQ(train("straight", ""), 0) << out;
  ASSERT_EQ(train("resumed", "train.max_steps=2"), 0) << out;
  ASSERT_EQ(train("resumed", ""), 0) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  const auto a = metric_lines(dir / "straight" / "metrics.jsonl"), b = metric_lines(dir / "resumed" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["accuracy"].get<double>(), b[i]["accuracy"].get<double>()) << "step " << i + 1;
  }
}

TEST(Dpo, PrecomputedReferenceGivesTheInProcessLosses) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  const auto model =
      "model: {family: gpt2, max_position_embeddings: 32, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: "
      "4}\n";
  anvil::testing::write_text(dir / "dpo.yaml", tiny_run("dpo", "data/dpo_train.jsonl", model));
  auto train = [&](const std::string& name, const std::string& extra) {
    return run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "dpo.yaml").string() +
                   " output_dir=" + (dir / name).string() + " " + extra,
               &out);
  };
  ASSERT_EQ(train("inproc", "train.eval_every=4"), 0) << out;
  ASSERT_EQ(train("cached", "train.eval_every=4 dpo.precompute_reference=true"), 0) << out;
  EXPECT_NE(out.find("cached in"), std::string::npos) << out;
  ASSERT_TRUE(stdfs::exists(dir / "cached" / "reference_logps.safetensors"));
  const auto a = metric_lines(dir / "inproc" / "metrics.jsonl"), b = metric_lines(dir / "cached" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_NEAR(a[0]["loss"].get<double>(), std::log(2.0), 1e-6);  // policy == reference at step 1
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"})
      EXPECT_NEAR(a[i][k].get<double>(), b[i][k].get<double>(), 1e-5 * std::max(1.0, std::abs(a[i][k].get<double>())))
          << "step " << i + 1 << " " << k;
  for (const char* k : {"eval/loss", "eval/rewards/accuracies", "eval/rewards/margins"})
    EXPECT_NEAR(a.back()[k].get<double>(), b.back()[k].get<double>(), 1e-5) << k;
  // A longer run in the same folder reuses the cache instead of the reference model.
  ASSERT_EQ(train("cached", "train.max_steps=5 dpo.precompute_reference=true"), 0) << out;
  EXPECT_NE(out.find("reference log-probs read from"), std::string::npos) << out;
  // Ranked lists are for reward models; DPO says so.
  anvil::testing::write_text(dir / "dpo2.yaml", tiny_run("dpo", "data/pref_ranked_train.jsonl", model));
  EXPECT_NE(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "dpo2.yaml").string() +
                    " output_dir=" + (dir / "r").string(),
                &out),
            0);
  EXPECT_NE(out.find("DPO trains on chosen/rejected pairs"), std::string::npos) << out;
}

// ORPO, SimPO and CPO from scratch: no reference model is loaded; two
// full_shard ranks log what one process logs, and a run resumed from its
// step-4 checkpoint logs the uninterrupted run's values bit for bit.
TEST(Dpo, ReferenceFreeRunsShardAndResumeExactly) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  const auto model =
      "model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: "
      "2}\n";
  anvil::testing::write_text(dir / "dpo.yaml", tiny_run("dpo", "data/dpo_train.jsonl", model));
  for (const std::string type : {"orpo", "simpo", "cpo"}) {
    SCOPED_TRACE(type);
    const std::string keys = " dpo.loss_type=" + type + " dpo.label_smoothing=" + (type == "orpo" ? "0" : "0.1") +
                             " train.global_batch_size=16 train.log_every=1 train.save_every=4 logging.level=warn";
    std::string out;
    auto train = [&](const std::string& name, const std::string& extra, int ranks = 0) {
      const auto mpi = anvil::testing::mpirun(ranks);
      return run("cd " + src + " && " + mpi + anvil::testing::trainer_bin() + " --config " +
                     (dir / "dpo.yaml").string() + " output_dir=" + (dir / (type + name)).string() + keys + " " +
                     extra + " 2>&1",
                 &out);
    };
    ASSERT_EQ(train("one", "train.max_steps=8"), 0) << out;
    EXPECT_EQ(out.find("reference model"), std::string::npos) << out;
    ASSERT_EQ(train("two", "train.max_steps=8 dist.sharding=full_shard", 2), 0) << out;
    ASSERT_EQ(train("resumed", "train.max_steps=8"), 0) << out;
    stdfs::remove_all(dir / (type + "resumed") / "checkpoint-8");  // resume from step 4, as after a kill
    ASSERT_EQ(train("resumed", "train.max_steps=8"), 0) << out;
    anvil::testing::expect_runs_agree(dir / (type + "one"), dir / (type + "two"), dir / (type + "resumed"), 8);
    for (const auto& [step, m] : anvil::testing::metrics_by_step(dir / (type + "one") / "metrics.jsonl")) {
      EXPECT_TRUE(m.contains("nll_loss")) << m.dump();
      EXPECT_EQ(m.contains("log_odds_ratio"), type == "orpo") << m.dump();
    }
  }
  // A reference is refused with these loss types.
  std::string out;
  EXPECT_NE(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "dpo.yaml").string() +
                    " output_dir=" + (dir / "bad").string() + " dpo.loss_type=simpo dpo.rpo_alpha=0.5 2>&1",
                &out),
            0);
  EXPECT_NE(out.find("dpo.rpo_alpha: loss_type simpo weighs the chosen reply's NLL with dpo.cpo_alpha"),
            std::string::npos)
      << out;
}

// ---- learning, from the quickstart SFT checkpoint (QuickstartLearning's fixture) ----

// The checkpoint of the quickstart run the tiny configs name (model.from:
// runs/quickstart/checkpoint-1000), taken from the fixture's run.
// Read from the YAML text, not through load_config: that checks model.from
// exists, and on a fresh clone runs/quickstart does not.
stdfs::path sft_checkpoint() {
  const auto yaml = anvil::testing::read_text(anvil::testing::source_dir() + "/configs/dpo_tiny.yaml");
  std::smatch m;
  if (!std::regex_search(yaml, m, std::regex(R"(\n  from: *(\S+))")))
    throw std::runtime_error("configs/dpo_tiny.yaml: no model.from line");
  return anvil::testing::fixture_checkpoint().parent_path() / stdfs::path(m[1].str()).filename();
}

/// The fixture's metrics line of the step sft_checkpoint() was saved at.
nlohmann::json sft_metrics() {
  const auto name = sft_checkpoint().filename().string();
  const auto step = std::stoll(name.substr(name.find('-') + 1));
  for (const auto& m : metric_lines(sft_checkpoint().parent_path() / "metrics.jsonl"))
    if (m["step"].get<int64_t>() == step) return m;
  ADD_FAILURE() << "no metrics for step " << step << " in the quickstart fixture";
  return {};
}

TEST(PreferenceLearning, RewardModelRanksHeldOutPairs) {
  ASSERT_TRUE(stdfs::exists(sft_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  std::string out;
  const auto src = anvil::testing::source_dir();
  ASSERT_EQ(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config configs/rm_tiny.yaml output_dir=" +
                    dir.path().string() + " model.from=" + sft_checkpoint().string() +
                    " train.eval_every=0 train.threads=1" + anvil::testing::seed_override(),
                &out),
            0)
      << out;
  const auto last = metric_lines(dir / "metrics.jsonl").back();
  anvil::testing::record_figure("held-out pair accuracy", last["eval/accuracy"].get<double>(), 0.5, 0.9);
  EXPECT_GE(last["eval/accuracy"].get<double>(), 0.9) << last.dump();
  EXPECT_GT(last["accuracy"].get<double>(), 0.85) << last.dump();  // train-time metric, no prefix
  // anvil score on the eval file agrees with the trainer's eval/accuracy.
  ASSERT_EQ(
      run("cd " + src + " && " + anvil::testing::cli_bin() + " score --model " + (dir / "checkpoint-300").string() +
              " --input data/pref_eval.jsonl 2>&1 >" + (dir / "scores.jsonl").string(),
          &out),
      0)
      << out;
  int64_t right = 0, n = 0;
  for (const auto& j : metric_lines(dir / "scores.jsonl")) {
    right += j["chosen"].get<double>() > j["rejected"].get<double>();
    ++n;
  }
  EXPECT_EQ(n, 400);
  EXPECT_NEAR(static_cast<double>(right) / static_cast<double>(n), last["eval/accuracy"].get<double>(), 1e-9);
}

TEST(PreferenceLearning, DpoRaisesHeldOutRewardAccuracyAndExactMatch) {
  ASSERT_TRUE(stdfs::exists(sft_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  std::string out;
  const auto src = anvil::testing::source_dir();
  // The fixture is the quickstart as shipped, so its metrics are the SFT model's on the same
  // 400 held-out prompts the DPO run evaluates.
  const auto sft = sft_metrics();
  const double beta = dpo_config(anvil::config::load_config({src + "/configs/dpo_tiny.yaml"},
                                                            {"model.from=" + sft_checkpoint().string()}))
                          .beta;
  ASSERT_EQ(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config configs/dpo_tiny.yaml output_dir=" +
                    dir.path().string() + " model.from=" + sft_checkpoint().string() +
                    " train.eval_every=0 train.threads=1" + anvil::testing::seed_override(),
                &out),
            0)
      << out;
  const auto last = metric_lines(dir / "metrics.jsonl").back();
  anvil::testing::record_figure("held-out reward accuracy", last["eval/rewards/accuracies"].get<double>(), 0.0, 0.90);
  anvil::testing::record_figure("chosen log-prob change (nats)", last["eval/rewards/chosen"].get<double>() / beta, 0.0,
                                -0.05);
  EXPECT_GE(last["eval/rewards/accuracies"].get<double>(), 0.90) << last.dump();
  EXPECT_GT(last["eval/rewards/margins"].get<double>(), 0.0) << last.dump();
  // No likelihood displacement: rewards/chosen = beta x the change in the held-out chosen
  // replies' log-prob, which may fall by 0.05 nats at most (plain DPO at beta 0.1 loses 1.5,
  // docs/algorithms.md).
  EXPECT_GT(last["eval/rewards/chosen"].get<double>() / beta, -0.05) << last.dump();
  // Greedy exact match on the held-out prompts rises above the SFT model's.
  const double before = sft["eval/exact_match"].get<double>(), after = last["eval/exact_match"].get<double>();
  std::cout << "[dpo_tiny] held-out exact match: SFT " << before << " -> DPO " << after << "\n";
  anvil::testing::record_figure("held-out exact match gain", after - before, 0.0, 0.0);
  EXPECT_GT(after, before) << last.dump();
}

// ORPO and SimPO (no reference model) from the quickstart SFT model on the
// bundled pairs: the held-out margin between chosen and rejected replies (β ×
// the mean token log-probs) widens from the SFT model's, which an eval-only
// run with the same loss type measures first, and the greedy exact match
// does not fall (by more than 2 points) below the SFT model's.
TEST(PreferenceLearning, ReferenceFreeLossesLearnThePairs) {
  ASSERT_TRUE(stdfs::exists(sft_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const auto src = anvil::testing::source_dir();
  const auto sft = sft_metrics();
  for (const std::string type : {"orpo", "simpo"}) {
    SCOPED_TRACE(type);
    TempDir dir;
    std::string out;
    const auto cmd = [&](const std::string& name) {
      return "cd " + src + " && " + anvil::testing::trainer_bin() + " --config configs/" + type +
             "_tiny.yaml output_dir=" + (dir / name).string() + " model.from=" + sft_checkpoint().string() +
             " train.threads=1" + anvil::testing::seed_override();
    };
    ASSERT_EQ(run(cmd("before") + " --eval-only 2>&1", &out), 0) << out;
    const auto before =
        nlohmann::json::parse(anvil::testing::read_text(dir / "before" / "eval-step-0.json"))["metrics"];
    ASSERT_EQ(run(cmd("run") + " 2>&1", &out), 0) << out;
    const auto last = metric_lines(dir / "run" / "metrics.jsonl").back();
    ASSERT_TRUE(before.contains("eval/rewards/margins") && last.contains("eval/rewards/margins")) << out;
    const double beta = dpo_config(anvil::config::load_config({src + "/configs/" + type + "_tiny.yaml"},
                                                              {"model.from=" + sft_checkpoint().string()}))
                            .beta;
    // The margin in nats of mean token log-prob.
    const double gain =
        (last["eval/rewards/margins"].get<double>() - before["eval/rewards/margins"].get<double>()) / beta;
    std::cout << "[" << type
              << "_tiny] held-out margin (nats per token): " << before["eval/rewards/margins"].get<double>() / beta
              << " -> " << last["eval/rewards/margins"].get<double>() / beta << "; exact match SFT "
              << sft["eval/exact_match"].get<double>() << " -> " << last["eval/exact_match"].get<double>() << "\n";
    // Over 4 fixtures x 2 seeds (docs/reliability.md): the margin gained 0.090-0.187 (orpo) and 0.211-0.309
    // (simpo) nats per token; exact match changed +0.042..+0.135 and +0.027..+0.117. The paper's SimPO
    // without the NLL term lost 0.075 here: the second check catches that displacement.
    const double min_gain = type == "orpo" ? 0.03 : 0.08;
    anvil::testing::record_figure(type + " held-out margin gain (nats per token)", gain, 0.0, min_gain);
    anvil::testing::record_figure(type + " held-out reward accuracy", last["eval/rewards/accuracies"].get<double>(),
                                  before["eval/rewards/accuracies"].get<double>(), 0.0);
    const double change = last["eval/exact_match"].get<double>() - sft["eval/exact_match"].get<double>();
    anvil::testing::record_figure(type + " held-out exact match change", change, 0.0, -0.02);
    EXPECT_GE(gain, min_gain) << last.dump();
    EXPECT_GE(change, -0.02) << last.dump();
  }
}

}  // namespace
}  // namespace anvil::train
