// NCCL communicator through c10d's ProcessGroupNCCL, rendezvous through
// c10d's TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it). The process
// group's own timeout (dist.timeout_s) covers collectives stuck on the GPU;
// the watchdog covers the host waiting on them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

#include "anvil/core/error.h"
#include "backends.h"
#include "watchdog.h"

namespace anvil::distributed::detail {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const ProcessInfo& proc, const at::Device& device, std::chrono::milliseconds timeout)
      : rank_(static_cast<int>(proc.rank)), world_(static_cast<int>(proc.world_size)), device_(device) {
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
