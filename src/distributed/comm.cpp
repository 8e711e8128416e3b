#include "distributed/comm.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>

#include "anvil/core/error.h"
#include "backends.h"
#include "watchdog.h"

namespace anvil::distributed {
namespace detail {

Watchdog::Watchdog(int rank, int world, std::string backend, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), backend_(std::move(backend)), timeout_(timeout), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Watchdog::Scope::Scope(Watchdog& w, const char* op, const std::string& what) : w_(w) {
  std::lock_guard<std::mutex> lock(w_.mu_);
  w_.busy_ = true;
  w_.started_ = std::chrono::steady_clock::now();
  w_.op_ = op;
  w_.what_ = what;
  ++w_.calls_;
}

Watchdog::Scope::~Scope() {
  std::lock_guard<std::mutex> lock(w_.mu_);
  w_.busy_ = false;
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto tick =
      std::min<std::chrono::milliseconds>(timeout_ / 4 + std::chrono::milliseconds(1), std::chrono::milliseconds(500));
  while (!stop_) {
    cv_.wait_for(lock, tick);
    if (stop_ || !busy_) continue;
    const auto waited = std::chrono::steady_clock::now() - started_;
    if (waited < timeout_) continue;
    const auto msg = concat("rank ", rank_, " of ", world_, ": ", backend_, " ", op_, " (", what_, ", collective #",
                            calls_, ") did not complete within ", timeout_.count() / 1000.0,
                            " s (dist.timeout_s): another rank died, hangs or took a different path; exiting");
    std::fprintf(stderr, "anvil: %s\n", msg.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }
}

}  // namespace detail

namespace {

/// World size 1: every collective is the identity (or a copy).
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce_sum(const at::Tensor&, const std::string&) override {}
  Work all_gather(const at::Tensor& out, const at::Tensor& in, const std::string&) override {
    TORCH_CHECK(out.numel() == in.numel(), "all_gather: output must hold world_size x input elements");
    if (out.data_ptr() != in.data_ptr()) out.view(-1).copy_(in.view(-1));
    return {};
  }
  Work reduce_scatter_sum(const at::Tensor& out, const at::Tensor& in, const std::string&) override {
    TORCH_CHECK(out.numel() == in.numel(), "reduce_scatter: input must hold world_size x output elements");
    if (!out.is_same(in)) out.view(-1).copy_(in.view(-1));
    return {};
  }
  void broadcast(const at::Tensor&, int, const std::string&) override {}
  void barrier(const std::string&) override {}
  void send_recv(const at::Tensor& send, int dst, const at::Tensor& recv, int src, const std::string&) override {
    TORCH_CHECK(dst == 0 && src == 0 && send.numel() == recv.numel(), "send_recv: one process has rank 0 only");
    if (!send.is_same(recv)) recv.view(-1).copy_(send.view(-1));
  }
  std::shared_ptr<Communicator> split(int, int, const std::string&) override {
    return std::make_shared<SingleProcess>();
  }
};

}  // namespace

bool has_backend(const std::string& name) {
#ifdef ANVIL_WITH_MPI
  if (name == "mpi") return true;
#endif
#ifdef ANVIL_WITH_NCCL
  if (name == "nccl") return true;
#endif
  return false;
}

std::shared_ptr<Communicator> make_communicator(const ProcessInfo& proc, const at::Device& device,
                                                const CommOptions& options) {
  // One process needs no library, unless the config names one: an explicit
  // nccl builds ProcessGroupNCCL even alone (the GPU check's one-rank
  // full_shard runs through it), an explicit mpi does under mpirun -np 1.
  if (proc.world_size == 1 && (options.backend == "auto" || (options.backend == "mpi" && proc.launcher != "mpirun")))
    return std::make_shared<SingleProcess>();
  auto backend = options.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "mpi";
  if (backend == "nccl") {
    if (!device.is_cuda())
      throw ConfigError(concat("dist.backend: nccl needs train.device cuda, got ", device.str(),
                               "; CPU runs use mpi (launched by mpirun)"));
#ifdef ANVIL_WITH_NCCL
    return detail::make_nccl_communicator(proc, device, options.timeout);
#else
    throw ConfigError("dist.backend: this build of Anvil has no NCCL (LibTorch without CUDA)");
#endif
  }
  if (backend == "mpi") {
    if (!device.is_cpu())
      throw ConfigError(
          concat("dist.backend: mpi reduces CPU tensors; train.device is ", device.str(), " (use nccl on GPUs)"));
    if (proc.launcher != "mpirun")
      throw ConfigError(concat("dist.backend: mpi needs the ranks started by mpirun (this one came from ",
                               proc.launcher, "); e.g. mpirun -np ", proc.world_size,
                               " build/bin/trainer --config ..."));
#ifdef ANVIL_WITH_MPI
    return detail::make_mpi_communicator(proc, options.timeout);
#else
    throw ConfigError("dist.backend: this build of Anvil has no MPI (install libopenmpi-dev and rebuild)");
#endif
  }
  throw ConfigError(concat("dist.backend: expected auto, nccl or mpi, got \"", backend, "\""));
}

}  // namespace anvil::distributed
