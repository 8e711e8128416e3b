// The mesh's groups and the tensor-, sequence- and context-parallel collectives on one process
// (bench/gpu/run.sh check): the world communicator this launch gets (on CUDA, c10d's ProcessGroupNCCL; on the
// CPU, one process's), split into the tensor-, context- and data-parallel groups of a 1 x 1 mesh (a
// ProcessGroupNCCL each), then every collective those groups run in training, forward and backward, against
// what one process computes without them. Prints a PASS or FAIL line per check; exit status 1 on a FAIL.
//
// usage: bench_mesh [--device cuda|cpu]   (launch as rank 0 of 1: RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
//                                          MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port>)
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

#include <cstring>
#include <iostream>
#include <string>

#include "distributed/comm.h"
#include "distributed/context_parallel.h"
#include "distributed/env.h"
#include "distributed/mesh.h"
#include "distributed/tensor_parallel.h"
#include "models/context_parallel.h"
#include "models/tensor_parallel.h"

using namespace anvil;
using namespace anvil::distributed;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "PASS " : "FAIL ") << "mesh: " << what << std::endl;
  failures += ok ? 0 : 1;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::allclose(a.cpu().to(at::kFloat), b.cpu().to(at::kFloat), 1e-5, 1e-5);
}

/// all_reduce, all_gather, reduce_scatter and a send/recv to itself on one group of one rank.
void collectives(Communicator& group, const std::string& name, const at::Device& device) {
  const auto x = at::randn({6}, at::TensorOptions().device(device));
  auto summed = x.clone();
  group.all_reduce_sum(summed, "bench_mesh: all_reduce");
  auto gathered = at::empty({6}, x.options());
  group.all_gather(gathered, x, "bench_mesh: all_gather").wait();
  auto scattered = at::empty({6}, x.options());
  group.reduce_scatter_sum(scattered, x, "bench_mesh: reduce_scatter").wait();
  auto received = at::empty({6}, x.options());
  group.send_recv(x, group.rank(), received, group.rank(), "bench_mesh: send_recv");
  check(group.world_size() == 1 && same(summed, x) && same(gathered, x) && same(scattered, x) && same(received, x),
        name + " group (" + group.backend() + "): all_reduce, all_gather, reduce_scatter, send_recv");
}

/// A row through the tensor-parallel group's layer collectives, with and without sequence parallelism: the same
/// values and gradients as without the group.
void tensor_parallel(const std::shared_ptr<Communicator>& tp, const at::Device& device) {
  const auto group = tensor_parallel_group(tp);
  const auto opts = at::TensorOptions().device(device);
  const auto w = at::randn({8, 8}, opts);
  const auto x0 = at::randn({2, 5, 8}, opts);
  const auto run = [&](bool sequence) {
    auto x = x0.clone().requires_grad_();
    auto norm = at::ones({8}, opts).requires_grad_();
    at::Tensor y;
    if (sequence) {
      models::SequenceScope scope(5);
      auto h = group->scatter_sequence(x, 5);
      h = h * group->sum_gradient(norm);
      h = group->reduce(at::linear(group->enter(h), w));
      y = group->gather_sequence(h, 5);
    } else {
      y = group->reduce(at::linear(group->enter(x * group->sum_gradient(norm)), w));
    }
    y.square().sum().backward();
    return std::make_tuple(y.detach(), x.grad(), norm.grad());
  };
  auto x = x0.clone().requires_grad_();
  auto norm = at::ones({8}, opts).requires_grad_();
  const auto want = at::linear(x * norm, w);
  want.square().sum().backward();
  for (const bool sequence : {false, true}) {
    const auto [y, gx, gn] = run(sequence);
    check(same(y, want.detach()) && same(gx, x.grad()) && same(gn, norm.grad()),
          std::string("tensor parallel group: column -> row layers") + (sequence ? " under sequence parallelism" : "") +
              ", forward and backward");
  }
  // Vocabulary-parallel cross entropy over a group of one: ATen's.
  auto logits = at::randn({7, 11}, opts).requires_grad_();
  const auto targets = at::randint(11, {7}, opts.dtype(at::kLong));
  const auto ce = at::cross_entropy_loss(logits, targets, {}, at::Reduction::None);
  ce.sum().backward();
  auto shard = logits.detach().clone().requires_grad_();
  const auto got = vocab_parallel_cross_entropy(shard, targets, tp);
  got.sum().backward();
  check(same(got, ce.detach()) && same(shard.grad(), logits.grad()),
        "vocabulary-parallel cross entropy = ATen's, forward and backward");
}

/// The context-parallel gather of keys and values over a group of one: the row itself, and its gradient; ring
/// attention over it.
void context_parallel(const std::shared_ptr<Communicator>& cp, const at::Device& device) {
  const auto share = context_share(cp, 8, device);
  auto kv = at::randn({2, 3, 8, 4}, at::TensorOptions().device(device)).requires_grad_();
  const auto whole = share->gather(kv);
  (whole * 2).sum().backward();
  check(share->slots().numel() == 8 && same(whole.detach(), kv.detach()) && same(kv.grad(), at::full_like(kv, 2)),
        "context parallel group: keys and values gathered, gradients reduce-scattered");
  // Ring mode (dist.context_parallel_mode: ring) over the group of one: a causal row with grouped key/value heads
  // against ATen's attention, output and the gradients of q, k and v.
  const auto ring = context_share(cp, 8, device, /*ring=*/true);
  const auto opts = at::TensorOptions().device(device);
  auto q = at::randn({2, 4, 8, 8}, opts).requires_grad_(), k = at::randn({2, 2, 8, 8}, opts).requires_grad_();
  auto v = at::randn({2, 2, 8, 8}, opts).requires_grad_();
  const auto got = ring->ring_attention(q, k, v, at::Tensor(), 0, 0.0, 0.0);
  const auto causal = at::ones({8, 8}, opts.dtype(at::kBool)).tril();
  const auto want = at::scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), causal);
  const auto w = at::randn(want.sizes(), opts);
  const auto wg = torch::autograd::grad({(want * w).sum()}, {q, k, v});
  const auto gg = torch::autograd::grad({(got * w).sum()}, {q, k, v});
  check(same(got.detach(), want.detach()) && same(gg[0], wg[0]) && same(gg[1], wg[1]) && same(gg[2], wg[2]),
        "context parallel group, ring mode: ring attention and its backward");
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) {
      device_name = argv[++i];
    } else {
      std::cerr << "usage: bench_mesh [--device cuda|cpu]\n";
      return 2;
    }
  }
  try {
    const at::Device device(device_name);
    at::manual_seed(0);
    CommOptions options;
    options.backend = device.is_cuda() ? "nccl" : "auto";
    const auto world = make_communicator(discover_from_environment(), device, options);
    const Mesh mesh(world, MeshShape{1, 1});
    collectives(*world, "world", device);
    collectives(*mesh.tp, "tensor parallel", device);
    collectives(*mesh.cp, "context parallel", device);
    collectives(*mesh.dp, "data parallel", device);
    tensor_parallel(mesh.tp, device);
    context_parallel(mesh.cp, device);
  } catch (const std::exception& e) {
    check(false, std::string("error: ") + e.what());
  }
  return failures == 0 ? 0 : 1;
}
