#include "train/checkpoint_writer.h"
#include "core/test_hooks.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "anvil/core/error.h"
#include "core/logging.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fixed(double x, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", x, unit);
  return buf;
}

std::string bytes_str(double b) { return b >= 1e9 ? fixed(b / 1e9, "GB") : fixed(b / 1e6, "MB"); }

/// A live CPU tensor the thread copies into the job's entry `dst` (a reused
/// buffer, or undefined).
struct HostCopy {
  at::Tensor src;
  at::Tensor* dst;
};

/// Turns a job's live tensors into host buffers: each entry gets the
/// previous job's buffer of the same name, shape and dtype, when there is
/// one. A GPU tensor is copied now, queued on its device's current stream
/// into a pinned buffer (so it precedes any later update); a CPU one is left
/// to the thread (`copies`).
struct Staging {
  std::vector<HostCopy> copies;
  std::vector<at::Device> devices;
  std::vector<std::pair<io::TensorMap*, std::string>> owned;  // written as they are (Job::owned)
  double bytes = 0;

  void stage(io::TensorMap& map, const io::TensorMap* reuse, bool job_owns) {
    for (auto& [name, t] : map) {
      if (job_owns && t.is_cpu()) {
        owned.emplace_back(&map, name);
        continue;
      }
      const auto src = t.detach();
      at::Tensor dst;
      if (reuse)
        if (const auto it = reuse->find(name);
            it != reuse->end() && it->second.sizes() == src.sizes() && it->second.scalar_type() == src.scalar_type())
          dst = it->second;
      bytes += static_cast<double>(src.nbytes());
      if (src.is_cpu()) {
        t = dst;
        copies.push_back({src, &t});
        continue;
      }
      if (!dst.defined())
        dst = at::empty(src.sizes(), at::TensorOptions().dtype(src.scalar_type()).pinned_memory(true));
      dst.copy_(src, /*non_blocking=*/true);
      t = dst;
      if (std::find(devices.begin(), devices.end(), src.device()) == devices.end()) devices.push_back(src.device());
    }
  }
};

void copy_on_host(const HostCopy& c) {
  auto& dst = *c.dst;
  if (!dst.defined()) dst = at::empty(c.src.sizes(), at::TensorOptions().dtype(c.src.scalar_type()));
  // A plain memcpy: no intra-op thread pool on this thread.
  if (c.src.is_contiguous())
    std::memcpy(dst.data_ptr(), c.src.data_ptr(), dst.nbytes());
  else
    dst.copy_(c.src);
}

/// The message of a failed write: a CheckpointError's own (checkpoint::save_checkpoint
/// names the checkpoint), else one naming the checkpoint. Only the message
/// crosses threads: std::exception_ptr's members would bind to the torch
/// wheel's exported copies (tests/core/symbol_binding_test.sh).
std::string checkpoint_error(const std::exception& e, int64_t step, const stdfs::path& output_dir) {
  if (dynamic_cast<const CheckpointError*>(&e)) return e.what();
  return concat("writing checkpoint-", step, " in ", output_dir.string(), " failed: ", e.what());
}

}  // namespace

bool background_checkpoints() {
  const char* v = std::getenv("ANVIL_CHECKPOINT_SYNC");
  return !(v && std::string(v) == "1");
}

CheckpointWriter::CheckpointWriter() : delay_ms_(test_hooks::checkpoint_write_delay_ms()) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    join(/*wait=*/true);
  } catch (const std::exception& e) {
    log::error(e.what());
  }
}

stdfs::path CheckpointWriter::start(const stdfs::path& output_dir, checkpoint::CheckpointParts parts,
                                    int64_t keep_last) {
  auto p = std::make_shared<checkpoint::CheckpointParts>(std::move(parts));
  Job job;
  job.step = p->state.step;
  job.dir = output_dir / concat("checkpoint-", job.step);
  job.tensors = {&p->model.weights, &p->model.moments};
  for (auto& [name, state] : p->companions) {
    job.tensors.push_back(&state.weights);
    job.tensors.push_back(&state.moments);
  }
  job.write = [p = p.get(), output_dir, keep_last](const std::function<void(const stdfs::path&)>& before_complete) {
    p->before_complete = before_complete;
    checkpoint::save_checkpoint(output_dir, *p, keep_last);
  };
  job.payload = std::move(p);
  return start(std::move(job));
}

