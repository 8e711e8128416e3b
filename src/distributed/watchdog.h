#pragma once
// Ends the process when a collective outlives its timeout, naming the rank and
// the collective (a dead or hung peer otherwise blocks the survivors forever).
// Under mpirun the non-zero exit makes mpirun stop the other ranks; under
// torchrun the elastic agent does.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace anvil::distributed::detail {

class Watchdog {
 public:
  Watchdog(int rank, int world, std::string backend, std::chrono::milliseconds timeout);
  ~Watchdog();

  /// Marks one collective as in flight for the scope's lifetime.
  class Scope {
   public:
    Scope(Watchdog& w, const char* op, const std::string& what);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Watchdog& w_;
  };

 private:
  void loop();

  const int rank_, world_;
  const std::string backend_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool busy_ = false;
  std::chrono::steady_clock::time_point started_;
  std::string op_, what_;
  int64_t calls_ = 0;
  std::thread thread_;
};

}  // namespace anvil::distributed::detail
