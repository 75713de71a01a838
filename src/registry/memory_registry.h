// MemoryRegistry: the embedded registry backend. Records live in memory,
// indexed by model identity then address, one per address and one per node
// key; leases expire lazily (each call first drops the leases whose deadline
// passed, in deadline order, so a call costs the expired leases, not every
// lease). WaitForChange wakes on every change, expiries included.
//
// Every record must be signed by its node key (registry/record.h). Lease ids
// are 63 random bits and every lease has a 128-bit secret, kept as its
// SHA-256: only the announcer can renew or withdraw it. TTLs are capped at
// kMaxLeaseTtlS.
//
// `verify` (optional) runs before a record is accepted by Announce, outside
// the lock: the gRPC service (rpc/registry_server.h) has the node prove its
// key there and throws Error(kPermissionDenied) when it fails; it returns the
// record to store (its load fields from the node's own answer).
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "registry/registry.h"
#include "util/mutex.h"

namespace meshnet::registry {

class MemoryRegistry final : public Registry {
 public:
  using Verifier = std::function<NodeRecord(const NodeRecord&)>;
  explicit MemoryRegistry(Verifier verify = nullptr);
  ~MemoryRegistry() override;

  std::string name() const override { return "embedded"; }
  Lease Announce(const NodeRecord& record, double ttl_s) override;
  bool Renew(const Lease& lease, const NodeRecord& record) override;
  void Withdraw(const Lease& lease) override;
  Snapshot List(const std::string& model_id = "") override;
  int64_t WaitForChange(int64_t since, double timeout_s) override;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Held {
    double ttl_s = 0;
    std::string secret_digest;
    std::multimap<TimePoint, LeaseId>::iterator expiry;
    std::string address;
    std::string model_id;
    std::string public_key;
  };

  void ExpireLocked() REQUIRES(mu_);
  void DropLocked(LeaseId id) REQUIRES(mu_);
  void BumpLocked() REQUIRES(mu_);
  // The live lease `lease` names, or null; kPermissionDenied for a wrong secret.
  Held* OwnedLocked(const Lease& lease) REQUIRES(mu_);
  NodeRecord* FindRecordLocked(const std::string& model_id, const std::string& address)
      REQUIRES(mu_);

  Verifier verify_;
  Mutex mu_;
  CondVar changed_{&mu_};
  int64_t revision_ GUARDED_BY(mu_) = 1;
  std::unordered_map<LeaseId, Held> leases_ GUARDED_BY(mu_);
  std::multimap<TimePoint, LeaseId> expiry_ GUARDED_BY(mu_);  // earliest deadline first
  // model id -> address -> record: List(model) touches that model only.
  std::unordered_map<std::string, std::map<std::string, NodeRecord>> by_model_ GUARDED_BY(mu_);
  std::unordered_map<std::string, LeaseId> lease_of_address_ GUARDED_BY(mu_);
  std::unordered_map<std::string, LeaseId> lease_of_key_ GUARDED_BY(mu_);
};

}  // namespace meshnet::registry
