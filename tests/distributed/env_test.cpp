// Rank discovery from each launcher's environment variables.
#include <gtest/gtest.h>

#include <map>

#include "anvil/core/error.h"
#include "distributed/comm.h"
#include "distributed/env.h"
#include "test_util.h"

namespace anvil::distributed {
namespace {

ProcessInfo from(const std::map<std::string, std::string>& vars) {
  return discover([&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    from(vars);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnv, NoLauncherIsOneProcess) {
  const auto p = from({});
  EXPECT_EQ(p.launcher, "none");
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.world_size, 1);
  EXPECT_EQ(p.master_addr, "127.0.0.1");
  EXPECT_EQ(p.master_port, 29500);
}

TEST(DistEnv, Torchrun) {
  const auto p = from({{"RANK", "5"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "node0"},
                       {"MASTER_PORT", "29400"},
                       // torchrun inside an sbatch job: torchrun's variables win.
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(p.launcher, "torchrun");
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 4);
  EXPECT_EQ(p.master_addr, "node0");
  EXPECT_EQ(p.master_port, 29400);
}

TEST(DistEnv, OpenMpi) {
  const auto p = from({{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(p.launcher, "mpirun");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 3);
  EXPECT_EQ(p.local_rank, 2);
  EXPECT_EQ(p.master_addr, "127.0.0.1");
}

TEST(DistEnv, SlurmTakesTheFirstNodeAsMaster) {
  const auto p = from({{"SLURM_PROCID", "9"},
                       {"SLURM_NTASKS", "16"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_NTASKS_PER_NODE", "8(x2)"},
                       {"SLURM_JOB_NODELIST", "gpu[03-04],cpu1"}});
  EXPECT_EQ(p.launcher, "slurm");
  EXPECT_EQ(p.rank, 9);
  EXPECT_EQ(p.world_size, 16);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 8);
  EXPECT_EQ(p.master_addr, "gpu03");
  EXPECT_EQ(first_slurm_host("node7"), "node7");
  EXPECT_EQ(first_slurm_host("a[12,15-17]b,c"), "a12b");
  EXPECT_EQ(first_slurm_host("x-[001-004]"), "x-001");
}

TEST(DistEnv, BadValuesNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
                .find("RANK=\"one\": expected a non-negative integer"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}).find("RANK=2 is not below WORLD_SIZE=2"),
      std::string::npos);
  EXPECT_NE(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("MASTER_PORT=70000: expected a port"), std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("OMPI_COMM_WORLD_LOCAL_RANK=3 is not below the 2 processes per node"),
            std::string::npos);
}

// A launch the collective backend cannot serve fails before it writes
// anything, saying what would work.
TEST(DistEnv, TrainerRejectsALaunchItsBackendCannotServe) {
  anvil::testing::TempDir dir;
  auto launch = [&](const std::string& env, const std::string& extra) {
    std::string out;
    const auto cmd = "cd " + anvil::testing::source_dir() + " && " + env + " " + anvil::testing::trainer_bin() +
                     " --config configs/quickstart.yaml output_dir=" + (dir / "run").string() + " " + extra;
    EXPECT_NE(anvil::testing::run(cmd, &out), 0);
    EXPECT_FALSE(std::filesystem::exists(dir / "run"));
    return out;
  };
  auto out = launch("RANK=1 WORLD_SIZE=2 MASTER_ADDR=localhost", "");
  EXPECT_NE(out.find("dist.backend: mpi needs the ranks started by mpirun (this one came from torchrun); "
                     "e.g. mpirun -np 2 build/bin/trainer --config ..."),
            std::string::npos)
      << out;
  out = launch("SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_JOB_NODELIST=n1", "dist.backend=nccl");
  EXPECT_NE(out.find("dist.backend: nccl needs train.device cuda, got cpu"), std::string::npos) << out;
}

// One process: auto needs no library; a named one is built even alone, so
// `dist.backend: nccl` at world size 1 reaches ProcessGroupNCCL (here, on the
// CPU, its device check) instead of the in-process stand-in, and `mpi` under
// mpirun -np 1 is MPI.
TEST(DistEnv, ANamedBackendIsBuiltForOneProcess) {
  const auto one = from({});
  ASSERT_EQ(one.world_size, 1);
  EXPECT_EQ(make_communicator(one, at::kCPU, {})->backend(), "single");
  CommOptions nccl;
  nccl.backend = "nccl";
  try {
    make_communicator(one, at::kCPU, nccl);
    ADD_FAILURE() << "dist.backend: nccl on the CPU at world size 1 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dist.backend: nccl needs train.device cuda, got cpu"), std::string::npos)
        << e.what();
  }
  CommOptions mpi;
  mpi.backend = "mpi";
  EXPECT_EQ(make_communicator(one, at::kCPU, mpi)->backend(), "single");  // not under mpirun: nothing to join
  if (!has_backend("mpi")) GTEST_SKIP() << "this build has no MPI";
  anvil::testing::TempDir dir;
  std::string out;
  const auto cmd = "cd " + anvil::testing::source_dir() + " && " + anvil::testing::mpirun(1) + " " +
                   anvil::testing::trainer_bin() +
                   " --config configs/quickstart.yaml output_dir=" + (dir / "run").string() +
                   " dist.backend=mpi dist.sharding=full_shard train.max_steps=1 train.save_every=0 "
                   "eval.generate_samples=0 2>&1";
  ASSERT_EQ(anvil::testing::run(cmd, &out), 0) << out;
  EXPECT_NE(out.find("1 rank(s), mpi, full_shard"), std::string::npos) << out;
}

}  // namespace
}  // namespace anvil::distributed
