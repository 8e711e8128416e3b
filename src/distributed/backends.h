#pragma once
// Constructors of the library-backed communicators, each in its own TU so
// only that TU sees mpi.h or the c10d/NCCL headers.

#include <memory>

#include "anvil_dist_build_config.h"

#include "distributed/comm.h"

namespace anvil::distributed::detail {

#ifdef ANVIL_WITH_MPI
std::shared_ptr<Communicator> make_mpi_communicator(const ProcessInfo& proc, std::chrono::milliseconds timeout);
#endif
#ifdef ANVIL_WITH_NCCL
std::shared_ptr<Communicator> make_nccl_communicator(const ProcessInfo& proc, const at::Device& device,
                                                     std::chrono::milliseconds timeout);
#endif

}  // namespace anvil::distributed::detail
