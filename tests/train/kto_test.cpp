// KTO (algorithm: kto, src/train/kto.*): the loss and metrics against an
// independent Python reference (tests/parity/kto_reference.py, the paper's
// and TRL's definition), the data formats and their errors, two full_shard
// ranks and resume against one process, and learning from the quickstart
// SFT checkpoint (the ctest fixture) on the bundled pairs, unpaired.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "test_util.h"
#include "train/kto.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

at::Tensor doubles(const nlohmann::json& j) { return at::tensor(j.get<std::vector<double>>(), at::kDouble); }

TEST(KtoFormulas, LossAndMetricsMatchTheReference) {
  const auto cases = anvil::testing::python_reference("kto_reference.py")["kto"];
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    const KtoLossOptions opt{c["beta"], c["desirable_weight"], c["undesirable_weight"]};
    SCOPED_TRACE(anvil::concat("beta ", opt.beta, " w_u ", opt.undesirable_weight));
    Sums sums;
    double loss = 0, n = 0;
    for (const auto& b : c["micro_batches"]) {
      const auto pi = doubles(b["policy_logps"]);
      std::vector<uint8_t> d;
      for (const auto& x : b["desirable"]) d.push_back(x.get<bool>());
      const auto desirable = at::tensor(at::ArrayRef<uint8_t>(d), at::kByte).to(at::kBool);
      const auto kl = kto_kl(doubles(b["policy_kl_logps"]), doubles(b["ref_kl_logps"]));
      EXPECT_NEAR(kl.item<double>(), b["kl"].get<double>(), 1e-9);
      const auto out = kto_loss(pi, doubles(b["ref_logps"]), desirable, kl, opt);
      EXPECT_LE((out.losses - doubles(b["losses"])).abs().max().item<double>(), 1e-6);
      EXPECT_LE((out.rewards - doubles(b["rewards"])).abs().max().item<double>(), 1e-6);
      add_kto_sums(out, pi, desirable, kl, sums);
      loss += out.losses.sum().item<double>();
      n += static_cast<double>(pi.size(0));
    }
    EXPECT_NEAR(loss / n, c["loss"].get<double>(), 1e-6);
    const auto m = kto_metrics(sums);
    for (const auto& [k, v] : c["metrics"].items()) {
      ASSERT_TRUE(m.count(k)) << k;
      EXPECT_NEAR(m.at(k), v.get<double>(), 1e-6) << k;
    }
    // What TRL 1.16 does not log: no counts, and no side (or margin) that no micro-batch had.
    EXPECT_EQ(m.size(), c["metrics"].size());
    for (const auto& k : c["absent"]) EXPECT_FALSE(m.count(k.get<std::string>())) << k;
  }
}

