#include "data/jsonl.h"

#include <fstream>

#include "anvil/core/error.h"

namespace anvil::data {

OnError parse_on_error(const std::string& s) {
  if (s == "fail") return OnError::fail;
  if (s == "skip") return OnError::skip;
  throw ConfigError(concat("data.on_error: expected fail or skip, got \"", s, "\""));
}

void Record::fail(const std::string& field, const std::string& what) const {
  throw DataError(concat(where_, ": field \"", field, "\": ", what));
}

const nlohmann::json& Record::at(const std::string& field) const {
  if (!j_.contains(field)) throw DataError(concat(where_, ": missing field \"", field, "\""));
  return j_[field];
}

std::string Record::string(const std::string& field) const {
  const auto& v = at(field);
  if (!v.is_string()) fail(field, concat("expected a string, got ", v.type_name()));
  return v.get<std::string>();
}

double Record::number(const std::string& field) const {
  const auto& v = at(field);
  if (!v.is_number()) fail(field, concat("expected a number, got ", v.type_name()));
  return v.get<double>();
}

std::optional<double> Record::optional_number(const std::string& field) const {
  if (!has(field)) return std::nullopt;
  return number(field);
}

nlohmann::ordered_json Record::ordered(const std::string& field) const {
  if (!line_.empty()) return nlohmann::ordered_json::parse(line_).at(field);
  return nlohmann::ordered_json::parse(at(field).dump());
}

ReadStats read_jsonl(const std::filesystem::path& path, OnError on_error,
                     const std::function<void(const Record&)>& fn) {
  std::ifstream in(path);
  if (!in) throw DataError(concat(path.string(), ": cannot open data file"));
  ReadStats stats;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++stats.lines;
    const auto where = concat(path.string(), ":", lineno);
    try {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error ..." -> the reason.
        std::string reason = e.what();
        if (const auto k = reason.find(": "); k != std::string::npos) reason = reason.substr(k + 2);
        throw DataError(concat(where, ": not valid JSON at column ", e.byte, ": ", reason));
      } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
        std::string reason = e.what();
        if (const auto k = reason.find("] "); k != std::string::npos) reason = reason.substr(k + 2);
        throw DataError(concat(where, ": not valid JSON: ", reason));
      }
      if (!j.is_object()) throw DataError(concat(where, ": expected a JSON object, got ", j.type_name()));
      fn(Record(j, where, line));
    } catch (const DataError& e) {
      if (on_error == OnError::fail) throw;
      ++stats.skipped;
      if (stats.first_errors.size() < 3) stats.first_errors.emplace_back(e.what());
    }
  }
  return stats;
}

}  // namespace anvil::data
