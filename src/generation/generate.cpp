#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace anvil::generation {

int64_t sample_next(const at::Tensor& logits_in, const SamplingOptions& opt, at::Generator& gen) {
  auto logits = logits_in.to(at::kCPU, at::kFloat);  // (V)
  if (opt.greedy || opt.temperature <= 0) return logits.argmax().item<int64_t>();
  logits = logits / opt.temperature;
  const auto V = logits.size(0);
  if (opt.top_k > 0 && opt.top_k < V) {
    auto kth = std::get<0>(logits.topk(opt.top_k)).min();
    logits = logits.masked_fill(logits < kth, -INFINITY);
  }
  if (opt.top_p < 1.0) {
    auto [sorted, idx] = logits.sort(/*dim=*/0, /*descending=*/true);
    auto p = sorted.softmax(0);
    // Drop tokens once the mass before them already reaches top_p (the first always stays).
    auto drop_sorted = (p.cumsum(0) - p) >= opt.top_p;
    auto drop = at::zeros_like(drop_sorted).scatter(0, idx, drop_sorted);
    logits = logits.masked_fill(drop, -INFINITY);
  }
  auto probs = logits.softmax(0);
  return at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

std::vector<std::vector<int64_t>> generate(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& opt) {
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  const auto device = model.parameters().front().device();
  std::vector<std::vector<int64_t>> out;
  out.reserve(prompts.size());
  for (const auto& prompt : prompts) {
    TORCH_CHECK(!prompt.empty(), "generate: empty prompt");
    std::vector<int64_t> produced;
    models::KVCache cache;
    auto input = at::tensor(prompt, at::kLong).unsqueeze(0).to(device);  // (1, T)
    const int64_t budget = std::min<int64_t>(opt.max_new_tokens,
                                             model.max_positions() - static_cast<int64_t>(prompt.size()));
    for (int64_t i = 0; i < budget; ++i) {
      auto logits = model.forward(input, &cache);  // (1, T, V)
      const auto next = sample_next(logits[0][-1], opt, gen);
      produced.push_back(next);
      if (next == opt.eos_id) break;
      input = at::full({1, 1}, next, at::TensorOptions().dtype(at::kLong).device(device));
    }
    out.push_back(std::move(produced));
  }
  if (was_training) model.train();
  return out;
}

}  // namespace anvil::generation
