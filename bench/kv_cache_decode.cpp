// Greedy decoding of 128 new tokens with the KV cache (generation::generate)
// vs recomputing the whole sequence for every token, on the ~10.7 M LLaMA of
// bench/train_step.cpp. Both must produce the same tokens.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "anvil/generation/generate.h"
#include "models/llama/llama.h"
#include "bench_util.h"

namespace {

std::vector<std::vector<int64_t>> recompute(anvil::models::CausalLM& model, const at::Tensor& prompts, int64_t n) {
  auto seq = prompts.clone();  // (B, P)
  for (int64_t i = 0; i < n; ++i) {
    auto next = model.forward(seq).select(1, seq.size(1) - 1).argmax(-1, /*keepdim=*/true);  // (B, 1)
    seq = at::cat({seq, next}, 1);
  }
  std::vector<std::vector<int64_t>> out;
  auto gen = seq.narrow(1, prompts.size(1), n).contiguous();
  for (int64_t b = 0; b < gen.size(0); ++b) {
    auto row = gen[b];
    out.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + n);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace anvil;
  auto a = bench::parse_args(argc, argv,
                             {{"threads", "2"}, {"batch", "1"}, {"prompt", "32"}, {"new", "128"}, {"repeats", "3"}});
  at::set_num_threads(std::stoi(a["threads"]));
  at::manual_seed(0);
  torch::NoGradGuard no_grad;
  const int64_t B = std::stol(a["batch"]), P = std::stol(a["prompt"]), N = std::stol(a["new"]);
  models::llama::LlamaOptions o;
  o.vocab_size(8192)
      .hidden_size(288)
      .intermediate_size(768)
      .num_hidden_layers(6)
      .num_attention_heads(6)
      .num_key_value_heads(6)
      .max_position_embeddings(P + N)
      .initializer_range(0.1);  // peaked logits, no ties
  models::llama::LlamaForCausalLM model(o);
  model.eval();
  auto prompts = at::randint(o.vocab_size(), {B, P}, at::kLong);
  std::vector<std::vector<int64_t>> prompt_lists;
  for (int64_t b = 0; b < B; ++b)
    prompt_lists.emplace_back(prompts[b].data_ptr<int64_t>(), prompts[b].data_ptr<int64_t>() + P);
  generation::SamplingOptions opt;
  opt.max_new_tokens = N;

  std::vector<double> cached_t, recompute_t;
  bool same = true;
  for (int r = 0; r < std::stoi(a["repeats"]); ++r) {
    double t0 = bench::now_s();
    auto with_cache = generation::generate(model, prompt_lists, opt);
    cached_t.push_back(bench::now_s() - t0);
    t0 = bench::now_s();
    auto without = recompute(model, prompts, N);
    recompute_t.push_back(bench::now_s() - t0);
    same = same && with_cache == without;
  }
  const double c = bench::median(cached_t), n = bench::median(recompute_t);
  std::printf("%s\n", nlohmann::json({{"batch", B},
                                      {"prompt_tokens", P},
                                      {"new_tokens", N},
                                      {"threads", std::stoi(a["threads"])},
                                      {"kv_cache_s", c},
                                      {"recompute_s", n},
                                      {"kv_cache_tokens_per_s", static_cast<double>(B * N) / c},
                                      {"recompute_tokens_per_s", static_cast<double>(B * N) / n},
                                      {"speedup", n / c},
                                      {"same_tokens", same}})
                          .dump()
                          .c_str());
  return same ? 0 : 1;
}
