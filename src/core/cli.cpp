#include "core/cli.h"

#include <c10/util/Exception.h>

#include <iostream>

#include "anvil/core/error.h"
#include "anvil_version.h"

namespace anvil {

int run_reporting_errors(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
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

const char* version() { return ANVIL_VERSION; }

}  // namespace anvil
