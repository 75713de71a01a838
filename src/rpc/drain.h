// Draining a node: stop taking new sessions and hand every live session's KV
// to a replica of the same layer range that has room (verified by the
// replica before it accepts: node/migration.h). A moved session's next step
// is answered "moved to ADDR" and the client continues there without a
// re-prefill; a session no replica takes ends with an explicit miss and its
// client re-prefills elsewhere.
//
// Where replicas come from is a hook: a ReplicaFinder gets this node's shard
// (model, range, recipe) and the bytes one session needs, and returns
// candidate addresses, best first: StaticReplicas(--drain-to list), or a
// registry's replicas of the same range with room (cli/serve_drain.h).
// Up to DrainOptions::parallel sessions move at once (each on its own
// stream), so a drain of many sessions is not a queue of round trips.
//
// Thread-safety: DrainSessions may be called from any thread (its workers
// call the finder concurrently); the node keeps serving.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "node/node_core.h"
#include "node/step.h"
#include "rpc/options.h"

namespace meshnet::rpc {

using ReplicaFinder =
    std::function<std::vector<std::string>(const node::ShardInfo& self, int64_t bytes_needed)>;

// The given addresses, in order (each target verifies the session itself).
// A finder may be called from several threads at once.
ReplicaFinder StaticReplicas(std::vector<std::string> addresses);

struct DrainOptions {
  ReplicaFinder find_replicas;  // empty: no replica (every session ends)
  ClientOptions client;         // how this node reaches the replicas
  double deadline_s = 30.0;     // sessions not moved by then end with a miss
  // Sessions moved at once. Bounded: each holds a claim, a gRPC stream and
  // one chunk buffer per side (node/migration.h kChunkTargetBytes).
  int parallel = 4;
};

struct DrainReport {
  int64_t sessions = 0;  // movable sessions when the drain began
  int64_t moved = 0;
  int64_t ended = 0;
  int64_t bytes_moved = 0;
  double seconds = 0;
  std::vector<std::string> notes;  // refusals and failures, one line each
};

// Marks `core` draining, then moves or ends each session, `parallel` at a time.
DrainReport DrainSessions(node::NodeCore& core, const DrainOptions& options);

// `meshnet admin drain`: asks the node at `address` to drain to `targets`.
DrainReport RequestDrain(const std::string& address, const std::vector<std::string>& targets,
                         const ClientOptions& options);

}  // namespace meshnet::rpc
