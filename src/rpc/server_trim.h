// Memory given back after large messages (issue 8, defect 2).
//
// A burst of large messages (each body is held by gRPC's slices and then
// parsed into a protobuf string, in whichever thread's malloc arena) leaves
// the freed pages inside glibc's heaps: a node kept 160-240 MiB of RSS after
// eight 48 MiB calls had ended. gRPC 1.51 has no buffer pool to size, so the
// node asks glibc to return free pages (malloc_trim) once the last large call
// in flight has ended. The point where a sync call's request and response
// are already freed is grpc::Server::GlobalCallbacks::PostSynchronousRequest,
// which runs on the handler's thread. A second trim follows 250 ms later (if
// no large call runs then): the transport frees some buffers on its own
// threads after the handler returned.
//
// Thread-safety: NoteLargeMessage/the callbacks from any handler thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshnet::rpc {

// Messages of at least this many bytes ask for a trim when their call ends.
inline constexpr size_t kTrimAfterMessageBytes = size_t{4} << 20;

// Installs the global callbacks that trim. gRPC allows this once per process
// and only before its first grpc::Server is created: server_trim.cc does it
// while the program loads, and NodeServer again (a no-op) before building
// its server. Idempotent.
void InstallHeapTrim();

// Called by a sync handler for each message it received: a large one marks
// the running call so that the heap is trimmed when the last such call ends.
void NoteMessageBytes(size_t bytes);

struct HeapTrimStats {
  int64_t large_calls =
      0;              // calls that received a large message, counted after their end (and trim)
  int64_t trims = 0;  // malloc_trim calls (the settled ones included)
};
// Since the process started (meshnet_large_calls_total, meshnet_heap_trims_total).
HeapTrimStats GetHeapTrimStats();

}  // namespace meshnet::rpc
