#include "rewards/json_lines_program.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "anvil/core/error.h"

namespace anvil::rewards {
namespace {

std::string clip_text(const std::string& s, size_t n = 300) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

constexpr size_t kStderrTail = 2000;

}  // namespace

JsonLinesProgram::JsonLinesProgram(std::string command, double timeout_s, std::string key, std::string timeout_key)
    : command_(std::move(command)), key_(std::move(key)), timeout_key_(std::move(timeout_key)), timeout_s_(timeout_s) {
  // A program that dies makes a write fail with EPIPE instead of killing the trainer.
  ::signal(SIGPIPE, SIG_IGN);
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(concat(key_, ": cannot create pipes for \"", command_, "\": ", std::strerror(errno)));
  pid_ = ::fork();
  if (pid_ < 0) throw Error(concat(key_, ": cannot start \"", command_, "\": ", std::strerror(errno)));
  if (pid_ == 0) {
    ::setpgid(0, 0);  // its own process group: the shell and what it starts are killed together
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: whichever runs first
  group_ = pid_;
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  to_child_ = in[1];
  from_child_ = out[0];
  err_child_ = err[0];
  ::fcntl(err_child_, F_SETFL, ::fcntl(err_child_, F_GETFL) | O_NONBLOCK);
}

JsonLinesProgram::~JsonLinesProgram() {
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
  // Closing stdin asks it to finish; after 2 s it is killed. Either way its
  // process group goes too, so nothing it started outlives the run.
  for (int i = 0; pid_ > 0 && i < 200; ++i) {
    drain_stderr();
    int status = 0;
    const auto r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD))
      pid_ = -1;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (group_ > 0) ::kill(-group_, SIGKILL);
  if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  drain_stderr();
  if (err_child_ >= 0) ::close(err_child_);
}

void JsonLinesProgram::drain_stderr() {
  if (err_child_ < 0) return;
  char chunk[4096];
  for (;;) {
    const auto n = ::read(err_child_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // nothing now (EAGAIN)
    if (n == 0) {       // closed: poll() skips it from now on
      ::close(err_child_);
      err_child_ = -1;
      return;
    }
    // Passed on as written, so the program's own messages reach the log.
    for (ssize_t done = 0; done < n;) {
      const auto w = ::write(STDERR_FILENO, chunk + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += w;
    }
    stderr_tail_.append(chunk, static_cast<size_t>(n));
    if (stderr_tail_.size() > 2 * kStderrTail) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
  }
}

std::string JsonLinesProgram::exit_status() {
  int status = 0;
  const auto r = ::waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return "closed its stdout";
  pid_ = -1;
  if (WIFEXITED(status)) {
    // What /bin/sh answers for a command it cannot run (POSIX: 127 not found, 126 not executable).
    const int code = WEXITSTATUS(status);
    return concat("exited with status ", code,
                  code == 127   ? " (the shell found no such program: check its name, path and PATH)"
                  : code == 126 ? " (the shell found the program but could not run it: is it executable?)"
                                : "");
  }
  if (WIFSIGNALED(status)) return concat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

void JsonLinesProgram::fail(const nlohmann::json& record, const std::string& what) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // what it wrote as it failed
  drain_stderr();
  auto tail = stderr_tail_.size() > kStderrTail ? stderr_tail_.substr(stderr_tail_.size() - kStderrTail) : stderr_tail_;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  throw Error(
      concat(key_, " \"", command_, "\": ", what, "; the line it was sent: ", clip_text(record.dump()),
             tail.empty() ? std::string("; it wrote nothing to stderr") : concat("; the end of its stderr:\n", tail)));
}

nlohmann::json JsonLinesProgram::ask(const nlohmann::json& record, const std::string& expected) {
  if (pid_ <= 0) fail(record, "the program is no longer running");
  const auto line = record.dump() + "\n";
  for (size_t done = 0; done < line.size();) {
    const auto n = ::write(to_child_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it finish exiting
      fail(record, concat("cannot write to it (", std::strerror(errno), "): it ", exit_status()));
    }
    done += static_cast<size_t>(n);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  for (;;) {
    if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
      const auto answer = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      try {
        return nlohmann::json::parse(answer);
      } catch (const std::exception&) {
        fail(record, concat("answered \"", clip_text(answer), "\"; expected ", expected));
      }
    }
    const auto left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) fail(record, concat("no answer within ", timeout_s_, " s (", timeout_key_, ")"));
    pollfd p[2] = {{from_child_, POLLIN, 0}, {err_child_, POLLIN, 0}};
    const int r = ::poll(p, 2, static_cast<int>(std::ceil(std::min(left, 1.0) * 1000)));
    if (r < 0 && errno != EINTR) fail(record, concat("cannot read its answer: ", std::strerror(errno)));
    if (r <= 0) continue;
    if (p[1].revents != 0) drain_stderr();
    if (p[0].revents == 0) continue;
    char chunk[4096];
    const auto n = ::read(from_child_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      fail(record, concat("it ", exit_status(), " before answering",
                          buffer_.empty() ? std::string() : concat(" (partial line \"", clip_text(buffer_), "\")")));
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace anvil::rewards
