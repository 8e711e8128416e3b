// The ANVIL_TEST_* hooks (src/core/test_hooks.h) parse their values and name
// the variable on a bad one. Hooks read once per process are checked through a
// trainer process, so this test binary's own state is never changed by them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "anvil/core/error.h"
#include "test_util.h"
#include "core/test_hooks.h"

namespace anvil::train {
namespace {

// Sets a variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TestHooks, ValuesParseAndABadOneNamesTheVariable) {
  {
    ScopedEnv e("ANVIL_TEST_NONFINITE", "grad@2,loss@5");
    const auto steps = test_hooks::nonfinite_steps();
    EXPECT_EQ(steps, (std::map<int64_t, std::string>{{2, "grad"}, {5, "loss"}}));
  }
  EXPECT_TRUE(test_hooks::nonfinite_steps().empty());
  for (const char* bad : {"grad@", "grad@x", "weights@3", "loss@-1"}) {
    ScopedEnv e("ANVIL_TEST_NONFINITE", bad);
    EXPECT_NE(error_of([] { test_hooks::nonfinite_steps(); }).find("ANVIL_TEST_NONFINITE: expected loss@STEP"),
              std::string::npos)
        << bad;
  }
  {
    ScopedEnv e("ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS", "250");
    EXPECT_EQ(test_hooks::checkpoint_write_delay_ms(), 250);
  }
  EXPECT_EQ(test_hooks::checkpoint_write_delay_ms(), 0);
  {
    ScopedEnv e("ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS", "soon");
    EXPECT_EQ(error_of([] { test_hooks::checkpoint_write_delay_ms(); }),
              "ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS: expected milliseconds, got \"soon\"");
  }
  {
    ScopedEnv e("ANVIL_TEST_RESUME_UNIT_DELAY_MS", "later");
    EXPECT_EQ(error_of([] { test_hooks::before_resume_unit(0, 2); }),
              "ANVIL_TEST_RESUME_UNIT_DELAY_MS: expected milliseconds, got \"later\"");
  }
  {
    ScopedEnv e("ANVIL_TEST_SIGNAL_AT_STARTUP", "TERM");
    EXPECT_EQ(error_of([] { test_hooks::sigint_at_startup(); }),
              "ANVIL_TEST_SIGNAL_AT_STARTUP: expected INT, got \"TERM\"");
  }
  EXPECT_FALSE(test_hooks::sigint_at_startup());
  {
    ScopedEnv e("ANVIL_TEST_ROLLOUT_FAULT", "2:stall");
    EXPECT_EQ(error_of([] { test_hooks::rollout_fault(); }),
              "ANVIL_TEST_ROLLOUT_FAULT: expected ITERATION:hang or ITERATION:kill, got \"2:stall\"");
  }
  {
    ScopedEnv e("ANVIL_TEST_ROLLOUT_FAULT", "3:kill");
    EXPECT_EQ(test_hooks::rollout_fault().iteration, 3);
    EXPECT_TRUE(test_hooks::rollout_fault().kill);
  }
  EXPECT_EQ(test_hooks::rollout_fault().iteration, -1);
  {
    ScopedEnv e("ANVIL_TEST_ROLLOUT_PERTURB", "yes");
    EXPECT_EQ(error_of([] { test_hooks::rollout_perturb(); }),
              "ANVIL_TEST_ROLLOUT_PERTURB: expected 0 or 1, got \"yes\"");
  }
  EXPECT_FALSE(test_hooks::rollout_perturb());
}

// The hooks a step reads once per process, through the trainer: a bad value stops it with the variable's name.
TEST(TestHooks, ATrainerGivenABadHookValueSaysWhichAndWhy) {
  struct Case {
    std::string env, extra, want;
  };
  for (const auto& c : std::vector<Case>{
           {"ANVIL_TEST_OOM_ROWS=many", "", "ANVIL_TEST_OOM_ROWS: expected a number of rows, got \"many\""},
           {"ANVIL_TEST_SIGNALS_AT_STEP=2:HUP", "",
            "ANVIL_TEST_SIGNALS_AT_STEP: expected STEP:SIG[,SIG...] with SIG INT, TERM or KILL, got \"2:HUP\""},
           {"ANVIL_TEST_CUDA_GRAPHS=yes", "train.cuda_graphs=on",
            "ANVIL_TEST_CUDA_GRAPHS: expected emulate, got \"yes\""}}) {
    anvil::testing::TempDir dir;
    std::string log;
    EXPECT_NE(anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(2, 2), c.extra, &log, c.env + " "), 0)
        << c.env;
    EXPECT_NE(log.find(c.want), std::string::npos) << c.env << "\n" << log;
  }
}

}  // namespace
}  // namespace anvil::train
