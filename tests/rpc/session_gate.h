// Test helper: holds N generating sessions at a point mid-generation (each
// calls Arrive() from its token callback) until the test calls Open(). Every
// wait is bounded (120 s).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace meshnet::rpc::testing {

class SessionGate {
 public:
  explicit SessionGate(int n) : waiting_for_(n) {}
  // Counts this session in, then waits for Open().
  void Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--waiting_for_ == 0) cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(120), [&] { return open_; });
  }
  // Whether all N arrived (false after 120 s).
  bool AllArrived() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(120), [&] { return waiting_for_ == 0; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_for_;
  bool open_ = false;
};

}  // namespace meshnet::rpc::testing
