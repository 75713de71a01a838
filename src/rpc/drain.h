// Draining a node: stop taking new sessions and hand every live session's KV
// to a replica of the same layer range that has room (verified by the
// replica before it accepts: node/migration.h). A moved session's next step
// is answered "moved to ADDR" and the client continues there without a
// re-prefill; a session no replica takes ends with an explicit miss and its
// client re-prefills elsewhere.
//
// Where replicas come from is a hook: a ReplicaFinder gets this node's shard
// (model, range, recipe) and the bytes one session needs, and returns
// candidates, best first: StaticReplicas(--drain-to list, or the admin's
// targets), or a registry's replicas of the same range with room, each with
// the node key its signed record names (cli/serve_drain.h). Nothing is sent
// to a candidate before it proved itself on the connection the session then
// takes (rpc/prove.h: its key, the address it was reached by, the same
// model, range and recipe, and, with a cluster token, that it knows the
// token); the session is then pushed with a peer proof, never the cluster
// token.
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

// A replica to push to: its address and, when known (a registry's signed
// record), the node key it must prove; empty: any key that proves the address.
struct DrainTarget {
  std::string address;
  std::string public_key;
};

using ReplicaFinder =
    std::function<std::vector<DrainTarget>(const node::ShardInfo& self, int64_t bytes_needed)>;

// The given addresses, in order, with no key pinned (each still proves
// itself). A finder may be called from several threads at once.
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

// `meshnet admin drain`: asks the node at `address` to drain to `targets`,
// with `admin_token` (the node's --admin-token; `options` gives TLS and the
// deadline, its cluster token is not sent).
DrainReport RequestDrain(const std::string& address, const std::vector<std::string>& targets,
                         const ClientOptions& options, const std::string& admin_token);
// `meshnet admin undrain`: the node takes new sessions again. Whether it was
// draining.
bool RequestUndrain(const std::string& address, const ClientOptions& options,
                    const std::string& admin_token);

}  // namespace meshnet::rpc
