// NCCL communicator through c10d's ProcessGroupNCCL, rendezvous through
// c10d's TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it). The process
// group's own timeout (dist.timeout_s) covers collectives stuck on the GPU;
// the watchdog covers the host waiting on them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "anvil/core/error.h"
#include "backends.h"
#include "watchdog.h"

namespace anvil::distributed::detail {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const ProcessInfo& proc, const at::Device& device, std::chrono::milliseconds timeout)
      : rank_(static_cast<int>(proc.rank)),
        world_(static_cast<int>(proc.world_size)),
        device_(device),
        timeout_(timeout) {
    c10::cuda::set_device(device.index());
    // Under torchrun the elastic agent already serves a TCPStore at
    // MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True) and every
    // rank is its client, as torch.distributed does; otherwise rank 0 serves.
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = agent && std::string(agent) == "True";
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(proc.master_port);
    so.isServer = !agent_store && rank_ == 0;
    so.multiTenant = so.isServer;
    so.numWorkers = world_;
    so.waitWorkers = true;
    so.timeout = timeout;
    try {
      store_ =
          c10::make_intrusive<c10d::PrefixStore>("anvil/", c10::make_intrusive<c10d::TCPStore>(proc.master_addr, so));
    } catch (const std::exception& e) {
      throw ConfigError(concat("rendezvous at ", proc.master_addr, ":", proc.master_port,
                               " (MASTER_ADDR:MASTER_PORT) failed on rank ", rank_, ": ", e.what()));
    }
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, rank_, world_, opts);
    watchdog_ = std::make_unique<Watchdog>(rank_, world_, "nccl", timeout);
  }
  /// A split group (split()).
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world, const at::Device& device,
                   std::chrono::milliseconds timeout, const std::string& what)
      : rank_(rank), world_(world), device_(device), timeout_(timeout), store_(std::move(store)) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, rank_, world_, opts);
    watchdog_ = std::make_unique<Watchdog>(rank_, world_, "nccl (" + what + ")", timeout);
  }
  ~NcclCommunicator() override {
    watchdog_.reset();
    if (pg_) pg_->shutdown();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce_sum(const at::Tensor& t, const std::string& what) override {
    Watchdog::Scope scope(*watchdog_, "all_reduce", what);
    std::vector<at::Tensor> v{t};
    pg_->allreduce(v)->wait();
  }
  // Both run on NCCL's stream: a prefetched gather overlaps the current
  // block's compute, a gradient reduce-scatter the next block's backward.
  // wait() orders the compute stream after them.
  Work all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& what) override {
    auto o = out, i = in;
    return async("all_gather", what, [&] { return pg_->_allgather_base(o, i); });
  }
  Work reduce_scatter_sum(const at::Tensor& out, const at::Tensor& in, const std::string& what) override {
    auto o = out, i = in;
    return async("reduce_scatter", what, [&] { return pg_->_reduce_scatter_base(o, i); });
  }
  void broadcast(const at::Tensor& t, int root, const std::string& what) override {
    Watchdog::Scope scope(*watchdog_, "broadcast", what);
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(v, o)->wait();
  }
  void barrier(const std::string& what) override {
    Watchdog::Scope scope(*watchdog_, "barrier", what);
    pg_->barrier()->wait();
  }

  /// The send and the receive in one NCCL group (ProcessGroupNCCL's coalescing), so a ring of ranks that all
  /// send first cannot deadlock. Compiled, never run on a GPU yet.
  void send_recv(const at::Tensor& send, int dst, const at::Tensor& recv, int src, const std::string& what) override {
    TORCH_CHECK(send.numel() == recv.numel() && send.scalar_type() == recv.scalar_type(),
                "nccl send_recv: the tensors sent and received must have the same size and dtype");
    Watchdog::Scope scope(*watchdog_, "send_recv", what);
    if (dst == rank_ && src == rank_) {
      recv.copy_(send);
      return;
    }
    std::vector<at::Tensor> out{send}, in{recv};
    pg_->startCoalescing();
    pg_->send(out, dst, /*tag=*/0);
    pg_->recv(in, src, /*tag=*/0);
    pg_->endCoalescing()->wait();
  }

  /// A new ProcessGroupNCCL over the ranks of `color`, rendezvousing through this group's store under a prefix
  /// of its own (torch.distributed.new_group's way); every rank learns the groups from an all-gather of
  /// (color, key). Compiled, never run on a GPU yet (HSDP, docs/distributed.md).
  std::shared_ptr<Communicator> split(int color, int key, const std::string& what) override {
    auto mine = at::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key), static_cast<int64_t>(rank_)},
                           at::TensorOptions().dtype(at::kLong).device(device_));
    auto all = at::empty({3 * world_}, mine.options());
    all_gather(all, mine, "split " + what).wait();
    const auto host = all.cpu();
    const auto* v = host.data_ptr<int64_t>();
    std::vector<std::pair<int64_t, int64_t>> members;  // (key, rank) of this color
    for (int r = 0; r < world_; ++r)
      if (v[3 * r] == color) members.emplace_back(v[3 * r + 1], v[3 * r + 2]);
    std::sort(members.begin(), members.end());
    int sub_rank = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank_) sub_rank = static_cast<int>(i);
    auto store = c10::make_intrusive<c10d::PrefixStore>(concat("split-", splits_++, "/", color, "/"), store_);
    return std::shared_ptr<Communicator>(
        new NcclCommunicator(store, sub_rank, static_cast<int>(members.size()), device_, timeout_, what));
  }

 private:
  template <class Issue>
  Work async(const char* op, const std::string& what, Issue issue) {
    c10::intrusive_ptr<c10d::Work> work;
    {
      Watchdog::Scope scope(*watchdog_, op, what);
      work = issue();
    }
    return Work([this, work, op, what] {
      Watchdog::Scope scope(*watchdog_, op, what + ", waiting");
      work->wait();
    });
  }

  int rank_, world_;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  int64_t splits_ = 0;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const ProcessInfo& proc, const at::Device& device,
                                                     std::chrono::milliseconds timeout) {
  return std::make_shared<NcclCommunicator>(proc, device, timeout);
}

}  // namespace anvil::distributed::detail
