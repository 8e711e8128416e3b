#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "anvil/core/error.h"
#include "test_util.h"

namespace anvil::io {
namespace {

using anvil::testing::TempDir;
using anvil::testing::write_text;

std::string header_file(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + std::string(data_bytes, '\0');
}

std::string load_error(const std::filesystem::path& p) {
  try {
    SafetensorsFile f(p);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  TensorMap t = {{"f32", at::randn({3, 4})},
                 {"bf16", at::randn({5}).to(at::kBFloat16)},
                 {"f16", at::randn({2, 2}).to(at::kHalf)},
                 {"i64", at::arange(7, at::kLong)},
                 {"empty", at::zeros({0, 3})},
                 {"u8", at::arange(10, at::kByte)}};
  save_safetensors(dir / "a.safetensors", t, {{"format", "pt"}});
  SafetensorsFile f(dir / "a.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& [name, tensor] : t) {
    auto back = f.get(name);
    EXPECT_EQ(back.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back, tensor)) << name;
  }
}

TEST(Safetensors, RejectsCorruptFilesWithAMessage) {
  TempDir dir;
  auto p = dir / "bad.safetensors";
  write_text(p, "abc");
  EXPECT_NE(load_error(p).find("expected at least 8"), std::string::npos);

  write_text(p, std::string("\xff\xff\xff\xff\xff\x00\x00\x00", 8) + "{}");
  EXPECT_NE(load_error(p).find("header length"), std::string::npos) << load_error(p);

  write_text(p, header_file("not json", 0));
  EXPECT_NE(load_error(p).find("header is not a JSON object"), std::string::npos);

  write_text(p, header_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  EXPECT_NE(load_error(p).find("outside the data section"), std::string::npos) << load_error(p);

  write_text(p, header_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16));
  EXPECT_NE(load_error(p).find("expected 16"), std::string::npos) << load_error(p);

  write_text(p, header_file(R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", 16));
  EXPECT_NE(load_error(p).find("unsupported dtype \"Q4\""), std::string::npos);

  write_text(p, header_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                            16));
  EXPECT_NE(load_error(p).find("overlap"), std::string::npos);

  write_text(p, header_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0));
  EXPECT_NE(load_error(p).find("non-negative"), std::string::npos);

  EXPECT_NE(load_error(dir / "missing").find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace anvil::io
