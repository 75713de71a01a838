// The node registry: which nodes serve which layer ranges of which model,
// each record held under a lease that its node renews by heartbeat. A node
// that stops renewing disappears within the lease's TTL.
//
// Two backends run the same contract tests (registry_contract_test):
//   * MemoryRegistry (registry/memory_registry.h): in-process, served over
//     gRPC by `meshnet registry` / `meshnet serve --registry-listen`
//     (rpc/registry_service.h; rpc::RemoteRegistry is its client);
//   * EtcdRegistry (registry/etcd_registry.h): etcd v3 leases, keys under a
//     prefix, watch.
// Records are indexed by model identity, so List(model_id) costs the nodes of
// that model only, whatever else is registered.
//
// Thread-safety: every backend is safe to call from several threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "registry/record.h"

namespace meshnet::registry {

using LeaseId = int64_t;

// The longest lease a registry grants: a node that dies is gone within it,
// whatever it asked for.
inline constexpr double kMaxLeaseTtlS = 60.0;

// A backend that cannot expire records by itself (etcd, where any writer can
// put a node's old record back with no lease, or under a lease of its own)
// lists a record only while its signed_at_ms is within kMaxLeaseTtlS plus
// this clock skew before the lister's clock, and within the skew after it: a
// node renews with a fresh signature every third of its TTL, so a record is
// listed at most kMaxLeaseTtlS plus this skew after its node last signed it.
inline constexpr int64_t kListClockSkewMs = 30000;

// What Announce hands the announcer: the lease, the secret that every later
// write to it must present (only the announcer knows it), and the TTL
// granted (at most kMaxLeaseTtlS).
struct Lease {
  LeaseId id = 0;
  std::string secret;
  double ttl_s = 0;
};

class Registry {
 public:
  virtual ~Registry() = default;
  // For logs: "embedded", "127.0.0.1:7000", "etcd://127.0.0.1:2379/meshnet".
  virtual std::string name() const = 0;
  // Grants a lease of `ttl_s` seconds (capped at kMaxLeaseTtlS) and stores
  // `record` under it, replacing the record of the same address and the
  // record of the same node key: one record per node instance. The record
  // must be signed by its key (SignRecord). Throws Error(kInvalidArgument)
  // for a bad record, kPermissionDenied when the registry refuses it (an
  // unsigned record, a node whose own answer disagrees), kResourceExhausted
  // when it is too busy verifying, kUnavailable when it cannot be reached.
  virtual Lease Announce(const NodeRecord& record, double ttl_s) = 0;
  // Heartbeat: renews the lease and replaces the held record (load, and the
  // draining flag: the owner's to set and clear). False when the lease is
  // gone (expired, revoked, or replaced by a newer announcement): announce
  // again. kPermissionDenied for a wrong lease secret, an unsigned record,
  // one whose identity (NodeRecord::SameIdentity) differs from the held one,
  // or one signed no later than the held one (a replay).
  virtual bool Renew(const Lease& lease, const NodeRecord& record) = 0;
  // Ends the lease and removes its record (best effort for a lease already
  // gone). kPermissionDenied for a wrong lease secret.
  virtual void Withdraw(const Lease& lease) = 0;
  // The live records, all of them or one model's.
  virtual Snapshot List(const std::string& model_id = "") = 0;
  // Blocks until the revision is above `since` or `timeout_s` passed; returns
  // the revision seen (== since on timeout). Expiries are changes too.
  virtual int64_t WaitForChange(int64_t since, double timeout_s) = 0;
};

// For a draining node: live, not draining replicas of exactly the layer range
// `self` serves (same model and KV recipe), with at least `min_kv_bytes_free`
// free KV, most free first. `self` itself is left out.
std::vector<NodeRecord> FindReplicas(Registry& registry, const NodeRecord& self,
                                     int64_t min_kv_bytes_free);

}  // namespace meshnet::registry
