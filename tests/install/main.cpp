// A C++ team's program linking the installed anvil package.
#include <anvil/models/gpt2.h>
#include <anvil/config/config.h>
#include <iostream>
int main() {
  anvil::models::gpt2::GPT2Options o;
  o.vocab_size(10).n_positions(8).n_embd(16).n_layer(1).n_head(2);
  anvil::models::gpt2::GPT2LMHeadModel m(o);
  auto logits = m.forward(at::zeros({1, 4}, at::kLong));
  std::cout << "logits " << logits.sizes() << " keys " << anvil::config::reference_markdown().size() << "\n";
}
