#pragma once
// Checkpoints off the critical path. A save hands what the checkpoint holds
// (weights and optimizer moments as live tensors, RNG and trainer state as
// values) to one background thread and returns. The thread copies the
// tensors into host memory, then writes the temp folder, fsyncs it and
// publishes it (rename, prune) with the code that writes a save at once
// (checkpoint::save_checkpoint; for a rank of a sharded run its shard and, on rank
// 0, the publication once every rank has written: distributed/checkpoint.h). The loop goes on with the next step's
// forward and backward meanwhile, which only read the weights; the engine calls wait_copied() before anything changes
// them in place (the optimizer step, set_parameters). From a GPU the copies are queued on the save's stream into pinned
// buffers, so they precede any later update and the loop need not wait. At most one write is in flight: the next save
// waits for it first. A write's failure is thrown by the next call that looks at it (the next save, collect, the end of
// the run), never dropped.
//
// The host buffers are kept and reused by the next save: copying into
// memory already mapped costs a memcpy, not page faults (or, from a GPU, a
// pinned allocation). The price is one host copy of the saved state for the
// whole run; train.background_saves: false writes at once instead and keeps
// none. What only the job holds (Job::owned: the units a rank gathered for
// the HF folder) is written from where it is on the CPU, not copied.
//
// Test hook: ANVIL_TEST_CHECKPOINT_WRITE_DELAY_MS=N makes the thread sleep N
// ms before it copies (so the loop's next update must wait for the copy) and
// again before trainer_state.json (so a test can kill the process with the
// folder written but for the file that marks it complete).
// ANVIL_CHECKPOINT_SYNC=1 makes every engine write at once, whatever
// train.background_saves says (bench/checkpoint_stall.sh compares the two).

#include <atomic>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/metrics.h"
#include "checkpoint/checkpoint.h"

namespace anvil::train {

/// False when ANVIL_CHECKPOINT_SYNC=1 asks for checkpoints written at once.
bool background_checkpoints();

class CheckpointWriter {
 public:
  CheckpointWriter();
  /// Waits for the write in flight; a failure nobody collected is logged
  /// (the run is ending on another error then).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// A background write: the tensors to copy into host memory first (each
  /// map's entries are replaced by their host copies, in place), then what
  /// writes and publishes the files from them.
  struct Job {
    std::filesystem::path dir;  // the folder it publishes (for the log)
    int64_t step = 0;
    std::vector<io::TensorMap*> tensors;  // into `payload`
    /// Those of `tensors` that only the job holds (buffers gathered for this
    /// save): on the CPU they are written as they are, not copied, and
    /// dropped once written.
    std::vector<io::TensorMap*> owned;
    /// Writes the files; `before_complete` goes just before the file that
    /// marks the folder complete (the test hook's pause).
    std::function<void(const std::function<void(const std::filesystem::path&)>& before_complete)> write;
    std::shared_ptr<void> payload;  // what `tensors` point into and `write` reads
  };
  /// Waits for the previous write (throwing its failure), then starts `job`,
  /// whose tensors are the live ones (on any device). Returns job.dir.
  std::filesystem::path start(Job job);
  /// start() for a single-process checkpoint (checkpoint::save_checkpoint).
  std::filesystem::path start(const std::filesystem::path& output_dir, checkpoint::CheckpointParts parts,
                              int64_t keep_last);
  /// Waits for the write in flight, throwing its failure; its time is still
  /// reported by the next collect().
  void finish() { join(/*wait=*/true); }
  /// Blocks until the live tensors of the last start() are copied, so they
  /// may change; returns the seconds it waited.
  double wait_copied();
  /// time/checkpoint_write_s (copy and write) of writes finished since the
  /// last call (empty if none); with `wait`, after waiting for the one in
  /// flight. Throws the CheckpointError of a write that failed.
  Metrics collect(bool wait);

 private:
  /// Joins a finished (or, with `wait`, the running) write; records its
  /// time, or throws its failure.
  void join(bool wait);

  int delay_ms_ = 0;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::mutex mutex_;
  std::condition_variable copied_cv_;
  bool copied_ = true;
  // Set by the thread, read after join.
  std::optional<std::string> error_;  // a failed write's message
  double copy_s_ = 0, write_s_ = 0, bytes_ = 0;
  double copy_wait_s_ = 0;  // the loop's, in wait_copied
  std::filesystem::path dir_;
  Metrics done_;
  /// The last write's payload and its tensor maps (host copies once the
  /// write is done): the next save reuses, map by map, buffers of the same
  /// name, shape and dtype.
  std::shared_ptr<void> payload_;
  std::vector<io::TensorMap*> maps_;
  /// Entries of the last write's maps that it owned (written without a copy): dropped once written.
  std::vector<std::pair<io::TensorMap*, std::string>> owned_;
};

/// An engine's background writes (a CheckpointWriter made on first use). The
/// engine keeps it as its last member: the writer's thread reads the model
/// until joined.
class BackgroundSaves {
 public:
  /// Writes in the background when `background` (train.background_saves) and
  /// ANVIL_CHECKPOINT_SYNC=1 does not ask otherwise; else at once.
  explicit BackgroundSaves(bool background) : background_(background && background_checkpoints()) {}
  bool background() const { return background_; }
  /// A single-process checkpoint (checkpoint::save_checkpoint's layout), in the
  /// background or at once (background()).
  std::filesystem::path save(const std::filesystem::path& output_dir, checkpoint::CheckpointParts parts,
                             int64_t keep_last);
  std::filesystem::path start(CheckpointWriter::Job job) { return writer().start(std::move(job)); }
  /// Waits for the write in flight (its publication prunes stale temporary
  /// folders: a sharded save waits before it creates its own).
  void finish() {
    if (writer_) writer_->finish();
  }
  /// Waits until the live tensors of a background save are copied (before
  /// anything changes them in place); returns the seconds waited.
  double wait_copied() { return writer_ ? writer_->wait_copied() : 0.0; }
  Metrics collect(bool wait) { return writer_ ? writer_->collect(wait) : Metrics{}; }

 private:
  CheckpointWriter& writer() {
    if (!writer_) writer_ = std::make_unique<CheckpointWriter>();
    return *writer_;
  }
  bool background_;
  std::unique_ptr<CheckpointWriter> writer_;
};

}  // namespace anvil::train
