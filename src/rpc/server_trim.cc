#include "rpc/server_trim.h"

#include <grpcpp/server.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace meshnet::rpc {

namespace {

std::atomic<int> g_large_calls{0};  // calls in flight that received a large message
std::atomic<int64_t> g_trims{0};
std::atomic<int64_t> g_large_calls_done{0};
thread_local bool t_large_call = false;  // the call on this handler thread is one of them

void Trim() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  g_trims.fetch_add(1);
}

// A second trim kSettle after the last large call ended: gRPC's transport
// frees some of a call's buffers (TLS records, read slices) on its own
// threads after the handler returned, too late for the first trim. One
// thread, started at the first large call and never stopped (its state is
// never destroyed, so it may outlive static destruction at exit).
class SettledTrim {
 public:
  static SettledTrim& Get() {
    static auto* t = new SettledTrim;  // intentionally leaked (see above)
    return *t;
  }
  void Schedule() {
    std::lock_guard lock(mu_);
    due_ = std::chrono::steady_clock::now() + kSettle;
    armed_ = true;
    if (!started_) {
      started_ = true;
      std::thread([this] { Run(); }).detach();
    }
    cv_.notify_one();
  }

 private:
  static constexpr auto kSettle = std::chrono::milliseconds(250);
  void Run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return armed_; });
      // A later large call's end moves the due time on.
      while (armed_ && std::chrono::steady_clock::now() < due_) cv_.wait_until(lock, due_);
      if (!armed_ || g_large_calls.load() > 0) {
        armed_ = false;  // a large call runs again: its end schedules anew
        continue;
      }
      armed_ = false;
      lock.unlock();
      Trim();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point due_;
  bool armed_ = false;
  bool started_ = false;
};

class TrimCallbacks final : public grpc::Server::GlobalCallbacks {
 public:
  void PreSynchronousRequest(grpc::ServerContext*) override {}
  void PostSynchronousRequest(grpc::ServerContext*) override {
    if (!t_large_call) return;
    t_large_call = false;
    if (g_large_calls.fetch_sub(1) == 1) {  // else another large call still holds memory
      Trim();
      SettledTrim::Get().Schedule();
    }
    g_large_calls_done.fetch_add(1);  // after the trim: a reader that sees it sees the trim
  }
};

}  // namespace

void InstallHeapTrim() {
  static std::once_flag once;
  // Lives as long as the process: gRPC uses it until its last server is gone.
  std::call_once(once, [] { grpc::Server::SetGlobalCallbacks(new TrimCallbacks); });
}

// Installed while the program loads, when this file is linked in (it is
// with NodeServer): before main, so before any grpc::Server of the process
// (another one built first, e.g. a registry's, would make the later
// installation abort in gRPC).
[[maybe_unused]] const bool kHeapTrimInstalled = (InstallHeapTrim(), true);

void NoteMessageBytes(size_t bytes) {
  if (bytes < kTrimAfterMessageBytes || t_large_call) return;
  t_large_call = true;
  g_large_calls.fetch_add(1);
}

HeapTrimStats GetHeapTrimStats() {
  HeapTrimStats s;
  s.large_calls = g_large_calls_done.load();
  s.trims = g_trims.load();
  return s;
}

}  // namespace meshnet::rpc
