// Process-wide settings of the libraries gRPC runs on. Internal to rpc/.
#pragma once

namespace meshnet::rpc {

// Turns off Abseil's mutex deadlock detection for this process (idempotent,
// thread-safe). Debian's libabsl is built without NDEBUG, so every
// absl::Mutex gRPC locks also updated a global lock-order graph under a
// global lock: in a three-node loopback route ~5% of the client's CPU went to
// absl's GraphCycles. Called before the first channel or server is made.
void QuietAbslDebugChecks();

}  // namespace meshnet::rpc
