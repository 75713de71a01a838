#include "rpc/server_trim.h"

#include <grpcpp/server.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <mutex>

namespace meshnet::rpc {

namespace {

std::atomic<int> g_large_calls{0};  // calls in flight that received a large message
std::atomic<int64_t> g_trims{0};
std::atomic<int64_t> g_large_calls_done{0};
thread_local bool t_large_call = false;  // the call on this handler thread is one of them

class TrimCallbacks final : public grpc::Server::GlobalCallbacks {
 public:
  void PreSynchronousRequest(grpc::ServerContext*) override {}
  void PostSynchronousRequest(grpc::ServerContext*) override {
    if (!t_large_call) return;
    t_large_call = false;
    if (g_large_calls.fetch_sub(1) == 1) {  // else another large call still holds memory
#if defined(__GLIBC__)
      malloc_trim(0);
#endif
      g_trims.fetch_add(1);
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
