// LoRA runs from the quickstart SFT checkpoint (the ctest fixture): adapters
// learn a new instruction format about as well as full fine-tuning with a
// small fraction of the trainable parameters and optimizer memory; a run's
// checkpoints are PEFT adapter folders that resume exactly, continue with
// model.lora_from and serve `anvil generate`; DPO's reference is the policy
// with its adapters off; a reward model trains its score head with them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "io/safetensors.h"
#include "test_util.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

using anvil::testing::fixture_checkpoint;

/// The quickstart's reverse and upper examples under new instructions
/// ("mirror:", "caps:"), which the fixture has never seen.
struct Rekeyed {
  stdfs::path train, eval;
};
Rekeyed rekeyed(const TempDir& dir) {
  Rekeyed out{dir / "rekeyed_train.jsonl", dir / "rekeyed_eval.jsonl"};
  const auto src = anvil::testing::source_dir();
  auto convert = [](const std::string& in, const stdfs::path& to) {
    std::ifstream f(in);
    std::ofstream o(to);
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      auto p = j["prompt"].get<std::string>();
      if (p.rfind("reverse: ", 0) == 0)
        p = "mirror: " + p.substr(9);
      else if (p.rfind("upper: ", 0) == 0)
        p = "caps: " + p.substr(7);
      else
        continue;
      j["prompt"] = p;
      o << j.dump() << "\n";
    }
  };
  convert(src + "/data/sft_train.jsonl", out.train);
  convert(src + "/data/sft_eval.jsonl", out.eval);
  return out;
}

std::string trainer(const std::string& config, const stdfs::path& out, const std::string& extra, int ranks = 0) {
  return "cd " + anvil::testing::source_dir() + " && " + anvil::testing::mpirun(ranks) + anvil::testing::trainer_bin() +
         " --config " + config + " output_dir=" + out.string() + " model.from=" + fixture_checkpoint().string() +
         " train.threads=1 " + extra + anvil::testing::seed_override() + " 2>&1";
}

std::string sft_run(const Rekeyed& data, const stdfs::path& out, const std::string& extra, int ranks = 0) {
  std::string log;
  const auto cmd = trainer("configs/quickstart.yaml", out,
                           "'data.train=[{path: " + data.train.string() +
                               "}]' data.eval[0].path=" + data.eval.string() + " eval.generate_samples=1000 " + extra,
                           ranks);
  EXPECT_EQ(run(cmd, &log), 0) << cmd << "\n" << log;
  return log;
}

double last_value(const stdfs::path& metrics, const std::string& key) {
  double v = NAN;
  for (const auto& m : anvil::testing::metric_lines(metrics))
    if (m.contains(key)) v = m[key].get<double>();
  EXPECT_FALSE(std::isnan(v)) << "no " << key << " in " << metrics;
  return v;
}

