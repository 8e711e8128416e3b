// Training-step throughput of a ~10.7 M parameter LLaMA on CPU: forward,
// causal-LM loss, backward, grad clipping, AdamW. bench/train_step_hf.py runs
// the same model, batch and step in Python transformers; bench/run.sh runs both,
// and this one again with --fused 0 and with --state-dtype bfloat16 (AdamW's
// moments in bfloat16), whose cost is median_optimizer_step_s.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/utils/clip_grad.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "models/llama/llama.h"
#include "optim/optimizer.h"
#include "anvil/train/sft.h"
#include "bench_util.h"
#include "kernels/dispatch.h"

int main(int argc, char** argv) {
  using namespace anvil;
  auto a = bench::parse_args(argc, argv,
                             {{"threads", "2"},
                              {"batch", "8"},
                              {"seq", "256"},
                              {"steps", "10"},
                              {"warmup", "3"},
                              {"fused", "1"},
                              {"state-dtype", "float32"},
                              {"fused-kernels", "1"},
                              {"vocab", "8192"},
                              {"hidden", "288"},
                              {"layers", "6"},
                              {"heads", "6"},
                              {"intermediate", "768"}});
  at::set_num_threads(std::stoi(a["threads"]));
  kernels::set_fused_ops(a["fused-kernels"] == "1");  // train.fused_kernels
  at::manual_seed(0);
  models::llama::LlamaOptions o;
  o.vocab_size(std::stol(a["vocab"]))
      .hidden_size(std::stol(a["hidden"]))
      .intermediate_size(std::stol(a["intermediate"]))
      .num_hidden_layers(std::stol(a["layers"]))
      .num_attention_heads(std::stol(a["heads"]))
      .num_key_value_heads(std::stol(a["heads"]))
      .max_position_embeddings(std::stol(a["seq"]));
  models::llama::LlamaForCausalLM model(o);
  model.train();
  int64_t n_params = 0;
  for (const auto& p : model.parameters()) n_params += p.numel();

  config::OptimizerConfig oc;
  oc.lr = 1e-4;
  oc.betas = {0.9, 0.95};
  oc.weight_decay = 0.1;
  oc.fused = a["fused"] == "1";
  const auto state_dtype = config::kStateDtypes.find(a["state-dtype"]);  // optimizer.state_dtype
  if (!state_dtype) throw std::runtime_error("--state-dtype: expected float32 or bfloat16, got " + a["state-dtype"]);
  oc.state_dtype = *state_dtype;
  auto opt = optim::make_optimizer(oc, model.parameters());

  const int64_t B = std::stol(a["batch"]), T = std::stol(a["seq"]);
  const int steps = std::stoi(a["steps"]), warmup = std::stoi(a["warmup"]);
  std::vector<double> times, optimizer_times;
  double final_loss = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    auto ids = at::randint(o.vocab_size(), {B, T}, at::kLong);  // (B, T)
    const double t0 = bench::now_s();
    auto loss = train::causal_lm_loss_sum(model.forward(ids), ids) / static_cast<double>(B * (T - 1));
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    const double t1 = bench::now_s();
    opt->step();
    if (i >= warmup) optimizer_times.push_back(bench::now_s() - t1);
    opt->zero_grad();
    final_loss = loss.item<double>();
    if (i >= warmup) times.push_back(bench::now_s() - t0);
  }
  const double med = bench::median(times);
  std::printf("%s\n", nlohmann::json({{"impl", oc.fused ? "anvil" : "anvil (torch::optim::AdamW)"},
                                      {"fused_kernels", kernels::fused_ops()},
                                      {"params", n_params},
                                      {"batch", B},
                                      {"seq", T},
                                      {"threads", std::stoi(a["threads"])},
                                      {"state_dtype", a["state-dtype"]},
                                      {"median_step_s", med},
                                      {"median_optimizer_step_s", bench::median(optimizer_times)},
                                      {"tokens_per_s", static_cast<double>(B * T) / med},
                                      {"final_loss", final_loss}})
                          .dump()
                          .c_str());
  return 0;
}
