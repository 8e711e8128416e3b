// Checkpoint files: the optimizer state is safetensors + JSON (nothing goes
// through torch's serializer, which aborts on a short write and whose reader
// unpickles), old optimizer.pt checkpoints get a message saying what to do,
// and a failed write names the file and the cause and leaves the previous
// checkpoint as it was.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "data/mixture.h"
#include "io/safetensors.h"
#include "io/trainer_state.h"
#include "test_util.h"
#include "data/datasets.h"

namespace anvil::checkpoint {
namespace {

using anvil::testing::run;
using anvil::testing::TempDir;
namespace stdfs = std::filesystem;
using io::kTrainerStateFile;
using io::read_trainer_state;
using io::SafetensorsFile;
using io::trainer_state_of;

int train(const TempDir& dir, const std::string& extra, std::string* log, const std::string& prefix = "") {
  return anvil::testing::train_in(dir, anvil::testing::tiny_sft_run(2, 2), extra, log, prefix);
}

TEST(CheckpointFiles, OptimizerStateIsSafetensorsByParameterName) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(train(dir, "", &log), 0) << log;
  const auto ckpt = dir / "out" / "checkpoint-2";
  EXPECT_FALSE(stdfs::exists(ckpt / "optimizer.pt"));
  SafetensorsFile f(ckpt / "optimizer.safetensors");
  EXPECT_TRUE(f.contains("transformer.wte.weight.exp_avg"));
  EXPECT_TRUE(f.contains("transformer.h.1.mlp.c_proj.weight.exp_avg_sq"));
  EXPECT_EQ(f.shape("transformer.wte.weight.exp_avg"), (std::vector<int64_t>{326, 32}));
  const auto meta = nlohmann::json::parse(anvil::testing::read_text(ckpt / "optimizer.json"));
  EXPECT_EQ(meta["steps"]["transformer.wte.weight"].get<int64_t>(), 2);
  // Resuming reads it back (tests/train/resume_test.cpp checks the losses bit for bit).
  ASSERT_EQ(train(dir, "train.max_steps=3", &log), 0) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
}

TEST(CheckpointFiles, AnOldOptimizerArchiveIsExplainedNotRead) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(train(dir, "", &log), 0) << log;
  const auto ckpt = dir / "out" / "checkpoint-2";
  stdfs::remove(ckpt / "optimizer.safetensors");
  stdfs::remove(ckpt / "optimizer.json");
  anvil::testing::write_text(ckpt / "optimizer.pt", "PK not really a torch archive");
  EXPECT_NE(train(dir, "train.max_steps=3", &log), 0);
  EXPECT_NE(log.find((ckpt / "optimizer.pt").string() +
                     ": optimizer state in torch's archive format (written by Anvil before 2026-11-23) is no "
                     "longer read"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("model.from=" + ckpt.string()), std::string::npos) << log;
}

// A file-size limit (ulimit -f, with SIGXFSZ ignored so write() fails with
// EFBIG) stands in for a full disk: the save fails with the file and the
// cause, publishes nothing, and the previous checkpoint still resumes.
TEST(CheckpointFiles, AFailedWriteNamesTheFileAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(train(dir, "", &log), 0) << log;
  const auto model_bytes = stdfs::file_size(dir / "out" / "checkpoint-2" / "model.safetensors");
  ASSERT_GT(model_bytes, 64u * 1024u);
  EXPECT_NE(train(dir, "train.max_steps=4", &log, "trap '' XFSZ; ulimit -f 48; "), 0);
  EXPECT_NE(log.find("saving checkpoint-4 in " + (dir / "out").string() + " failed ("), std::string::npos) << log;
  EXPECT_NE(log.find("model.safetensors: write failed: File too large"), std::string::npos) << log;
  EXPECT_NE(log.find("the previous checkpoints are as they were"), std::string::npos) << log;
  for (const auto& e : stdfs::directory_iterator(dir / "out"))
    EXPECT_NE(e.path().filename().string().rfind(".checkpoint-", 0), 0u) << "left behind: " << e.path();
  EXPECT_FALSE(stdfs::exists(dir / "out" / "checkpoint-4"));
  ASSERT_EQ(train(dir, "train.max_steps=4", &log), 0) << log;
  EXPECT_NE(log.find("resumed from " + (dir / "out" / "checkpoint-2").string()), std::string::npos) << log;
  EXPECT_TRUE(stdfs::exists(dir / "out" / "checkpoint-4" / "trainer_state.json"));
}

TEST(TrainerStateFile, DamagedFieldsAreNamed) {
  // Every field a resume reads is type- and range-checked, with the file and
  // key in the message (fuzz/corpus/trainer_state holds what the fuzzer found).
  TempDir dir;
  const auto file = (dir / kTrainerStateFile).string();
  const auto error_of = [&](const std::string& text) -> std::string {
    anvil::testing::write_text(file, text);
    try {
      (void)data::sampler_state_of(trainer_state_of(read_trainer_state(dir.path())).data);
    } catch (const anvil::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(error_of(R"({"format_version": 1, "step": 3, "data": {"epoch": 0, "offset": 2}})"), "(no error)");
  EXPECT_EQ(error_of(R"({"format_version": "1", "step": 3})"),
            file + ": format_version: expected a non-negative integer, got \"1\"");
  EXPECT_EQ(error_of(R"({"format_version": 1, "step": -3})"), file + ": step: expected a non-negative integer, got -3");
  EXPECT_EQ(error_of(R"({"format_version": 1})"), file + ": step: missing (expected a non-negative integer)");
  EXPECT_EQ(error_of(R"({"format_version": 1, "step": 3, "data": []})"),
            file + ": data: expected an object (the data stream's position), got []");
  EXPECT_EQ(error_of(R"({"format_version": 1, "step": 3, "data": {"epoch": 0.5, "offset": 2}})"),
            "data.epoch: expected a non-negative integer, got 0.5");
}

}  // namespace
}  // namespace anvil::checkpoint
