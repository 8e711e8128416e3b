// A C++ team's program linking the installed anvil package: a model, the
// config reference, and one fully sharded, activation-checkpointed
// forward/backward through the public dist API (one process).
#include <anvil/config/config.h>
#include <anvil/distributed/sharding.h>
#include <anvil/models/gpt2.h>

#include <iostream>
#include <memory>

int main() {
  anvil::models::gpt2::GPT2Options o;
  o.vocab_size(10).n_positions(8).n_embd(16).n_layer(2).n_head(2);
  auto model = std::make_shared<anvil::models::gpt2::GPT2LMHeadModel>(o);
  auto logits = model->forward(at::zeros({1, 4}, at::kLong));
  std::cout << "logits " << logits.sizes() << " keys " << anvil::config::reference_markdown().size();

  auto comm = anvil::distributed::make_communicator(anvil::distributed::discover_from_environment(), at::kCPU, {});
  anvil::distributed::ShardingOptions so;
  so.strategy = anvil::distributed::Sharding::FullShard;
  so.activation_checkpointing = true;
  anvil::distributed::ShardedModel sharded(model, comm, so);
  sharded.begin_step();
  model->forward(at::ones({2, 4}, at::kLong)).logsumexp(-1).sum().backward();
  sharded.finish_backward();
  const double norm = sharded.clip_grad_norm(0);
  std::cout << " grad_norm " << norm << "\n";
  return norm > 0 ? 0 : 1;
}
