// OpenMPI communicator: CPU tensors, ranks started by mpirun. MPI has no
// 16-bit float types, so 16-bit reductions run in float32 (gathers and
// broadcasts move the raw 2-byte values).
#include <ATen/ATen.h>
#include <mpi.h>

#include <exception>
#include <memory>
#include <mutex>

#include "anvil/core/error.h"
#include "backends.h"
#include "watchdog.h"

namespace anvil::distributed::detail {
namespace {

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kByte:
      return MPI_UINT8_T;
    case at::kBool:
      return MPI_C_BOOL;
    case at::kBFloat16:
    case at::kHalf:
      return MPI_UINT16_T;  // moved, never reduced
    default:
      TORCH_CHECK(false, "mpi: unsupported dtype ", t);
  }
}

void check(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(concat("mpi ", op, " failed: ", std::string(msg, len)));
}

void check_cpu(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().is_cpu(), "mpi ", op, ": needs CPU tensors, got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "mpi ", op, ": needs a contiguous tensor");
}

class MpiCommunicator final : public Communicator, public std::enable_shared_from_this<MpiCommunicator> {
 public:
  MpiCommunicator(const ProcessInfo& proc, std::chrono::milliseconds timeout)
      : timeout_(timeout), mu_(std::make_shared<std::mutex>()) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    if (rank_ != proc.rank || world_ != proc.world_size)
      throw ConfigError(concat("mpi: MPI_COMM_WORLD says rank ", rank_, " of ", world_, ", the environment (",
                               proc.launcher, ") says rank ", proc.rank, " of ", proc.world_size));
    // Errors come back as codes (then exceptions) instead of aborting the job silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    watchdog_ = std::make_unique<Watchdog>(rank_, world_, "mpi", timeout);
  }
  /// A group split from `parent` (split()): its own MPI communicator, the parent's lock (MPI_THREAD_SERIALIZED
  /// allows one call at a time in the process), and the parent kept alive, which finalizes MPI last.
  MpiCommunicator(std::shared_ptr<MpiCommunicator> parent, MPI_Comm comm, const std::string& what)
      : comm_(comm), timeout_(parent->timeout_), mu_(parent->mu_), parent_(std::move(parent)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    watchdog_ = std::make_unique<Watchdog>(rank_, world_, "mpi (" + what + ")", timeout_);
  }
  ~MpiCommunicator() override {
    watchdog_.reset();
    if (parent_) {  // a split group: freed unless unwinding (a peer may be blocked in it)
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (std::uncaught_exceptions() == 0 && !finalized) MPI_Comm_free(&comm_);
      return;
    }
    // Unwinding from an error on this rank alone: MPI_Finalize would wait
    // for peers still blocked in a collective. Leave without it; mpirun then
    // sees a rank exit unfinalized and ends the job at once.
    if (std::uncaught_exceptions() > 0) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce_sum(const at::Tensor& t, const std::string& what) override {
    check_cpu(t, "all_reduce");
    std::lock_guard<std::mutex> lock(*mu_);
    Watchdog::Scope scope(*watchdog_, "all_reduce", what);
    if (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf) {
      auto f = t.to(at::kFloat);
      check(MPI_Allreduce(MPI_IN_PLACE, f.data_ptr(), static_cast<int>(f.numel()), MPI_FLOAT, MPI_SUM, comm_),
            "all_reduce");
      t.copy_(f);
      return;
    }
    check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), count(t), mpi_type(t.scalar_type()), MPI_SUM, comm_), "all_reduce");
  }

  Work all_gather(const at::Tensor& out, const at::Tensor& in, const std::string& what) override {
    check_cpu(out, "all_gather");
    check_cpu(in, "all_gather");
    TORCH_CHECK(out.numel() == in.numel() * world_ && out.scalar_type() == in.scalar_type(),
                "mpi all_gather: output must hold world_size x input elements of the same dtype");
    std::lock_guard<std::mutex> lock(*mu_);
    Watchdog::Scope scope(*watchdog_, "all_gather", what);
    const auto type = mpi_type(in.scalar_type());
    // `in` may be this rank's own slice of `out` (an in-place gather).
    const bool in_place = static_cast<const char*>(in.data_ptr()) ==
                          static_cast<const char*>(out.data_ptr()) + rank_ * in.numel() * in.element_size();
    check(
        MPI_Allgather(in_place ? MPI_IN_PLACE : in.data_ptr(), count(in), type, out.data_ptr(), count(in), type, comm_),
        "all_gather");
    return {};
  }

  Work reduce_scatter_sum(const at::Tensor& out, const at::Tensor& in, const std::string& what) override {
    check_cpu(out, "reduce_scatter");
    check_cpu(in, "reduce_scatter");
    TORCH_CHECK(in.numel() == out.numel() * world_ && out.scalar_type() == in.scalar_type(),
                "mpi reduce_scatter: input must hold world_size x output elements of the same dtype");
    std::lock_guard<std::mutex> lock(*mu_);
    Watchdog::Scope scope(*watchdog_, "reduce_scatter", what);
    if (in.scalar_type() == at::kBFloat16 || in.scalar_type() == at::kHalf) {
      auto fi = in.to(at::kFloat);
      auto fo = at::empty({out.numel()}, fi.options());
      check(MPI_Reduce_scatter_block(fi.data_ptr(), fo.data_ptr(), count(fo), MPI_FLOAT, MPI_SUM, comm_),
            "reduce_scatter");
      out.view(-1).copy_(fo);
      return {};
    }
    check(
        MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), count(out), mpi_type(in.scalar_type()), MPI_SUM, comm_),
        "reduce_scatter");
    return {};
  }

  void broadcast(const at::Tensor& t, int root, const std::string& what) override {
    check_cpu(t, "broadcast");
    std::lock_guard<std::mutex> lock(*mu_);
    Watchdog::Scope scope(*watchdog_, "broadcast", what);
    check(MPI_Bcast(t.data_ptr(), count(t), mpi_type(t.scalar_type()), root, comm_), "broadcast");
  }

  void barrier(const std::string& what) override {
    std::lock_guard<std::mutex> lock(*mu_);
    Watchdog::Scope scope(*watchdog_, "barrier", what);
    check(MPI_Barrier(comm_), "barrier");
  }

  void send_recv(const at::Tensor& send, int dst, const at::Tensor& recv, int src, const std::string& what) override {
    check_cpu(send, "send_recv");
    check_cpu(recv, "send_recv");
    TORCH_CHECK(send.numel() == recv.numel() && send.scalar_type() == recv.scalar_type(),
                "mpi send_recv: the tensors sent and received must have the same size and dtype");
    TORCH_CHECK(dst >= 0 && dst < world_ && src >= 0 && src < world_, "mpi send_recv: peers ", dst, " and ", src,
                " in a group of ", world_);
    std::lock_guard<std::mutex> lock(*mu_);
    Watchdog::Scope scope(*watchdog_, "send_recv", what);
    const auto type = mpi_type(send.scalar_type());
    check(MPI_Sendrecv(send.data_ptr(), count(send), type, dst, /*sendtag=*/0, recv.data_ptr(), count(recv), type, src,
                       /*recvtag=*/0, comm_, MPI_STATUS_IGNORE),
          "send_recv");
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& what) override {
    MPI_Comm sub = MPI_COMM_NULL;
    {
      std::lock_guard<std::mutex> lock(*mu_);
      Watchdog::Scope scope(*watchdog_, "split", what);
      check(MPI_Comm_split(comm_, color, key, &sub), "split");
    }
    return std::make_shared<MpiCommunicator>(shared_from_this(), sub, what);
  }

 private:
  static int count(const at::Tensor& t) {
    TORCH_CHECK(t.numel() <= std::numeric_limits<int>::max(), "mpi: tensors over 2^31 elements are not supported");
    return static_cast<int>(t.numel());
  }

  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, world_ = 1;
  bool owns_ = false;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<std::mutex> mu_;
  std::shared_ptr<MpiCommunicator> parent_;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(const ProcessInfo& proc, std::chrono::milliseconds timeout) {
  return std::make_shared<MpiCommunicator>(proc, timeout);
}

}  // namespace anvil::distributed::detail
