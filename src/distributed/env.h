#pragma once
// Where this process sits in a multi-process run, read from the launcher's
// environment: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), OpenMPI's mpirun (OMPI_COMM_WORLD_*) or Slurm's
// srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST). No
// launcher variables: one process. docs/distributed.md.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace anvil::distributed {

struct ProcessInfo {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;                 // rank on this node (selects the GPU)
  int64_t local_world_size = 1;           // processes on this node
  std::string master_addr = "127.0.0.1";  // rendezvous (c10d TCPStore) host
  int64_t master_port = 29500;            // torchrun's default
  std::string launcher = "none";          // none | torchrun | mpirun | slurm
};

/// Reads a variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// Resolves the process's place from `env`. torchrun's variables win over
/// mpirun's, which win over Slurm's (torchrun started inside an sbatch job
/// still sees SLURM_*). MASTER_ADDR / MASTER_PORT override the rendezvous
/// under every launcher; under Slurm the default host is the first node of
/// SLURM_JOB_NODELIST. Throws ConfigError naming the variable and the value
/// when a set is incomplete, not an integer or inconsistent.
ProcessInfo discover(const EnvLookup& env);

/// discover() on the process environment.
ProcessInfo discover_from_environment();

/// The first host of a Slurm node list: "gpu[03-07,12],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace anvil::distributed
