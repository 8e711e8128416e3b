#pragma once
// The one collective interface the sharding code is written against, with
// three implementations: a single process (world size 1, no library), NCCL
// through c10d's ProcessGroupNCCL (GPUs, rendezvous through c10d's TCPStore)
// and OpenMPI (CPU tensors; launched by mpirun). Every collective runs under a
// watchdog: one that has not completed after `timeout` ends the process with a
// message naming the rank and the collective, so a dead or hung peer turns
// into an error instead of a hang.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "distributed/env.h"

namespace anvil::distributed {

/// A collective that may still be running; wait() blocks until its result
/// may be used (on GPUs: until the current stream is ordered after it).
class Work {
 public:
  Work() = default;
  explicit Work(std::function<void()> wait) : wait_(std::move(wait)) {}
  void wait() {
    if (wait_) std::exchange(wait_, nullptr)();
  }

 private:
  std::function<void()> wait_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "single", "nccl" or "mpi".
  virtual std::string backend() const = 0;

  /// `t` <- elementwise sum of every rank's `t` (in place).
  virtual void all_reduce_sum(const at::Tensor& t, const std::string& what) = 0;
  /// `out` (world_size * n elements) <- every rank's `in` (n), in rank order.
  /// May return before it completes; `in` must live until then.
  virtual Work all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& what) = 0;
  /// `out` (n) <- sum over ranks of their `in`[rank * n, (rank + 1) * n);
  /// `in` holds world_size * n elements. May return before it completes.
  virtual Work reduce_scatter_sum(const at::Tensor& out, const at::Tensor& in, const std::string& what) = 0;
  /// `t` <- rank `root`'s `t`.
  virtual void broadcast(const at::Tensor& t, int root, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;
  /// Point to point, one exchange: `send` to rank `dst` while `recv` (of the
  /// same size and dtype) is filled from rank `src`; blocks until both are
  /// done. A ring passes blocks with dst = rank + 1, src = rank - 1 (ring
  /// attention's keys and values); dst = src = rank copies.
  virtual void send_recv(const at::Tensor& send, int dst, const at::Tensor& recv, int src, const std::string& what) = 0;
  /// A communicator over the ranks that pass the same `color`, numbered in
  /// the order of `key` (MPI_Comm_split): HSDP's shard and replica groups.
  /// A collective: every rank calls it, in the same order.
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& what) = 0;
};

struct CommOptions {
  /// "auto" (nccl for a CUDA device, else mpi), "nccl" or "mpi".
  std::string backend = "auto";
  std::chrono::milliseconds timeout{600000};
};

/// The communicator for this process. World size 1 needs no library unless
/// `options.backend` names one (nccl; mpi under mpirun); more ranks use NCCL
/// (rendezvous at MASTER_ADDR:MASTER_PORT) or MPI. Throws
/// ConfigError when the backend does not fit the launch (e.g. mpi without
/// mpirun, nccl on CPU, a library this build lacks).
std::shared_ptr<Communicator> make_communicator(const ProcessInfo& proc, const at::Device& device,
                                                const CommOptions& options);

/// Whether this build has the backend ("nccl", "mpi").
bool has_backend(const std::string& name);

}  // namespace anvil::distributed
