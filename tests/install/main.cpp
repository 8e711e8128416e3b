// A C++ team's program linking the installed anvil package: a model, the
// config reference, and one fully sharded, activation-checkpointed
// forward/backward through the public dist API (one process).
#include <anvil/config/config.h>
#include <anvil/distributed/sharding.h>
#include <anvil/models/registry.h>

#include <iostream>
#include <memory>

int main() {
  // A family by name, through the public registry (the families' own headers are internal).
  anvil::config::ModelConfig mc;
  mc.family = "gpt2";
  mc.vocab_size = 10;
  mc.max_position_embeddings = 8;
  mc.hidden_size = 16;
  mc.num_layers = 2;
  mc.num_heads = 2;
  auto model = anvil::models::family_by_name("gpt2").from_config(mc);
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
