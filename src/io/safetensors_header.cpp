#include "io/safetensors_header.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "anvil/core/error.h"

namespace anvil::io {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

struct DtypeSize {
  const char* name;
  size_t bytes;
};
constexpr DtypeSize kDtypeSizes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
};

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  for (const auto& d : kDtypeSizes)
    if (dtype == d.name) return d.bytes;
  return 0;
}

SafetensorsHeader parse_safetensors_header(const char* bytes, size_t size, const std::string& where) {
  if (size < 8)
    throw CheckpointError(concat(where, ": not a safetensors file (", size, " bytes, expected at least 8)"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxHeaderBytes || n > size - 8)
    throw CheckpointError(concat(where, ": header length ", n, " exceeds the file (", size, " bytes)"));
  SafetensorsHeader out;
  out.data_start = 8 + n;
  const auto header = nlohmann::json::parse(bytes + 8, bytes + 8 + n, nullptr, false);
  if (header.is_discarded() || !header.is_object())
    throw CheckpointError(concat(where, ": header is not a JSON object"));
  const size_t data_size = size - out.data_start;
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();  // not a structured binding: the lambda below captures it
    const auto& e = item.value();
    if (name == "__metadata__") {
      if (!e.is_object()) throw CheckpointError(concat(where, ": __metadata__ must be an object"));
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string()) throw CheckpointError(concat(where, ": __metadata__.", k, " must be a string"));
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const auto bad = [&](const std::string& what) {
      return CheckpointError(concat(where, ": tensor \"", name, "\": ", what));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw bad("expected an object with dtype, shape and data_offsets");
    if (!e["dtype"].is_string()) throw bad("dtype must be a string");
    SafetensorsEntry entry;
    entry.dtype = e["dtype"].get<std::string>();
    const size_t element = safetensors_dtype_size(entry.dtype);
    if (element == 0) throw bad(concat("unsupported dtype \"", entry.dtype, "\""));
    if (!e["shape"].is_array()) throw bad("shape must be a list");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      const auto v = d.get<uint64_t>();
      if (v > (1ull << 40)) throw bad("dimension too large");
      entry.shape.push_back(static_cast<int64_t>(v));
      numel *= v;
      if (numel > (1ull << 48)) throw bad("too many elements");
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets must be [begin, end]");
    entry.begin = off[0].get<size_t>();
    entry.end = off[1].get<size_t>();
    if (entry.begin > entry.end || entry.end > data_size)
      throw bad(
          concat("data_offsets [", entry.begin, ", ", entry.end, "] outside the data section (", data_size, " bytes)"));
    if (entry.end - entry.begin != numel * element)
      throw bad(concat("data_offsets span ", entry.end - entry.begin, " bytes, expected ", numel * element,
                       " for its dtype and shape"));
    spans.emplace_back(entry.begin, entry.end);
    out.entries.emplace(name, std::move(entry));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      throw CheckpointError(concat(where, ": tensors overlap in the data section"));
  return out;
}

}  // namespace anvil::io
