// A C++ team's program linking the installed anvil package: a model through
// the public registry, the config reference, a forward/backward, and greedy
// decoding with the KV cache that agrees with the forward pass's argmax.
#include <anvil/config/config.h>
#include <anvil/generation/generate.h>
#include <anvil/models/registry.h>

#include <cmath>
#include <iostream>
#include <memory>

int main() {
  // A family by name, through the public registry (the families' own headers are internal).
  anvil::config::ModelConfig mc;
  mc.family = "gpt2";
  mc.vocab_size = 10;
  mc.max_position_embeddings = 8;
  mc.hidden_size = 16;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 2;
  auto model = anvil::models::family_by_name("gpt2").from_config(mc);
  auto logits = model->forward(at::zeros({1, 4}, at::kLong));
  std::cout << "logits " << logits.sizes() << " keys " << anvil::config::reference_markdown().size();

  model->forward(at::ones({2, 4}, at::kLong)).logsumexp(-1).sum().backward();
  double norm = 0;
  for (const auto& p : model->parameters())
    if (p.grad().defined()) norm += p.grad().square().sum().item<double>();
  std::cout << " grad_norm " << std::sqrt(norm);

  // The first greedy token is the forward pass's argmax at the prompt's last position.
  anvil::generation::SamplingOptions opt;
  opt.max_new_tokens = 3;
  const auto out = anvil::generation::generate(*model, {{1, 2, 3}}, opt);
  model->eval();
  const int64_t argmax = model->forward(at::tensor({1, 2, 3}, at::kLong).unsqueeze(0))[0][-1].argmax().item<int64_t>();
  std::cout << " generated " << out.at(0).size() << " tokens\n";
  return norm > 0 && out.at(0).size() == 3 && out[0][0] == argmax ? 0 : 1;
}
