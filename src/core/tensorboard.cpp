// TensorBoard event files (tensorboard.h). The protos, by field number:
//   Event { double wall_time = 1; int64 step = 2; string file_version = 3;
//           Summary summary = 5; SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }
//   Value { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//           SummaryMetadata metadata = 9; }
//   SummaryMetadata { PluginData plugin_data = 1; }  PluginData { string plugin_name = 1; }
//   TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2;
//                 repeated bytes string_val = 8; }
//   SessionLog { SessionStatus status = 1 (START = 1); }
// A record: uint64 length, uint32 masked CRC of the length, the bytes, uint32
// masked CRC of the bytes; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
#include "core/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "anvil/core/error.h"

namespace anvil {
namespace {

namespace stdfs = std::filesystem;

const std::array<uint32_t, 256>& crc_table() {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---- protobuf wire format -----------------------------------------------------

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
void bytes_field(std::string& out, int field, const std::string& b) {
  key(out, field, 2);
  varint(out, b.size());
  out += b;
}
void double_field(std::string& out, int field, double v) {
  key(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);  // little-endian hosts only (x86-64, aarch64)
  out.append(b, 8);
}
void float_field(std::string& out, int field, float v) {
  key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
void int_field(std::string& out, int field, int64_t v) {
  key(out, field, 0);
  varint(out, static_cast<uint64_t>(v));
}

std::string event_head(int64_t step) {
  std::string e;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double_field(e, 1, now);
  int_field(e, 2, step);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

TensorBoardWriter::TensorBoardWriter(const stdfs::path& dir, std::optional<int64_t> resumed_at) {
  stdfs::create_directories(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  // TensorBoard reads a folder's files in name order: the time leads, to the
  // microsecond, so a resumed run's file comes after the run it continues.
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%lld.%06lld", static_cast<long long>(us / 1000000),
                static_cast<long long>(us % 1000000));
  for (int n = 0;; ++n) {  // a new file for every start
    path_ = dir / concat("events.out.tfevents.", stamp, ".", host, ".", ::getpid(), ".", n);
    if (!stdfs::exists(path_)) break;
  }
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error(concat(path_.string(), ": cannot create the TensorBoard event file"));
  auto e = event_head(resumed_at ? *resumed_at : 0);
  bytes_field(e, 3, "brain.Event:2");
  write_event(e);
  // Every start writes SessionLog.START at its first step. TensorBoard's
  // loader takes the first START it reads for the run's start and each later
  // one for a restart, dropping what earlier files logged at or after its
  // step: a resumed run's points replace those its killed predecessor wrote
  // past the checkpoint.
  auto s = event_head(resumed_at ? *resumed_at + 1 : 0);
  std::string log;
  int_field(log, 1, 1);  // SessionLog.START
  bytes_field(s, 7, log);
  write_event(s);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    float_field(value, 2, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  auto e = event_head(step);
  bytes_field(e, 5, summary);
  write_event(e);
  flush();
}

void TensorBoardWriter::text(int64_t step, const std::string& tag, const std::string& markdown) {
  std::string plugin, metadata, tensor, value, summary;
  bytes_field(plugin, 1, "text");
  bytes_field(metadata, 1, plugin);
  int_field(tensor, 1, 7);     // DT_STRING
  bytes_field(tensor, 2, "");  // a scalar: no dims
  bytes_field(tensor, 8, markdown);
  bytes_field(value, 1, tag);
  bytes_field(value, 8, tensor);
  bytes_field(value, 9, metadata);
  bytes_field(summary, 1, value);
  auto e = event_head(step);
  bytes_field(e, 5, summary);
  write_event(e);
  flush();
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) throw Error(concat(path_.string(), ": writing the TensorBoard event file failed"));
}

void TensorBoardWriter::write_event(const std::string& event) {
  const uint64_t n = event.size();
  char head[12];
  std::memcpy(head, &n, 8);
  const uint32_t c1 = masked_crc(head, 8);
  std::memcpy(head + 8, &c1, 4);
  const uint32_t c2 = masked_crc(event.data(), event.size());
  if (std::fwrite(head, 1, 12, file_) != 12 || std::fwrite(event.data(), 1, event.size(), file_) != event.size() ||
      std::fwrite(&c2, 1, 4, file_) != 4)
    throw Error(concat(path_.string(), ": writing the TensorBoard event file failed"));
}

}  // namespace anvil
