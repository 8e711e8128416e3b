#include "core/test_hooks.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "anvil/core/error.h"
#include "core/logging.h"

namespace anvil::test_hooks {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t count(const char* name, const std::string& text, const char* what) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || n < 0) throw ConfigError(concat(name, ": expected ", what, ", got \"", text, "\""));
  return n;
}

}  // namespace

std::map<int64_t, std::string> nonfinite_steps() {
  std::map<int64_t, std::string> out;
  const char* v = env("ANVIL_TEST_NONFINITE");
  if (!v) return out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto at = item.find('@');
    const auto what = item.substr(0, at);
    if (at == std::string::npos || (what != "loss" && what != "grad"))
      throw ConfigError(concat("ANVIL_TEST_NONFINITE: expected loss@STEP or grad@STEP items, got \"", item, "\""));
    out[count("ANVIL_TEST_NONFINITE", item.substr(at + 1), "loss@STEP or grad@STEP items")] = what;
  }
  return out;
}

const StepSignals& signals_at_step() {
  static const auto signals = [] {
    StepSignals out;
    const char* v = env("ANVIL_TEST_SIGNALS_AT_STEP");
    if (!v) return out;
    const std::string spec(v);
    const auto colon = spec.find(':');
    const auto bad = [&] {
      return ConfigError(concat(
          "ANVIL_TEST_SIGNALS_AT_STEP: expected STEP:SIG[,SIG...] with SIG INT, TERM or KILL, got \"", spec, "\""));
    };
    if (colon == std::string::npos) throw bad();
    out.step = count("ANVIL_TEST_SIGNALS_AT_STEP", spec.substr(0, colon), "STEP:SIG[,SIG...]");
    std::stringstream ss(spec.substr(colon + 1));
    std::string sig;
    while (std::getline(ss, sig, ',')) {
      if (sig != "INT" && sig != "TERM" && sig != "KILL") throw bad();
      out.signals.push_back(sig == "TERM" ? SIGTERM : sig == "KILL" ? SIGKILL : SIGINT);
    }
    if (out.signals.empty()) throw bad();
    return out;
  }();
  return signals;
}

bool sigint_at_startup() {
  const char* v = env("ANVIL_TEST_SIGNAL_AT_STARTUP");
  if (!v) return false;
  if (std::string(v) != "INT") throw ConfigError(concat("ANVIL_TEST_SIGNAL_AT_STARTUP: expected INT, got \"", v, "\""));
  return true;
}

int64_t oom_rows() {
  static const int64_t rows = [] {
    const char* v = env("ANVIL_TEST_OOM_ROWS");
    if (!v) return int64_t{0};
    const auto n = count("ANVIL_TEST_OOM_ROWS", v, "a number of rows");
    // ANVIL_TEST_OOM_RANK=R: only on the rank R of a launch (mpirun's or torchrun's rank variable).
    if (const char* only = env("ANVIL_TEST_OOM_RANK")) {
      const char* mine = env("OMPI_COMM_WORLD_RANK") ? env("OMPI_COMM_WORLD_RANK") : env("RANK");
      if (count("ANVIL_TEST_OOM_RANK", only, "a rank") != (mine ? count("the rank", mine, "a rank") : 0))
        return int64_t{0};
    }
    return n;
  }();
  return rows;
}

int checkpoint_write_delay_ms() {
  const char* v = env("ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS");
  return v ? static_cast<int>(count("ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS", v, "milliseconds")) : 0;
}

void before_resume_unit(size_t unit, size_t units) {
  const char* v = env("ANVIL_TEST_RESUME_UNIT_DELAY_MS");
  if (!v) return;
  const auto ms = count("ANVIL_TEST_RESUME_UNIT_DELAY_MS", v, "milliseconds");
  log::warn("test hook: the resume reads unit ", unit + 1, " of ", units);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

bool emulate_cuda_graphs() {
  static const bool on = [] {
    const char* v = env("ANVIL_TEST_CUDA_GRAPHS");
    if (!v) return false;
    if (std::string(v) != "emulate")
      throw ConfigError(concat("ANVIL_TEST_CUDA_GRAPHS: expected emulate, got \"", v, "\""));
    return true;
  }();
  return on;
}

RolloutFault rollout_fault() {
  RolloutFault out;
  const char* v = env("ANVIL_TEST_ROLLOUT_FAULT");
  if (!v) return out;
  const std::string spec(v);
  const auto colon = spec.find(':');
  const auto what = colon == std::string::npos ? std::string() : spec.substr(colon + 1);
  if (what != "hang" && what != "kill")
    throw ConfigError(
        concat("ANVIL_TEST_ROLLOUT_FAULT: expected ITERATION:hang or ITERATION:kill, got \"", spec, "\""));
  out.iteration = count("ANVIL_TEST_ROLLOUT_FAULT", spec.substr(0, colon), "ITERATION:hang or ITERATION:kill");
  out.kill = what == "kill";
  return out;
}

bool rollout_perturb() {
  const char* v = env("ANVIL_TEST_ROLLOUT_PERTURB");
  return v && count("ANVIL_TEST_ROLLOUT_PERTURB", v, "0 or 1") != 0;
}

}  // namespace anvil::test_hooks
