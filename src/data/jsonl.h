#pragma once
// Reading JSONL datasets with messages that name the file, the line and the
// field; `on_error: skip` counts bad lines instead of stopping.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::data {

enum class OnError { fail, skip };
OnError parse_on_error(const std::string& s);  // "fail" | "skip"

/// One JSON object of a JSONL file. Accessors throw DataError naming
/// "file:line: field \"name\": expected ..., got ...".
class Record {
 public:
  Record(const nlohmann::json& j, std::string where, std::string_view line = {})
      : j_(j), where_(std::move(where)), line_(line) {}
  const std::string& where() const { return where_; }
  const nlohmann::json& json() const { return j_; }
  /// Field `field` (present) with its objects' keys in the order of the
  /// line, as Python's json.loads keeps them (json() sorts them).
  nlohmann::ordered_json ordered(const std::string& field) const;
  bool has(const std::string& field) const { return j_.contains(field) && !j_[field].is_null(); }
  std::string string(const std::string& field) const;
  double number(const std::string& field) const;
  std::optional<double> optional_number(const std::string& field) const;
  const nlohmann::json& at(const std::string& field) const;  // present (any type)
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::string_view line_;  // the JSON text, when read from a file
};

/// What reading a file did: lines seen and lines skipped (with the first
/// few reasons, for the log).
struct ReadStats {
  int64_t lines = 0;
  int64_t skipped = 0;
  std::vector<std::string> first_errors;
};

/// Calls `fn` for every non-blank line. A line that is not a JSON object, or
/// for which `fn` throws DataError, stops the read (fail) or is counted and
/// skipped (skip).
ReadStats read_jsonl(const std::filesystem::path& path, OnError on_error, const std::function<void(const Record&)>& fn);

}  // namespace anvil::data
