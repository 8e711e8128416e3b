#include "anvil/rewards/reward_program.h"

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

}  // namespace

RewardProgram::RewardProgram(std::string command, double timeout_s)
    : command_(std::move(command)), timeout_s_(timeout_s) {
  // A program that dies makes a write fail with EPIPE instead of killing the trainer.
  ::signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
    throw Error(concat("ppo.reward.command: cannot create pipes for \"", command_, "\": ", std::strerror(errno)));
  pid_ = ::fork();
  if (pid_ < 0) throw Error(concat("ppo.reward.command: cannot start \"", command_, "\": ", std::strerror(errno)));
  if (pid_ == 0) {
    ::setpgid(0, 0);  // its own process group: the shell and what it starts are killed together
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: whichever runs first
  group_ = pid_;
  ::close(in[0]);
  ::close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
}

RewardProgram::~RewardProgram() {
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
  // Closing stdin asks it to finish; after 2 s it is killed. Either way its
  // process group goes too, so nothing it started outlives the run.
  for (int i = 0; pid_ > 0 && i < 200; ++i) {
    int status = 0;
    const auto r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD))
      pid_ = -1;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (group_ > 0) ::kill(-group_, SIGKILL);
  if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
}

std::string RewardProgram::exit_status() {
  int status = 0;
  const auto r = ::waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return "closed its stdout";
  pid_ = -1;
  if (WIFEXITED(status)) return concat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return concat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

void RewardProgram::fail(const nlohmann::json& record, const std::string& what) {
  throw Error(concat("ppo.reward.command \"", command_, "\": ", what, "; the record was ", clip_text(record.dump())));
}

double RewardProgram::ask(const nlohmann::json& record) {
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
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(answer);
      } catch (const std::exception&) {
        fail(record, concat("answered \"", clip_text(answer), "\"; expected a line {\"reward\": <number>}"));
      }
      if (!j.is_object() || !j.contains("reward") || !j["reward"].is_number() ||
          !std::isfinite(j["reward"].get<double>()))
        fail(record, concat("answered ", clip_text(answer), "; expected a line {\"reward\": <finite number>}"));
      return j["reward"].get<double>();
    }
    const auto left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) fail(record, concat("no answer within ", timeout_s_, " s (ppo.reward.timeout_s)"));
    pollfd p{from_child_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::ceil(std::min(left, 1.0) * 1000)));
    if (r < 0 && errno != EINTR) fail(record, concat("cannot read its answer: ", std::strerror(errno)));
    if (r <= 0) continue;
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

std::vector<double> RewardProgram::score(const std::vector<nlohmann::json>& records) {
  std::vector<double> out;
  out.reserve(records.size());
  for (const auto& r : records) out.push_back(ask(r));
  return out;
}

}  // namespace anvil::rewards