// Full fine-tuning and LoRA (r 8 on every linear layer, PEFT's all-linear)
// from the same checkpoint, same steps and data: held-out exact match within
// 15 points. Over 4 quickstart fixtures x 2 seeds LoRA came within 7 points
// (docs/reliability.md); on PEFT's default target (the fused QKV alone) it
// was 32 points behind on one fixture.
TEST(LoraLearning, AdaptersLearnANewFormatCloseToFullFineTuning) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const auto data = rekeyed(dir);
  const std::string common =
      " train.max_steps=100 train.save_every=100 train.eval_every=100 train.log_every=10 schedule.warmup_steps=10";
  std::string log;
  // The fixture on the new instructions, before any training.
  ASSERT_EQ(run(trainer("configs/quickstart.yaml", dir / "base",
                        "'data.train=[{path: " + data.train.string() + "}]' data.eval[0].path=" + data.eval.string() +
                            " eval.generate_samples=1000 --eval-only"),
                &log),
            0)
      << log;
  const auto base_em =
      nlohmann::json::parse(anvil::testing::read_text(dir / "base" / "eval-step-0.json"))["metrics"]["eval/exact_match"]
          .get<double>();
  sft_run(data, dir / "full", "optimizer.lr=1e-3" + common);
  const auto lora_log = sft_run(data, dir / "lora",
                                "optimizer.lr=6e-3 lora.r=8 lora.alpha=16 'lora.target_modules=[all-linear]'" + common);
  const double full_em = last_value(dir / "full" / "metrics.jsonl", "eval/exact_match");
  const double lora_em = last_value(dir / "lora" / "metrics.jsonl", "eval/exact_match");
  std::cout << "held-out exact match: base " << base_em << ", full " << full_em << ", lora " << lora_em << "\n";
  anvil::testing::record_figure("base held-out exact match", base_em, base_em, 0.3, /*at_most=*/true);
  anvil::testing::record_figure("full fine-tuning gain", full_em - base_em, 0.0, 0.4);
  anvil::testing::record_figure("LoRA minus full fine-tuning", lora_em - full_em, -full_em, -0.15);
  EXPECT_LT(base_em, 0.3);
  EXPECT_GT(full_em, base_em + 0.4);
  EXPECT_GE(lora_em, full_em - 0.15);
  // A fraction of the trainable parameters and of the optimizer's memory.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(lora_log, m, std::regex("trainable%: ([0-9.e+-]+)"))) << lora_log;
  EXPECT_LT(std::stod(m[1]), 10.0);
  const double full_opt = last_value(dir / "full" / "metrics.jsonl", "memory/optimizer_bytes");
  const double lora_opt = last_value(dir / "lora" / "metrics.jsonl", "memory/optimizer_bytes");
  const double full_grad = last_value(dir / "full" / "metrics.jsonl", "memory/gradient_bytes");
  const double lora_grad = last_value(dir / "lora" / "metrics.jsonl", "memory/gradient_bytes");
  std::cout << "optimizer bytes: full " << full_opt << ", lora " << lora_opt << "; gradient bytes: full " << full_grad
            << ", lora " << lora_grad << "\n";
  EXPECT_LT(lora_opt, 0.1 * full_opt);
  EXPECT_LT(lora_grad, 0.1 * full_grad);
  // The checkpoint is a PEFT adapter folder: no copy of the base.
  const auto ckpt = dir / "lora" / "checkpoint-100";
  EXPECT_TRUE(stdfs::exists(ckpt / "adapter_config.json"));
  EXPECT_TRUE(stdfs::exists(ckpt / "adapter_model.safetensors"));
  EXPECT_FALSE(stdfs::exists(ckpt / "model.safetensors"));
  // anvil generate serves it (the base from adapter_config.json).
  std::string out;
  ASSERT_EQ(run(anvil::testing::cli_bin() + " generate --model " + ckpt.string() +
                    " --prompt 'caps: abc\\n' --max-new-tokens 6 2>&1",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("ABC"), std::string::npos) << out;
}

// Killed runs resume exactly from an adapter checkpoint; model.lora_from
// continues from one in a new run.
TEST(LoraRuns, ResumeIsExactAndLoraFromContinues) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  const auto data = rekeyed(dir);
  const std::string common =
      " optimizer.lr=3e-3 lora.r=4 lora.dropout=0.1 train.max_steps=30 train.log_every=1 train.eval_every=1000 "
      "train.keep_checkpoints=0 schedule.warmup_steps=5";
  sft_run(data, dir / "a", common + " train.save_every=15");
  sft_run(data, dir / "b",
          common + " train.save_every=1000 train.resume_from=" + (dir / "a" / "checkpoint-15").string());
  const auto a = anvil::testing::read_losses(dir / "a" / "metrics.jsonl");
  const auto b = anvil::testing::read_losses(dir / "b" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 15u);
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].first, a[15 + i].first);
    EXPECT_EQ(b[i].second, a[15 + i].second) << "step " << b[i].first;
  }
  // A new run from the adapter: it starts where the adapter is, far below the base's first loss.
  const auto log = sft_run(data, dir / "c",
                           " optimizer.lr=1e-3 train.max_steps=1 train.log_every=1 train.eval_every=1000 "
                           "schedule.warmup_steps=0 model.lora_from=" +
                               (dir / "a" / "checkpoint-30").string());
  EXPECT_NE(log.find("lora: continuing the adapter"), std::string::npos) << log;
  const auto c = anvil::testing::read_losses(dir / "c" / "metrics.jsonl");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_LT(c[0].second, 0.5 * a[0].second) << "first loss " << a[0].second << " -> " << c[0].second;
  // Bad names are config errors that list what the model has.
  std::string err;
  EXPECT_NE(run(trainer("configs/quickstart.yaml", dir / "d", "lora.r=4 'lora.target_modules=[q_proj]'"), &err), 0);
  EXPECT_NE(err.find("\"q_proj\" is not a linear layer"), std::string::npos) << err;
  EXPECT_NE(err.find("query_key_value"), std::string::npos) << err;
}

