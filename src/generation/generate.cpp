#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "generation/sampling.h"

namespace anvil::generation {

at::Tensor sample(const at::Tensor& logits_in, const SamplingOptions& opt, at::Generator& gen) {
  const auto logits = logits_in.to(at::kFloat);
  const auto B = logits.size(0);
  std::vector<int64_t> keys(static_cast<size_t>(B));
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* g = gen.get<at::CPUGeneratorImpl>();
    for (auto& k : keys) k = static_cast<int64_t>(row_key(g->random64()));
  }
  const auto opts = at::TensorOptions().dtype(at::kLong).device(logits.device());
  return choose(final_scores(logits, opt), opt, at::tensor(keys, at::kLong).to(logits.device()), at::zeros({}, opts))
      .to(at::kCPU);
}

int64_t sample_next(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen) {
  return sample(logits.unsqueeze(0), opt, gen)[0].item<int64_t>();
}

std::vector<std::vector<int64_t>> generate(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& opt) {
  return Decoder(model).generate(prompts, opt);
}

Generation generate_with_logprobs(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                  const SamplingOptions& opt) {
  return Decoder(model).generate_with_logprobs(prompts, opt);
}

}  // namespace anvil::generation
