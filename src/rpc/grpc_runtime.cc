#include "rpc/grpc_runtime.h"

#include <absl/synchronization/mutex.h>

#include <mutex>

namespace meshnet::rpc {

void QuietAbslDebugChecks() {
  static std::once_flag once;
  std::call_once(once, [] { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); });
}

}  // namespace meshnet::rpc
