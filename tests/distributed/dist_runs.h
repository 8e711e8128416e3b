#pragma once
// Helpers of the multi-process tests (sharding_test.cpp, optimizer_state_test.cpp): the trainer under mpirun,
// its metrics.jsonl, and comparisons of losses and weights with a margin printed for docs/reliability.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"

namespace anvil::distributed {
namespace stdfs = std::filesystem;

/// The runs' config: a 4-block GPT-2 on the SFT fixture, 20 steps of 12 samples, saves and evals at 10 and 20.
inline constexpr const char* kRun = R"(
model: {family: gpt2, max_position_embeddings: 32, hidden_size: 32, num_hidden_layers: 4, num_attention_heads: 4, dropout: 0.0}
tokenizer: {path: data/tokenizer.model}
data: {train: [{path: data/sft_train.jsonl}], eval: [{path: data/sft_eval.jsonl}]}
optimizer: {lr: 3.0e-3, weight_decay: 0.01}
schedule: {warmup_steps: 2}
train: {max_steps: 20, micro_batch_size: 2, global_batch_size: 12, save_every: 10, eval_every: 10,
        keep_checkpoints: 0, log_every: 1000, threads: 1}
eval: {batch_size: 8, max_batches: 2, generate_samples: 2, max_new_tokens: 6, table_rows: 0}
)";

using anvil::testing::mpirun;

/// Runs the trainer on `ranks` processes (0 = plain single process, no mpirun).
inline int train(const stdfs::path& cfg, const stdfs::path& out, int ranks, const std::string& extra = "",
                 std::string* log = nullptr) {
  const auto cmd = mpirun(ranks) + anvil::testing::trainer_bin() + " --config " + cfg.string() +
                   " output_dir=" + out.string() + " " + extra;
  std::string o;
  const int rc = anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + cmd, &o);
  if (log) *log = o;
  if (rc != 0) ADD_FAILURE() << cmd << "\n" << o;
  return rc;
}

/// Runs the trainer on `ranks` processes expecting it to fail (output into `out`); returns what it printed.
inline std::string refused_run(const stdfs::path& cfg, const stdfs::path& out, int ranks, const std::string& extra) {
  std::string o;
  EXPECT_NE(anvil::testing::run("cd " + anvil::testing::source_dir() + " && " + mpirun(ranks) +
                                    anvil::testing::trainer_bin() + " --config " + cfg.string() +
                                    " output_dir=" + out.string() + " " + extra + " 2>&1",
                                &o),
            0)
      << extra;
  return o;
}

inline std::map<int64_t, nlohmann::json> read_metrics(const stdfs::path& path) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    out[j["step"].get<int64_t>()] = j;
  }
  return out;
}

inline void expect_close_losses(const std::map<int64_t, nlohmann::json>& want,
                                const std::map<int64_t, nlohmann::json>& got, int64_t from, int64_t to, double rel,
                                const std::string& what) {
  double worst = 0;  // printed: the margin a CPU of another make has (docs/reliability.md)
  std::string where;
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(want.count(s) && got.count(s)) << what << ": no metrics for step " << s;
    for (const char* key : {"loss", "grad_norm", "eval/loss", "eval/exact_match"}) {
      if (!want.at(s).contains(key)) continue;
      ASSERT_TRUE(got.at(s).contains(key)) << what << ": step " << s << " lacks " << key;
      const double a = want.at(s)[key].get<double>(), b = got.at(s)[key].get<double>();
      EXPECT_LE(std::abs(a - b), rel * std::abs(a))
          << what << ", step " << s << ", " << key << ": " << a << " vs " << b;
      if (a != 0 && std::abs(a - b) / std::abs(a) > worst)
        worst = std::abs(a - b) / std::abs(a), where = "step " + std::to_string(s) + " " + key;
    }
  }
  std::cout << "[dist] " << what << ": largest relative difference " << worst << " (" << where << "), allowed " << rel
            << "\n";
}

/// A file's tensors, or an HF folder's weights (model.safetensors, or the
/// files model.safetensors.index.json lists).
inline io::TensorMap load_weights(const stdfs::path& path) {
  if (!stdfs::is_directory(path)) return io::load_safetensors(path);
  if (!stdfs::exists(path / "model.safetensors.index.json")) return io::load_safetensors(path / "model.safetensors");
  io::TensorMap out;
  const auto index = nlohmann::json::parse(anvil::testing::read_text(path / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  for (const auto& f : files)
    for (auto& [name, t] : io::load_safetensors(path / f)) {
      EXPECT_EQ(index["weight_map"].value(name, std::string()), f) << name;
      out.emplace(name, t);
    }
  EXPECT_EQ(out.size(), index["weight_map"].size());
  return out;
}

/// Largest absolute difference between the same-named tensors of two files
/// or HF folders.
inline double max_param_diff(const stdfs::path& a, const stdfs::path& b) {
  auto ta = load_weights(a), tb = load_weights(b);
  EXPECT_EQ(ta.size(), tb.size());
  double worst = 0;
  for (const auto& [name, t] : ta) {
    EXPECT_TRUE(tb.count(name)) << name;
    if (!tb.count(name)) continue;
    worst = std::max(worst, (t.to(at::kDouble) - tb.at(name).to(at::kDouble)).abs().max().item<double>());
  }
  return worst;
}

/// The bytes a `trainer --plan-memory` text gives after `label` ("float32 masters "), or -1 (a failure) without it.
inline double plan_bytes(const std::string& text, const std::string& label) {
  const auto at = text.find(label);
  EXPECT_NE(at, std::string::npos) << label << " in\n" << text;
  if (at == std::string::npos) return -1.0;
  std::istringstream in(text.substr(at + label.size()));
  double v = 0;
  std::string unit;
  in >> v >> unit;
  return v * (unit == "GB" ? 1e9 : unit == "MB" ? 1e6 : 1e3);
}

/// The state figures of `plan` (a --plan-memory text) against what a run's metrics at a step hold, within 10 %.
inline void expect_plan_holds(const std::string& plan, const nlohmann::json& metrics, const std::string& what) {
  for (const auto& [label, key] : std::vector<std::pair<std::string, std::string>>{
           {"float32 masters ", "memory/parameter_bytes"},
           {"gradients ", "memory/gradient_bytes"},
           {"AdamW moments ", "memory/optimizer_bytes"},
           {"whole parameters held at once in a step: ", "memory/peak_gathered_parameter_bytes"}}) {
    const double planned = plan_bytes(plan, label), held = metrics[key].get<double>();
    EXPECT_NEAR(planned, held, 0.1 * held) << what << ", " << key << "\n" << plan;
  }
}

}  // namespace anvil::distributed
