#pragma once
// The fault and timing hooks tests set through the environment, every
// ANVIL_TEST_* variable the library and the trainer read, in one place
// (docs/reliability.md, "Testing hooks"). A value that does not parse is a
// ConfigError naming the variable; unset, none changes anything. The ones a
// step reads (signals, OOM rows, graph emulation) are read once per process;
// the others each time they are asked (a test may set them between runs in
// one process).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace anvil::test_hooks {

/// ANVIL_TEST_NONFINITE="loss@3,grad@5": step 3's loss (on rank 0 only, so
/// the ranks must agree through the reduction) and step 5's gradients (on
/// every rank) are made infinite, for the non-finite guard. Step -> "loss" or
/// "grad"; empty when unset.
std::map<int64_t, std::string> nonfinite_steps();

/// ANVIL_TEST_SIGNALS_AT_STEP=STEP:SIG[,SIG...], SIG INT, TERM or KILL: the
/// loop raises the signals, in order, once STEP steps are done, as the next
/// one begins (a real pair of signals from outside races the save the first
/// one starts; KILL is kill -9 at a known point). step -1 when unset.
struct StepSignals {
  int64_t step = -1;
  std::vector<int> signals;
};
const StepSignals& signals_at_step();

/// ANVIL_TEST_SIGNAL_AT_STARTUP=INT: the trainer raises SIGINT before it
/// parses its command line.
bool sigint_at_startup();

/// ANVIL_TEST_OOM_ROWS=N: a micro-batch of N rows or more raises the
/// out-of-memory error a device would, after its forward and before its
/// backward (train.micro_batch_size: auto); 0 when unset.
/// ANVIL_TEST_OOM_RANK=R limits it to rank R of a launch.
int64_t oom_rows();

/// ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS=N: a background checkpoint write
/// sleeps N ms before it writes, so a test can act while it runs; 0 when unset.
int checkpoint_write_delay_ms();

/// ANVIL_TEST_RESUME_UNIT_DELAY_MS=N: a sharded resume logs each unit before
/// it reads it ("test hook: the resume reads unit U of N") and waits N ms,
/// so a test can kill the ranks mid-resume; nothing when unset.
void before_resume_unit(size_t unit, size_t units);

/// ANVIL_TEST_CUDA_GRAPHS=emulate: a step "recording" on any device keeps the
/// step's function and a "replay" calls it (train.cuda_graphs on the CPU).
bool emulate_cuda_graphs();

/// ANVIL_TEST_ROLLOUT_FAULT=I:hang or I:kill: a rollout rank
/// (ppo.async.rollout_ranks) asked for the batch of iteration I sleeps
/// instead of sending it (the trainers' watchdog must end the run), or raises
/// SIGKILL once it has sampled it. iteration -1 when unset.
struct RolloutFault {
  int64_t iteration = -1;
  bool kill = false;
};
RolloutFault rollout_fault();

/// ANVIL_TEST_ROLLOUT_PERTURB=1: a rollout rank changes the first weight it
/// receives by 1e-3 after receiving it (ppo.async.check_weights must notice).
bool rollout_perturb();

}  // namespace anvil::test_hooks