stdfs::path CheckpointWriter::start(Job job) {
  const auto t0 = Clock::now();
  join(/*wait=*/true);
  const double waited = seconds_since(t0);
  Staging staging;
  for (size_t i = 0; i < job.tensors.size(); ++i)
    staging.stage(*job.tensors[i], i < maps_.size() ? maps_[i] : nullptr,
                  std::find(job.owned.begin(), job.owned.end(), job.tensors[i]) != job.owned.end());
  payload_ = job.payload;  // the previous job's buffers go unless reused above
  maps_ = job.tensors;
  owned_ = std::move(staging.owned);
  std::vector<c10::Event> events;  // the thread waits for the device copies, the loop does not
  for (const auto& d : staging.devices) {
    events.emplace_back(d.type());
    events.back().record(at::accelerator::getCurrentStream(d.index()));
  }
  const int delay = delay_ms_;
  std::function<void(const stdfs::path&)> before_complete;
  if (delay > 0)
    before_complete = [delay](const stdfs::path&) { std::this_thread::sleep_for(std::chrono::milliseconds(delay)); };
  const auto step = job.step;
  const auto output_dir = job.dir.parent_path();
  dir_ = job.dir;
  bytes_ = staging.bytes;
  copy_wait_s_ = 0;
  copied_ = false;  // no thread runs now
  finished_.store(false);
  log::info("writing ", dir_.string(), " in the background (the loop waited ", fixed(waited, "s"),
            " for the previous write)");
  thread_ = std::thread([this, output_dir, step, delay, job = std::move(job), before_complete,
                         copies = std::move(staging.copies), events = std::move(events)] {
    const auto t = Clock::now();
    auto copied = [this] {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        copied_ = true;
      }
      copied_cv_.notify_all();
    };
    try {
      if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      for (const auto& c : copies) copy_on_host(c);
      copied();
      copy_s_ = seconds_since(t);
      for (const auto& e : events) e.synchronize();
      job.write(before_complete);
    } catch (const std::exception& e) {
      error_ = checkpoint_error(e, step, output_dir);
      copied();
    } catch (...) {
      error_ = concat("writing checkpoint-", step, " in ", output_dir.string(), " failed");
      copied();
    }
    write_s_ = seconds_since(t);
    finished_.store(true);
  });
  return dir_;
}

double CheckpointWriter::wait_copied() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (copied_) return 0;
  const auto t = Clock::now();
  copied_cv_.wait(lock, [this] { return copied_; });
  const double s = seconds_since(t);
  copy_wait_s_ += s;
  return s;
}

void CheckpointWriter::join(bool wait) {
  if (!thread_.joinable() || (!wait && !finished_.load())) return;
  thread_.join();
  if (error_) {
    const auto message = std::move(*error_);
    error_.reset();
    throw CheckpointError(message);
  }
  // What the job owned was written from where it was; it is no buffer to reuse.
  for (auto& [map, name] : std::exchange(owned_, {})) map->erase(name);
  done_["time/checkpoint_write_s"] = write_s_;
  log::info("saved ", dir_.string(), " in the background: ", bytes_str(bytes_), " copied to host memory in ",
            fixed(copy_s_, "s"), " (the loop waited ", fixed(copy_wait_s_, "s"), " for it), written in ",
            fixed(write_s_ - copy_s_, "s"));
}

Metrics CheckpointWriter::collect(bool wait) {
  join(wait);
  return std::exchange(done_, {});
}

stdfs::path BackgroundSaves::save(const stdfs::path& output_dir, checkpoint::CheckpointParts parts, int64_t keep_last) {
  if (background_) return writer().start(output_dir, std::move(parts), keep_last);
  const auto dir = checkpoint::save_checkpoint(output_dir, parts, keep_last);
  log::info("saved ", dir.string());
  return dir;
}

}  // namespace anvil::train