// DPO with adapters: the reference is the policy with them off, so the
// first loss is exactly ln 2 and no second model is held.
TEST(LoraRuns, DpoReferenceIsThePolicyWithAdaptersOff) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  std::string log;
  const auto cmd = trainer("configs/dpo_tiny.yaml", dir / "dpo",
                           "lora.r=8 dpo.rpo_alpha=0 optimizer.lr=2e-3 train.max_steps=40 train.log_every=1 "
                           "train.eval_every=40 "
                           "train.save_every=40 eval.generate_samples=0");
  ASSERT_EQ(run(cmd, &log), 0) << log;
  EXPECT_NE(log.find("the policy with its LoRA adapters off"), std::string::npos) << log;
  EXPECT_EQ(log.find("kept in memory"), std::string::npos) << log;
  const auto losses = anvil::testing::read_losses(dir / "dpo" / "metrics.jsonl");
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses.front().second, std::log(2.0), 1e-5);
  const auto first = anvil::testing::metrics_by_step(dir / "dpo" / "metrics.jsonl").at(1);
  EXPECT_NEAR(first["rewards/margins"].get<double>(), 0.0, 1e-6) << first.dump();
  double late = 0;
  for (size_t i = 30; i < 40; ++i) late += losses[i].second / 10;
  anvil::testing::record_figure("DPO loss below ln 2, steps 31-40", std::log(2.0) - late, 0.0, 0.05);
  EXPECT_LT(late, std::log(2.0) - 0.05) << "the adapters learn the preferences";
}

// A reward model with adapters: the new score head trains with them and is
// saved as PEFT's modules_to_save; `anvil score` reads the checkpoint.
TEST(LoraRuns, RewardModelTrainsItsScoreHeadWithAdapters) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  std::string log;
  ASSERT_EQ(run(trainer("configs/rm_tiny.yaml", dir / "rm",
                        "lora.r=8 train.max_steps=20 train.save_every=20 train.eval_every=20 train.log_every=5"),
                &log),
            0)
      << log;
  const auto ckpt = dir / "rm" / "checkpoint-20";
  io::SafetensorsFile f(ckpt / "adapter_model.safetensors");
  const auto names = f.names();
  EXPECT_NE(std::find(names.begin(), names.end(), "base_model.model.score.weight"), names.end());
  const auto cfg = nlohmann::json::parse(anvil::testing::read_text(ckpt / "adapter_config.json"));
  EXPECT_EQ(cfg["task_type"], "SEQ_CLS");
  EXPECT_EQ(cfg["modules_to_save"], nlohmann::json::array({"score"}));
  const auto in = dir / "pairs.jsonl";
  anvil::testing::write_text(in, "{\"prompt\": \"upper: abc\\n\", \"response\": \"ABC\"}\n");
  std::string out;
  ASSERT_EQ(
      run(anvil::testing::cli_bin() + " score --model " + ckpt.string() + " --input " + in.string() + " 2>&1", &out), 0)
      << out;
  EXPECT_NE(out.find("reward"), std::string::npos) << out;
}

// PPO and ILQL with adapters: the heads train beside them and are saved
// beside the adapter; PPO's KL reference is the policy with adapters off.
TEST(LoraRuns, PpoAndIlqlTrainAdaptersAndHeads) {
  ASSERT_TRUE(stdfs::exists(fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  TempDir dir;
  std::string log;
  ASSERT_EQ(run(trainer("configs/ppo_tiny.yaml", dir / "ppo",
                        "lora.r=4 ppo.prompts_per_rollout=32 train.max_steps=3 train.save_every=3 "
                        "train.eval_every=1000 train.log_every=1"),
                &log),
            0)
      << log;
  EXPECT_NE(log.find("ppo: reference model: the policy with its LoRA adapters off"), std::string::npos) << log;
  // Step 1 samples with the adapters at zero: the policy equals its reference.
  const auto first = anvil::testing::metrics_by_step(dir / "ppo" / "metrics.jsonl").at(1);
  ASSERT_TRUE(first.contains("objective/kl")) << first.dump();
  EXPECT_NEAR(first["objective/kl"].get<double>(), 0.0, 1e-6);
  for (const auto& run_dir : {dir / "ppo" / "checkpoint-3"}) {
    EXPECT_TRUE(stdfs::exists(run_dir / "adapter_model.safetensors"));
    EXPECT_TRUE(stdfs::exists(run_dir / "heads.safetensors"));
  }
  ASSERT_EQ(run(trainer("configs/ilql_tiny.yaml", dir / "ilql",
                        "lora.r=4 train.max_steps=4 train.save_every=4 train.eval_every=1000 train.log_every=1"),
                &log),
            0)
      << log;
  EXPECT_TRUE(stdfs::exists(dir / "ilql" / "checkpoint-4" / "adapter_model.safetensors"));
  EXPECT_TRUE(stdfs::exists(dir / "ilql" / "checkpoint-4" / "heads.safetensors"));
  EXPECT_FALSE(stdfs::exists(dir / "ilql" / "checkpoint-4" / "model.safetensors"));
}

}  // namespace
}  // namespace anvil::train
