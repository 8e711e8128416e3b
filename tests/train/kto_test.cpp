// KTO (algorithm: kto, src/train/kto*): both loss types' losses and metrics
// and TRL's class-balance advice against an independent Python reference
// (tests/parity/kto_reference.py, the papers' and TRL's definitions), the data
// formats and their errors, two full_shard ranks and resume against one
// process, a precomputed reference against the in-process one, and learning
// from the quickstart SFT checkpoint (the ctest fixture) on the bundled pairs,
// unpaired.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "anvil/core/error.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "train/objectives/kto/kto.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

at::Tensor doubles(const nlohmann::json& j) { return at::tensor(j.get<std::vector<double>>(), at::kDouble); }

/// tests/parity/kto_reference.py's output, made once for the suite's tests.
const nlohmann::json& kto_reference() {
  static const auto j = anvil::testing::python_reference("kto_reference.py");
  return j;
}

TEST(KtoFormulas, LossAndMetricsMatchTheReference) {
  const auto& cases = kto_reference()["kto"];
  ASSERT_EQ(cases.size(), 7u);
  for (const auto& c : cases) {
    const KtoLossOptions opt{c["beta"], c["desirable_weight"], c["undesirable_weight"],
                             *kKtoLosses.find(c["loss_type"].get<std::string>())};
    SCOPED_TRACE(anvil::concat(kKtoLosses.name(opt.loss_type), " beta ", opt.beta, " w_u ", opt.undesirable_weight));
    EXPECT_EQ(kto_uses_kl(opt.loss_type), c["loss_type"] == "kto");
    Sums sums;
    double loss = 0, n = 0;
    for (const auto& b : c["micro_batches"]) {
      const auto pi = doubles(b["policy_logps"]);
      std::vector<uint8_t> d;
      for (const auto& x : b["desirable"]) d.push_back(x.get<bool>());
      const auto desirable = at::tensor(at::ArrayRef<uint8_t>(d), at::kByte).to(at::kBool);
      // apo_zero_unpaired has no KL rows: the objective logs z0 as 0 and kto_loss reads none.
      at::Tensor kl = at::zeros({}, at::kDouble);
      if (kto_uses_kl(opt.loss_type)) {
        kl = kto_kl(doubles(b["policy_kl_logps"]), doubles(b["ref_kl_logps"]));
        EXPECT_NEAR(kl.item<double>(), b["kl"].get<double>(), 1e-9);
      }
      const auto out =
          kto_loss(pi, doubles(b["ref_logps"]), desirable, kto_uses_kl(opt.loss_type) ? kl : at::Tensor(), opt);
      EXPECT_LE((out.losses - doubles(b["losses"])).abs().max().item<double>(), 1e-6);
      EXPECT_LE((out.rewards - doubles(b["rewards"])).abs().max().item<double>(), 1e-6);
      add_kto_sums(out, pi, desirable, kl, sums);
      add_kto_logit_sums(doubles(b["mean_logit_sums"]),
                         at::tensor(b["token_counts"].get<std::vector<int64_t>>(), at::kLong), desirable, sums);
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

// TRL's advice on desirable_weight / undesirable_weight for the class balance: the same ranges, in the same
// cases (and with equal counts too, which TRL does not check).
TEST(KtoFormulas, BalanceAdviceMatchesTrls) {
  const auto& cases = kto_reference()["balance"];
  ASSERT_EQ(cases.size(), 8u);
  for (const auto& c : cases) {
    const auto advice = kto_balance_advice(c["desirable"].get<int64_t>(), c["undesirable"].get<int64_t>(),
                                           c["desirable_weight"].get<double>(), c["undesirable_weight"].get<double>());
    SCOPED_TRACE(c.dump());
    if (!c["warns"].get<bool>()) {
      EXPECT_EQ(advice, "");
      continue;
    }
    const auto range = [&](const char* key, const char* side) {
      return anvil::concat(key, " in [", c[side][0].get<double>(), ", ", c[side][1].get<double>(), "]");
    };
    EXPECT_NE(advice.find(range("kto.desirable_weight", "desirable_range")), std::string::npos) << advice;
    EXPECT_NE(advice.find(range("kto.undesirable_weight", "undesirable_range")), std::string::npos) << advice;
    EXPECT_NE(advice.find(anvil::concat(c["desirable"].get<int64_t>(), " desirable and ",
                                        c["undesirable"].get<int64_t>(), " undesirable examples")),
              std::string::npos)
        << advice;
  }
}

/// A tiny KTO run's config: a 1-layer GPT-2 from scratch on `train`.
std::string tiny_kto(const std::string& train, const std::string& eval) {
  return anvil::concat(R"(algorithm: kto
tokenizer: {path: data/tokenizer.model}
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2}
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
  EXPECT_EQ(out.find("(but NOT BOTH)"), std::string::npos) << out;  // balanced: no advice
  // The plan's first sample says which kind of example it is (unshuffled: the file's first line).
  anvil::testing::write_text(dir / "bad_first.jsonl", R"({"prompt": "add: 1+2\n", "completion": "4", "label": false}
{"prompt": "add: 3+4\n", "completion": "7", "label": true}
)");
  const std::vector<std::pair<std::string, std::string>> firsts = {
      {"mixed.jsonl", "desirable; trained tokens in [[ ]]):\nadd: 1+2\n[[3"},
      {"bad_first.jsonl", "undesirable; trained tokens in [[ ]]):\nadd: 1+2\n[[4"}};
  for (const auto& [file, first] : firsts) {
    ASSERT_EQ(run("cd " + src + " && " + trainer + (dir / "ok").string() +
                      " --dry-run logging.level=info data.shuffle=false 'data.train=[{path: " + (dir / file).string() +
                      "}]' 2>&1",
                  &out),
              0)
        << out;
    EXPECT_NE(out.find("first training sample (" + first), std::string::npos) << out;
  }
  // Weights that unbalance the examples: TRL's advice, naming the keys.
  ASSERT_EQ(
      run("cd " + src + " && " + trainer + (dir / "ok").string() + " --dry-run kto.desirable_weight=2 2>&1", &out), 0)
      << out;
  EXPECT_NE(out.find("2 desirable and 2 undesirable examples, so kto.desirable_weight x 2 / (kto.undesirable_weight "
                     "x 2) = 2, outside the [1, 4/3]"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Set EITHER kto.desirable_weight in [1, 1.33] or kto.undesirable_weight in [1.5, 2]"),
            std::string::npos)
      << out;
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
    for (const char* k : {"loss", "kl", "rewards/chosen", "rewards/rejected", "logps/chosen", "logits/chosen",
                          "logits/rejected", "grad_norm"})
      EXPECT_TRUE(m.contains(k)) << step << " " << k << " " << m.dump();
  EXPECT_TRUE(a.at(8).contains("eval/kl") && a.at(8).contains("eval/exact_match")) << a.at(8).dump();
}

// kto.precompute_reference (TRL's precompute_ref_log_probs) scores every
// example, and with loss_type kto every KL row, once: the runs log what the
// in-process reference gives (1e-5; only the reference's batches differ), over
// more than one epoch, and a resumed run reads the cache. loss_type
// apo_zero_unpaired logs kl 0 (TRL's), as it scores no KL rows. With
// loss_type kto the micro-batches must be the same every epoch: the config
// and the data say which key breaks that.
TEST(KtoRuns, PrecomputedReferenceMatchesTheInProcessOne) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  // 40 pairs, 80 examples: an epoch is 10 micro-batches of 8, and 8 steps of 2 read 1.6 epochs.
  std::ifstream in(src + "/data/dpo_train.jsonl");
  std::string line, lines;
  for (int i = 0; i < 40 && std::getline(in, line); ++i) lines += line + "\n";
  anvil::testing::write_text(dir / "train.jsonl", lines);
  anvil::testing::write_text(dir / "kto.yaml", tiny_kto((dir / "train.jsonl").string(), "data/dpo_eval.jsonl"));
  std::string out;
  const auto train = [&](const std::string& name, const std::string& extra) {
    return run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "kto.yaml").string() +
                   " output_dir=" + (dir / name).string() +
                   " data.shuffle=false train.eval_every=8 logging.level=info " + extra + " 2>&1",
               &out);
  };
  for (const std::string loss : {"kto", "apo_zero_unpaired"}) {
    SCOPED_TRACE(loss);
    ASSERT_EQ(train(loss + "_model", "kto.loss_type=" + loss), 0) << out;
    ASSERT_EQ(train(loss + "_cached", "kto.loss_type=" + loss + " kto.precompute_reference=true"), 0) << out;
    // Every example of the train and eval files; the KL rows of an epoch (80) and of the eval loss's 2 batches.
    EXPECT_NE(out.find(loss == "kto" ? "of 880 examples and 100 KL rows cached in" : "of 880 examples cached in"),
              std::string::npos)
        << out;
    const auto a = anvil::testing::metrics_by_step(dir / (loss + "_model") / "metrics.jsonl");
    const auto b = anvil::testing::metrics_by_step(dir / (loss + "_cached") / "metrics.jsonl");
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (const auto& [step, m] : a) {
      if (loss != "kto") {
        EXPECT_EQ(m["kl"].get<double>(), 0.0) << step;
      }
      for (const char* k : {"loss", "kl", "rewards/chosen", "rewards/rejected", "logps/chosen", "logits/chosen",
                            "eval/loss", "eval/kl", "eval/rewards/margins"}) {
        if (!m.contains(k)) continue;
        ASSERT_TRUE(b.at(step).contains(k)) << step << " " << k;
        const double x = m[k].get<double>();
        EXPECT_NEAR(b.at(step)[k].get<double>(), x, 1e-5 * std::max(1.0, std::abs(x))) << step << " " << k;
      }
    }
    EXPECT_TRUE(a.at(8).contains("eval/loss")) << a.at(8).dump();
  }
  // On 2 full_shard ranks each scores every other batch and the caches are summed: the one process's, bit for bit.
  ASSERT_EQ(run("cd " + src + " && " + anvil::testing::mpirun(2) + anvil::testing::trainer_bin() + " --config " +
                    (dir / "kto.yaml").string() + " output_dir=" + (dir / "kto_cached_2").string() +
                    " data.shuffle=false train.eval_every=8 logging.level=info kto.loss_type=kto "
                    "kto.precompute_reference=true dist.sharding=full_shard 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("of 880 examples and 100 KL rows cached in"), std::string::npos) << out;
  EXPECT_NE(out.find("(split over 2 ranks)"), std::string::npos) << out;
  {
    const auto want = io::load_safetensors(dir / "kto_cached" / "reference_logps.safetensors");
    const auto got = io::load_safetensors(dir / "kto_cached_2" / "reference_logps.safetensors");
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(at::equal(got.at(name), t)) << name;
    }
  }
  stdfs::remove_all(dir / "kto_cached" / "checkpoint-8");  // resume from step 4: the cache, not the reference
  ASSERT_EQ(train("kto_cached", "kto.precompute_reference=true"), 0) << out;
  EXPECT_NE(out.find("kto: reference log-probs read from"), std::string::npos) << out;
  // What would pair other completions with a prompt's KL row from one epoch to the next.
  const auto dry = [&](const std::string& extra) {
    return train("bad", "kto.precompute_reference=true --dry-run " + extra);
  };
  EXPECT_NE(dry("data.shuffle=true"), 0);
  EXPECT_NE(out.find("set data.shuffle: false (TRL requires its sequential sampler)"), std::string::npos) << out;
  EXPECT_NE(dry("'data.train=[{path: " + (dir / "train.jsonl").string() + ", weight: 1.0}]'"), 0);
  EXPECT_NE(out.find("data.train[0].weight"), std::string::npos) << out;
  EXPECT_NE(dry("train.micro_batch_size=7 train.global_batch_size=14"), 0);
  EXPECT_NE(out.find("an epoch of 80 examples is not a multiple of train.micro_batch_size (7)"), std::string::npos)
      << out;
  // Without KL rows any order works.
  EXPECT_EQ(dry("data.shuffle=true kto.loss_type=apo_zero_unpaired"), 0) << out;
}

// configs/kto_tiny.yaml from the quickstart SFT checkpoint, on the
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
           " --config configs/kto_tiny.yaml output_dir=" + (dir / name).string() + " model.from=" + sft.string() +
           " train.threads=1" + anvil::testing::seed_override() + " 2>&1";
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
