// Is the data loader ever the bottleneck? Builds the quickstart's training
// stream (config, tokenizer, datasets, mixture sampler, collation) and times
// how many samples per second it delivers, unpacked and packed, against how
// many the trainer consumes: full training steps (forward, loss, backward,
// clipping, AdamW) of the quickstart model on those same batches, in the same run.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/utils.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "anvil/chat/chat.h"
#include "anvil/config/config.h"
#include "core/logging.h"
#include "anvil/models/registry.h"
#include "optim/optimizer.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/sft.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace anvil;
  auto a = bench::parse_args(
      argc, argv,
      {{"config", "configs/quickstart.yaml"}, {"threads", "2"}, {"loader_batches", "300"}, {"train_steps", "30"}});
  at::set_num_threads(std::stoi(a["threads"]));
  log::configure(log::Level::warn);
  auto cfg = config::load_config({a["config"]}, {"output_dir=/tmp/anvil-bench-loader"});
  auto tok = tokenizer::load_tokenizer(config::kTokenizerTypes.name(cfg.tokenizer.type), cfg.tokenizer.path);
  // The run's chat format, resolved as the trainer resolves it (data.template against the tokenizer's record).
  const auto& chat = chat::ChatTemplate::get(
      chat::resolve_chat_template(*tok, cfg.data.template_name, "data.template", a["config"], ""));
  auto mc = cfg.model;
  mc.vocab_size = tok->vocab_size();
  torch::manual_seed(0);
  auto model = models::family_by_name(mc.family).from_config(mc);
  model->train();
  if (cfg.data.max_length == 0) cfg.data.max_length = model->max_positions();

  nlohmann::json out = {
      {"config", a["config"]}, {"micro_batch_size", cfg.train.micro_batch_size}, {"threads", std::stoi(a["threads"])}};
  const int n_loader = std::stoi(a["loader_batches"]);
  for (bool packing : {false, true}) {
    auto c = cfg;
    c.data.packing = packing;
    const double t_load = bench::now_s();
    train::LmObjective obj(c, *tok, chat);  // reads and tokenizes every dataset once
    if (!packing) out["load_and_tokenize_s"] = bench::now_s() - t_load;
    std::vector<double> per_batch;
    int64_t tokens = 0;
    for (int i = 0; i < n_loader; ++i) {
      const double t0 = bench::now_s();
      auto b = obj.train_source().next();
      per_batch.push_back(bench::now_s() - t0);
      tokens += b.num_tokens;
    }
    const double med = bench::median(per_batch);
    const std::string k = packing ? "packed" : "unpacked";
    out["loader_" + k + "_batches_per_s"] = 1.0 / med;
    out["loader_" + k + "_tokens_per_s"] = static_cast<double>(tokens) / n_loader / med;
    if (!packing) out["loader_samples_per_s"] = static_cast<double>(cfg.train.micro_batch_size) / med;
  }
  // The trainer's consumption on the same (unpacked) stream.
  train::LmObjective obj(cfg, *tok, chat);
  auto opt = optim::make_optimizer(cfg.optimizer, model->parameters());
  std::vector<double> steps;
  const int n_steps = std::stoi(a["train_steps"]);
  for (int i = 0; i < n_steps + 3; ++i) {
    auto b = obj.train_source().next();
    const double t0 = bench::now_s();
    train::Sums sums;
    auto loss = obj.loss_sum(*model, b, sums) / static_cast<double>(b.num_targets);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.train.grad_clip);
    opt->step();
    opt->zero_grad();
    if (i >= 3) steps.push_back(bench::now_s() - t0);
  }
  const double trainer = static_cast<double>(cfg.train.micro_batch_size) / bench::median(steps);
  out["trainer_samples_per_s"] = trainer;
  out["loader_over_trainer"] = out["loader_samples_per_s"].get<double>() / trainer;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
