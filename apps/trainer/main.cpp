// trainer --config a.yaml [--config b.yaml ...] [key.path=value ...]
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <iostream>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"Anvil trainer: trains a model from YAML configs. Later --config files and key.path=value "
               "overrides win. Re-running with the same output_dir resumes."};
  std::vector<std::string> configs, overrides;
  bool print_config = false, print_reference = false;
  app.add_option("--config,-c", configs, "YAML config file (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("overrides", overrides, "key.path=value overrides");
  app.add_flag("--print-config", print_config, "Print the merged, validated config and exit");
  app.add_flag("--print-config-reference", print_reference, "Print the reference of every config key (Markdown)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (print_reference) {
      std::cout << anvil::config::reference_markdown();
      return 0;
    }
    auto cfg = anvil::config::load_config(configs, overrides);
    if (print_config) {
      std::cout << anvil::config::to_yaml(cfg);
      return 0;
    }
    anvil::train::run_training(cfg);
    return 0;
  } catch (const anvil::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
