// On-policy distillation (algorithm: distill, src/train/distill.*): the
// generalised JSD against an independent Python reference
// (tests/parity/distill_reference.py, the GKD paper's definition), two
// full_shard ranks and resume against one process (also with the teacher
// sampling the responses: seq_kd), and learning from the
// quickstart's SFT model towards its later checkpoint (the ctest fixture).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "anvil/chat/chat.h"
#include "anvil/checkpoint/hf_model.h"
#include "anvil/core/error.h"
#include "anvil/tokenizer/tokenizer.h"
#include "models/gpt2/gpt2.h"
#include "test_util.h"
#include "train/objectives/distill/distill.h"

namespace anvil::train {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;

/// The records of `from` without their "response" field, written to `to`.
void write_prompts_only(const stdfs::path& from, const stdfs::path& to) {
  std::string out;
  std::istringstream in(anvil::testing::read_text(from));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    j.erase("response");
    out += j.dump() + "\n";
  }
  anvil::testing::write_text(to, out);
}

at::Tensor matrix(const nlohmann::json& j) {
  std::vector<at::Tensor> rows;
  for (const auto& r : j) rows.push_back(at::tensor(r.get<std::vector<double>>(), at::kDouble));
  return at::stack(rows);
}

TEST(DistillFormulas, GeneralizedJsdMatchesTheReference) {
  const auto cases = anvil::testing::python_reference("distill_reference.py")["jsd"];
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    SCOPED_TRACE(anvil::concat("beta ", c["beta"].get<double>(), " temperature ", c["temperature"].get<double>()));
    const auto ours = generalized_jsd(matrix(c["student"]), matrix(c["teacher"]), c["beta"], c["temperature"]);
    const auto ref = at::tensor(c["jsd"].get<std::vector<double>>(), at::kDouble);
    EXPECT_LE((ours.to(at::kDouble) - ref).abs().max().item<double>(), 1e-6);
  }
  // The gradient flows to the student only through its logits; equal logits give 0.
  const auto x = at::randn({3, 7});
  EXPECT_LE(generalized_jsd(x, x, 0.5, 1.0).abs().max().item<double>(), 1e-6);
}