/// A tiny KTO run's config: a 1-layer GPT-2 from scratch on `train`.
std::string tiny_kto(const std::string& train, const std::string& eval) {
  return anvil::concat(R"(algorithm: kto
tokenizer: {path: data/tokenizer.model}
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_layers: 1, num_heads: 2}
data: {train: [{path: )",
                       train, R"(}], eval: [{path: )", eval, R"(}], max_length: 32}
optimizer: {lr: 1.0e-3, weight_decay: 0.0}
schedule: {warmup_steps: 1}
train: {max_steps: 8, micro_batch_size: 8, global_batch_size: 16, log_every: 1, save_every: 4, eval_every: 0, threads: 1}
eval: {generate_samples: 4, batch_size: 10, max_batches: 2}
logging: {level: warn}
)");
}

TEST(KtoData, UnpairedAndPairedRecordsAndTheirErrors) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  // TRL's unpaired format, text and conversational, beside pairs (each unpaired into two).
  anvil::testing::write_text(dir / "mixed.jsonl",
                             R"({"prompt": "add: 1+2\n", "completion": "3", "label": true}
{"prompt": [{"role": "user", "content": "add: 2+2\n"}], "completion": [{"role": "assistant", "content": "5"}], "label": false}
{"prompt": "add: 3+4\n", "chosen": "7", "rejected": "8"}
)");
  anvil::testing::write_text(dir / "kto.yaml",
                             tiny_kto((dir / "mixed.jsonl").string(), (dir / "mixed.jsonl").string()));
  std::string out;
  const auto trainer = anvil::testing::trainer_bin() + " --config " + (dir / "kto.yaml").string() + " output_dir=";
  ASSERT_EQ(run("cd " + src + " && " + trainer + (dir / "ok").string() + " --dry-run logging.level=info 2>&1", &out), 0)
      << out;
  EXPECT_NE(out.find("4 examples, 2 desirable and 2 undesirable"), std::string::npos) << out;
  struct Bad {
    const char* line;
    const char* message;
  };
  for (const auto& b :
       {Bad{R"({"prompt": "x", "completion": "y", "label": 1})",
            "bad.jsonl:1: field \"label\": expected true (desirable) or false (undesirable), got 1"},
        Bad{R"({"prompt": "x", "completion": "y"})", "bad.jsonl:1: expected a KTO record"},
        Bad{R"({"prompt": "x", "completion": [{"role": "user", "content": "y"}], "label": true})",
            "bad.jsonl:1: field \"completion\": expected a string or a list of one assistant message"}}) {
    anvil::testing::write_text(dir / "bad.jsonl", std::string(b.line) + "\n");
    EXPECT_NE(run("cd " + src + " && " + trainer + (dir / "bad").string() +
                      " --dry-run 'data.train=[{path: " + (dir / "bad.jsonl").string() + "}]' 2>&1",
                  &out),
              0);
    EXPECT_NE(out.find(b.message), std::string::npos) << out;
  }
  // trainer --help lists it with the built-in algorithms.
  ASSERT_EQ(run(anvil::testing::trainer_bin() + " --help 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("kto"), std::string::npos) << out;
}

// Two full_shard ranks log what one process logs (the KL rows belong to a
// micro-batch, wherever it runs), and a run resumed from step 4 logs the
// uninterrupted run's values bit for bit.
TEST(KtoRuns, ShardAndResumeExactly) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  anvil::testing::write_text(dir / "kto.yaml", tiny_kto("data/dpo_train.jsonl", "data/dpo_eval.jsonl"));
  std::string out;
  auto train = [&](const std::string& name, const std::string& extra, int ranks = 0) {
    const auto mpi = anvil::testing::mpirun(ranks);
    return run("cd " + src + " && " + mpi + anvil::testing::trainer_bin() + " --config " + (dir / "kto.yaml").string() +
                   " output_dir=" + (dir / name).string() + " kto.undesirable_weight=1.33 train.eval_every=8 " + extra +
                   " 2>&1",
               &out);
  };
  ASSERT_EQ(train("one", "train.max_steps=8"), 0) << out;
  ASSERT_EQ(train("two", "train.max_steps=8 dist.sharding=full_shard", 2), 0) << out;
  ASSERT_EQ(train("resumed", "train.max_steps=8"), 0) << out;
  stdfs::remove_all(dir / "resumed" / "checkpoint-8");  // resume from step 4, as after a kill
  ASSERT_EQ(train("resumed", "train.max_steps=8"), 0) << out;
  anvil::testing::expect_runs_agree(dir / "one", dir / "two", dir / "resumed", 8);
  const auto a = anvil::testing::metrics_by_step(dir / "one" / "metrics.jsonl");
  for (const auto& [step, m] : a)
    for (const char* k : {"loss", "kl", "rewards/chosen", "rewards/rejected", "logps/chosen", "grad_norm"})
      EXPECT_TRUE(m.contains(k)) << step << " " << k << " " << m.dump();
  EXPECT_TRUE(a.at(8).contains("eval/kl") && a.at(8).contains("eval/exact_match")) << a.at(8).dump();
}

// configs/examples/kto_tiny.yaml from the quickstart SFT checkpoint, on the
// bundled DPO pairs unpaired into desirable and undesirable examples: the
// held-out margin between the desirable and undesirable completions' implicit
// rewards (0 at the start: the reference is the SFT model) becomes positive,
// and the greedy exact match (an eval-only run gives the SFT model's) does
// not fall by more than 6 points.
TEST(PreferenceLearning, KtoLearnsFromUnpairedExamples) {
  ASSERT_TRUE(stdfs::exists(anvil::testing::fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const auto sft = anvil::testing::fixture_checkpoint().parent_path() / "checkpoint-1000";
  ASSERT_TRUE(stdfs::exists(sft)) << sft;
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  const auto cmd = [&](const std::string& name) {
    return "cd " + src + " && " + anvil::testing::trainer_bin() +
           " --config configs/examples/kto_tiny.yaml output_dir=" + (dir / name).string() +
           " model.from=" + sft.string() + " train.threads=1" + anvil::testing::seed_override() + " 2>&1";
  };
  ASSERT_EQ(run(cmd("before") + " --eval-only", &out), 0) << out;
  const auto before = nlohmann::json::parse(anvil::testing::read_text(dir / "before" / "eval-step-0.json"))["metrics"];
  ASSERT_EQ(run(cmd("run"), &out), 0) << out;
  const auto last = anvil::testing::metric_lines(dir / "run" / "metrics.jsonl").back();
  ASSERT_TRUE(before.contains("eval/rewards/margins") && last.contains("eval/rewards/margins")) << out;
  const double gain = last["eval/rewards/margins"].get<double>() - before["eval/rewards/margins"].get<double>();
  std::cout << "[kto_tiny] held-out reward margin: " << before["eval/rewards/margins"].get<double>() << " -> "
            << last["eval/rewards/margins"].get<double>() << "; exact match "
            << before["eval/exact_match"].get<double>() << " -> " << last["eval/exact_match"].get<double>() << "\n";
  // Over 4 fixtures x 2 seeds (docs/reliability.md): margin 2.51-3.09, exact match change -0.018..+0.032.
  // At TRL's beta 0.1 the exact match fell 0.13: the second check catches that displacement.
  anvil::testing::record_figure("held-out reward margin gain", gain, 0.0, 1.0);
  const double change = last["eval/exact_match"].get<double>() - before["eval/exact_match"].get<double>();
  anvil::testing::record_figure("held-out exact match change", change, 0.0, -0.06);
  EXPECT_GE(gain, 1.0) << last.dump();
  EXPECT_GE(change, -0.06) << last.dump();
}

}  // namespace
}  // namespace anvil::train
