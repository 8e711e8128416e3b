#pragma once
// Errors at the library's boundaries with user input (config, data,
// checkpoints, tokenizer files). Each carries a message that names the file,
// the line or key, and what was expected. Tensor invariants use TORCH_CHECK.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace anvil {

/// Concatenates anything streamable into one string.
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// Base class of every error Anvil raises on bad input.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Invalid configuration (file, key, value).
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Malformed dataset record (file, line, field).
class DataError : public Error {
 public:
  using Error::Error;
};

/// Unreadable or inconsistent checkpoint / weights file.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// Filesystem or OS failure.
class IoError : public Error {
 public:
  using Error::Error;
};

}  // namespace anvil