// A tiny student from scratch and a tiny teacher (a 3-step SFT run of the
// same shape): two full_shard ranks log what one process logs, on-policy and
// dataset steps both, and a run resumed from step 4 logs the uninterrupted
// run's values bit for bit.
TEST(DistillRuns, ShardAndResumeExactly) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  const std::string shape =
      " model.family=gpt2 model.max_position_embeddings=32 model.hidden_size=32 model.num_hidden_layers=1 "
      "model.num_attention_heads=2";
  std::string out;
  ASSERT_EQ(run("cd " + src + " && " + anvil::testing::trainer_bin() +
                    " --config configs/quickstart.yaml output_dir=" + (dir / "teacher").string() + shape +
                    " train.max_steps=3 train.save_every=3 train.eval_every=0 train.threads=1 logging.level=warn 2>&1",
                &out),
            0)
      << out;
  anvil::testing::write_text(dir / "distill.yaml", R"(algorithm: distill
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_add_train.jsonl}], eval: [{path: data/sft_eval_add.jsonl}], max_length: 32}
optimizer: {lr: 1.0e-3, weight_decay: 0.0}
schedule: {warmup_steps: 1}
train: {micro_batch_size: 8, global_batch_size: 16, log_every: 1, save_every: 4, eval_every: 8, threads: 1}
eval: {generate_samples: 8, batch_size: 8, max_new_tokens: 6}
logging: {level: warn}
)");
  auto train = [&](const std::string& name, const std::string& extra, int ranks = 0) {
    const auto mpi = anvil::testing::mpirun(ranks);
    return run("cd " + src + " && " + mpi + anvil::testing::trainer_bin() + " --config " +
                   (dir / "distill.yaml").string() + shape + " output_dir=" + (dir / name).string() +
                   " distill.teacher=" + (dir / "teacher" / "checkpoint-3").string() +
                   " distill.lmbda=0.5 distill.beta=0.3 distill.max_new_tokens=6 " + extra + " 2>&1",
               &out);
  };
  ASSERT_EQ(train("one", "train.max_steps=8"), 0) << out;
  // Two ranks with the step given as grad_accum_steps (16 samples over both ranks, as global_batch_size 16).
  ASSERT_EQ(
      train("two", "train.max_steps=8 dist.sharding=full_shard train.global_batch_size=0 train.grad_accum_steps=2", 2),
      0)
      << out;
  ASSERT_EQ(train("resumed", "train.max_steps=8"), 0) << out;
  stdfs::remove_all(dir / "resumed" / "checkpoint-8");  // resume from step 4, as after a kill
  ASSERT_EQ(train("resumed", "train.max_steps=8"), 0) << out;
  anvil::testing::expect_runs_agree(dir / "one", dir / "two", dir / "resumed", 8);
  const auto a = anvil::testing::metrics_by_step(dir / "one" / "metrics.jsonl");
  std::set<double> kinds;
  for (const auto& [step, m] : a) {
    ASSERT_TRUE(m.contains("distill/on_policy")) << m.dump();
    kinds.insert(m["distill/on_policy"].get<double>());
  }
  EXPECT_EQ(kinds.size(), 2u) << "want on-policy and dataset steps both";
  EXPECT_TRUE(a.at(8).contains("eval/exact_match")) << a.at(8).dump();
  // No teacher, or one of another vocabulary, is refused.
  EXPECT_NE(run("cd " + src + " && " + anvil::testing::trainer_bin() + " --config " + (dir / "distill.yaml").string() +
                    shape + " output_dir=" + (dir / "bad").string() + " train.max_steps=1 2>&1",
                &out),
            0);
  EXPECT_NE(out.find("distill.teacher: algorithm distill needs the teacher's model folder"), std::string::npos) << out;

  // seq_kd (TRL's): the steps that are not on-policy train on the teacher's samples, so records without a
  // response serve; the teacher, gathered whole for sampling under full_shard, gives the same tokens on
  // every rank and after a resume. Without seq_kd such a record stops the run, naming the key.
  write_prompts_only(stdfs::path(src) / "data" / "sft_add_train.jsonl", dir / "prompts.jsonl");
  const std::string seq = " 'data.train=[{path: " + (dir / "prompts.jsonl").string() +
                          "}]' train.max_steps=8 train.save_every=4 distill.seq_kd=true";
  ASSERT_EQ(train("seq-one", seq), 0) << out;
  ASSERT_EQ(train("seq-two", seq + " dist.sharding=full_shard", 2), 0) << out;
  ASSERT_EQ(train("seq-resumed", seq), 0) << out;
  stdfs::remove_all(dir / "seq-resumed" / "checkpoint-8");
  ASSERT_EQ(train("seq-resumed", seq), 0) << out;
  anvil::testing::expect_runs_agree(dir / "seq-one", dir / "seq-two", dir / "seq-resumed", 8);
  std::set<double> seq_kinds;
  for (const auto& [step, m] : anvil::testing::metrics_by_step(dir / "seq-one" / "metrics.jsonl")) {
    ASSERT_TRUE(m.contains("distill/teacher_sampled")) << m.dump();
    const double on = m["distill/on_policy"].get<double>();
    seq_kinds.insert(on);
    EXPECT_EQ(m["distill/teacher_sampled"].get<double>(), 1.0 - on) << "step " << step << ": " << m.dump();
    EXPECT_GT(m["distill/response_length"].get<double>(), 0.0) << m.dump();
  }
  EXPECT_EQ(seq_kinds.size(), 2u) << "want on-policy and teacher-sampled steps both";
  EXPECT_NE(train("seq-refused",
                  " 'data.train=[{path: " + (dir / "prompts.jsonl").string() + "}]' train.max_steps=2 distill.lmbda=0"),
            0);
  EXPECT_NE(out.find("prompts.jsonl"), std::string::npos) << out;
  EXPECT_NE(out.find("distill.seq_kd"), std::string::npos) << out;
}

/// A tiny random GPT-2 of the bundled tokenizer's vocabulary, saved as an HF folder at `dir`; its
/// weights drawn wide (std 0.3), so that two such models' distributions differ well.
void save_tiny_gpt2(const stdfs::path& dir, uint64_t seed) {
  const auto tok = tokenizer::load_tokenizer("sentencepiece", anvil::testing::source_dir() + "/data/tokenizer.model");
  at::manual_seed(seed);
  models::gpt2::GPT2Options o;
  o.vocab_size(tok->vocab_size()).n_positions(32).n_embd(32).n_layer(2).n_head(2).initializer_range(0.3);
  models::gpt2::GPT2LMHeadModel model(o);
  model.special_tokens = {tok->bos_id(), tok->eos_id(), tok->pad_id()};
  stdfs::create_directories(dir);
  checkpoint::save_model_dir(dir, model, tok.get());
}

