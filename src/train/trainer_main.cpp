// The trainer command line as a library function: trainer --config a.yaml
// [--config b.yaml ...] [key.path=value ...]. apps/trainer is a call to it; a
// program that registers its own objectives calls it too (docs/library.md).
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "anvil/config/config.h"
#include "core/cli.h"
#include "train/run_setup.h"
#include "core/test_hooks.h"
#include "anvil/core/error.h"
#include "anvil/chat/chat.h"
#include "anvil/models/registry.h"
#include "anvil/train/trainer.h"

namespace {

// Outside the training loop (start-up: loading, building; shutdown), SIGINT
// and SIGTERM end the process at once, with a line that says so. The loop
// installs its own handler, which finishes the step and saves.
extern "C" void on_signal_outside_loop(int sig) {
  const char* msg = sig == SIGINT ? "\ntrainer: interrupted (SIGINT) outside the training loop; nothing was trained "
                                    "or saved since the last complete checkpoint\n"
                                  : "\ntrainer: terminated (SIGTERM) outside the training loop; nothing was trained "
                                    "or saved since the last complete checkpoint\n";
  [[maybe_unused]] auto n = ::write(2, msg, std::strlen(msg));
  ::_exit(128 + sig);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

namespace anvil::train {

int trainer_main(int argc, char** argv) {
  // MKL's BLAS may use fewer threads on a busy machine (MKL_DYNAMIC's default) and may pick its kernels by
  // the data's alignment (without MKL_CBWR), either of which changes how a GEMM blocks its sums and so its
  // last bits: two runs of one config, or a resumed run and an uninterrupted one, would then differ in
  // round-off. Fixed threads and reproducible kernels unless the user chose otherwise; MKL reads both when it
  // first runs.
  ::setenv("MKL_DYNAMIC", "FALSE", /*overwrite=*/0);
  ::setenv("MKL_CBWR", "AUTO", /*overwrite=*/0);
  std::signal(SIGINT, on_signal_outside_loop);
  std::signal(SIGTERM, on_signal_outside_loop);
  // Testing hook: a signal at a chosen moment of start-up.
  if (anvil::test_hooks::sigint_at_startup()) std::raise(SIGINT);

  CLI::App app{
      "Anvil trainer: trains a model from YAML configs. Later --config files and key.path=value "
      "overrides win. Re-running with the same output_dir resumes."};
  app.footer("Algorithms (algorithm:): " + join(anvil::config::algorithm_names()) +
             "\n"
             "Chat templates (data.template:): auto, hf (the model's own Jinja), " +
             join(anvil::chat::ChatTemplate::names()) +
             "\n"
             "Model families (model.family:): " +
             join(anvil::models::family_names()) +
             "; debug-size flavors in configs/models/\n"
             "Example: trainer --config configs/quickstart.yaml train.max_steps=200\n"
             "Docs: docs/getting-started.md, every key: docs/config.md (or --print-config-reference)");
  std::vector<std::string> configs, overrides;
  bool print_config = false, print_reference = false, dry_run = false, eval_only = false;
  app.add_option("--config,-c", configs, "YAML config file (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("overrides", overrides, "key.path=value overrides");
  app.add_flag("--print-config", print_config, "Print the merged, validated config and exit");
  app.add_flag("--print-config-reference", print_reference, "Print the reference of every config key (Markdown)");
  app.add_flag("--dry-run", dry_run,
               "Load config, tokenizer and data, build the model, start and ask once every reward or environment "
               "program the config names, and print the plan (parameters, tokens per step, memory, the first "
               "training sample); train and write nothing");
  bool plan_memory = false;
  int64_t world_size = 1;
  app.add_flag("--plan-memory", plan_memory,
               "Print the bytes each rank will hold (state by kind, whole parameters gathered at once, gradient "
               "reductions, an activation estimate, generation's copy) for --world-size ranks under the config's "
               "dist keys, from the model's shapes alone; load and train nothing");
  app.add_option("--world-size", world_size, "Ranks --plan-memory plans for (default 1)");
  app.set_version_flag("--version", std::string("trainer ") + anvil::version(), "Print the version and exit");
  app.add_flag("--eval-only", eval_only,
               "Evaluate output_dir's latest checkpoint (or train.resume_from, or model.from) once and write "
               "<output_dir>/eval-step-<N>.json; train nothing");
  if (argc == 1) {  // no arguments: usage, not a config error
    std::cerr << app.help();
    return 2;
  }
  CLI11_PARSE(app, argc, argv);

  return anvil::run_reporting_errors([&] {
    if (print_reference) {
      std::cout << anvil::config::reference_markdown();
      return 0;
    }
    auto cfg = anvil::config::load_config(configs, overrides);
    if (print_config) {
      std::cout << anvil::config::to_yaml(cfg);
      return 0;
    }
    if (plan_memory) {
      anvil::train::print_memory_plan(cfg, world_size);
      return 0;
    }
    if (dry_run && eval_only) throw anvil::ConfigError("--dry-run and --eval-only: choose one");
    anvil::train::RunOptions options;
    options.dry_run = dry_run;
    options.eval_only = eval_only;
    anvil::train::run_training(cfg, options);
    return 0;
  });
}

}  // namespace anvil::train