// GKDTrainer evaluates the divergence on the eval records' own responses
// (teacher forcing): eval/loss is TRL's GKDTrainer.generalized_jsd_loss on
// transformers' logits of the two folders (tests/parity/gkd_eval_reference.py;
// every record in one batch there, three batches of at most 2 here), at two
// temperatures; a record without a response is left out. A run then keeps
// its best checkpoint by it, as sft does.
TEST(DistillEval, HeldOutLossIsTrlsDivergenceAndNamesTheBestCheckpoint) {
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  save_tiny_gpt2(dir / "student", 1);
  save_tiny_gpt2(dir / "teacher", 2);
  const std::vector<std::pair<std::string, std::string>> records = {{"add: 82+79\n", "161"},
                                                                    {"reverse: anvil\n", "livna"},
                                                                    {"add: 1+2\n", "3"},
                                                                    {"upper: abc\n", "ABC"},
                                                                    {"add: 18+90\n", "108"}};
  std::string eval;
  for (const auto& [p, r] : records) eval += nlohmann::json({{"prompt", p}, {"response", r}}).dump() + "\n";
  eval += nlohmann::json({{"prompt", "add: 5+5\n"}}).dump() + "\n";  // no response: not in eval/loss
  anvil::testing::write_text(dir / "eval.jsonl", eval);
  const auto trainer =
      "cd " + src + " && " + anvil::testing::trainer_bin() +
      " 'data.train=[{path: data/sft_add_train.jsonl}]' 'data.eval=[{path: " + (dir / "eval.jsonl").string() +
      "}]' data.max_length=32 algorithm=distill distill.teacher=" + (dir / "teacher").string() +
      " distill.beta=0.3 distill.lmbda=0 eval.batch_size=2 eval.generate_samples=0 train.threads=1 train.max_steps=4";
  std::string out;
  std::vector<double> ours;
  for (const char* temperature : {"1.0", "0.7"}) {
    const auto at = dir / (std::string("eval-") + temperature);
    ASSERT_EQ(run(trainer + " --eval-only output_dir=" + at.string() + " model.from=" + (dir / "student").string() +
                      " distill.temperature=" + temperature + " 2>&1",
                  &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(anvil::testing::read_text(at / "eval-step-0.json"));
    ASSERT_TRUE(j["metrics"].contains("eval/loss")) << j.dump();
    ours.push_back(j["metrics"]["eval/loss"].get<double>());
  }
  // The rows as distill renders them (plain: a text prompt as written, the reply and its end of turn).
  const auto tok = tokenizer::load_tokenizer_from_model_dir(dir / "student");
  const auto& plain = chat::ChatTemplate::get("plain");
  auto rows = nlohmann::json::array();
  for (const auto& [p, r] : records) {
    std::vector<int64_t> prompt;
    if (tok->add_bos() && tok->bos_id() >= 0) prompt.push_back(tok->bos_id());
    const auto text = tok->encode(p);
    prompt.insert(prompt.end(), text.begin(), text.end());
    rows.push_back({prompt, plain.encode_reply(*tok, r)});
  }
  anvil::testing::write_text(dir / "rows.json",
                             nlohmann::json({{"rows", rows}, {"beta", 0.3}, {"temperatures", {1.0, 0.7}}}).dump());
  ASSERT_EQ(run(anvil::testing::python_bin() + " " + src + "/tests/parity/gkd_eval_reference.py " +
                    (dir / "student").string() + " " + (dir / "teacher").string() + " " + (dir / "rows.json").string() +
                    " 2>&1",
                &out),
            0)
      << out;
  const auto trl = nlohmann::json::parse(out.substr(out.rfind('{')))["loss"];
  ASSERT_EQ(trl.size(), 2u) << out;
  for (size_t i = 0; i < 2; ++i) {
    std::cout << "[distill eval/loss] temperature " << (i == 0 ? "1.0" : "0.7") << ": Anvil " << ours[i] << ", TRL "
              << trl[i].get<double>() << "\n";
    EXPECT_GT(ours[i], 0.0);
    EXPECT_NEAR(ours[i], trl[i].get<double>(), 1e-5 * trl[i].get<double>()) << "temperature #" << i;
  }

  // Training: eval/loss at every eval, and the summary names the checkpoint with the lowest.
  ASSERT_EQ(run(trainer + " output_dir=" + (dir / "run").string() + " model.from=" + (dir / "student").string() +
                    " train.save_every=2 train.eval_every=2 train.micro_batch_size=4"
                    " train.global_batch_size=4 logging.level=info 2>&1",
                &out),
            0)
      << out;
  const auto m = anvil::testing::metrics_by_step(dir / "run" / "metrics.jsonl");
  ASSERT_TRUE(m.at(2).contains("eval/loss") && m.at(4).contains("eval/loss")) << m.at(2).dump();
  const int best = m.at(2)["eval/loss"].get<double>() < m.at(4)["eval/loss"].get<double>() ? 2 : 4;
  EXPECT_NE(
      out.find("best checkpoint by eval/loss: " + (dir / "run" / ("checkpoint-" + std::to_string(best))).string()),
      std::string::npos)
      << out;
}

// configs/distill_tiny.yaml: the quickstart's SFT model at step 1000
// learns from its own run's final checkpoint: its held-out exact match rises
// (an eval-only run gives the student's first).
TEST(DistillLearning, StudentMovesTowardsTheTeacher) {
  ASSERT_TRUE(stdfs::exists(anvil::testing::fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const auto run_dir = anvil::testing::fixture_checkpoint().parent_path();
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  std::string out;
  const auto cmd = [&](const std::string& name) {
    return "cd " + src + " && " + anvil::testing::trainer_bin() +
           " --config configs/distill_tiny.yaml output_dir=" + (dir / name).string() +
           " model.from=" + (run_dir / "checkpoint-1000").string() +
           " distill.teacher=" + (run_dir / "checkpoint-1500").string() + " train.threads=1" +
           anvil::testing::seed_override() + " 2>&1";
  };
  ASSERT_EQ(run(cmd("before") + " --eval-only", &out), 0) << out;
  const double before = nlohmann::json::parse(anvil::testing::read_text(
      dir / "before" / "eval-step-0.json"))["metrics"]["eval/exact_match"]
                            .get<double>();
  ASSERT_EQ(run(cmd("run"), &out), 0) << out;
  const auto last = anvil::testing::metric_lines(dir / "run" / "metrics.jsonl").back();
  const double after = last["eval/exact_match"].get<double>();
  std::cout << "[distill_tiny] held-out exact match: student " << before << " -> " << after << "\n";
  // Over 4 fixtures x 2 seeds (docs/reliability.md): +0.023 to +0.123 on 400 prompts.
  anvil::testing::record_figure("held-out exact match gain", after - before, 0.0, 0.0);
  EXPECT_GT(after, before) << last.dump();
}

// distill.seq_kd with lmbda 0 on prompt-only records (the quickstart's SFT
// prompts without their responses): the step-1000 student learns from the
// final checkpoint's samples alone, scored by the same held-out exact match.
TEST(DistillLearning, SeqKdLearnsFromTheTeachersSamplesAlone) {
  ASSERT_TRUE(stdfs::exists(anvil::testing::fixture_checkpoint())) << "run QuickstartLearning first (ctest fixture)";
  const auto run_dir = anvil::testing::fixture_checkpoint().parent_path();
  TempDir dir;
  const auto src = anvil::testing::source_dir();
  write_prompts_only(stdfs::path(src) / "data" / "sft_train.jsonl", dir / "prompts.jsonl");
  std::string out;
  const auto cmd = [&](const std::string& name) {
    return "cd " + src + " && " + anvil::testing::trainer_bin() +
           " --config configs/distill_tiny.yaml output_dir=" + (dir / name).string() +
           " model.from=" + (run_dir / "checkpoint-1000").string() +
           " distill.teacher=" + (run_dir / "checkpoint-1500").string() +
           " 'data.train=[{path: " + (dir / "prompts.jsonl").string() +
           "}]' distill.seq_kd=true distill.lmbda=0 train.threads=1" + anvil::testing::seed_override() + " 2>&1";
  };
  ASSERT_EQ(run(cmd("before") + " --eval-only", &out), 0) << out;
  const double before = nlohmann::json::parse(anvil::testing::read_text(
      dir / "before" / "eval-step-0.json"))["metrics"]["eval/exact_match"]
                            .get<double>();
  ASSERT_EQ(run(cmd("run"), &out), 0) << out;
  const auto lines = anvil::testing::metric_lines(dir / "run" / "metrics.jsonl");
  for (const auto& m : lines)
    if (m.contains("distill/teacher_sampled")) EXPECT_EQ(m["distill/teacher_sampled"].get<double>(), 1.0) << m.dump();
  const double after = lines.back()["eval/exact_match"].get<double>();
  std::cout << "[distill_tiny, seq_kd] held-out exact match: student " << before << " -> " << after << "\n";
  anvil::testing::record_figure("held-out exact match gain (seq_kd)", after - before, 0.0, 0.0);
  EXPECT_GT(after, before) << lines.back().dump();
}

}  // namespace
}  // namespace anvil::train
