// MemoryRegistry: the embedded registry backend. Records live in memory,
// indexed by model identity then address; leases expire lazily (each call
// first drops the leases whose deadline passed, in deadline order, so a call
// costs the expired leases, not every lease). WaitForChange wakes on every
// change, expiries included.
//
// `verify` (optional) runs before a record is accepted by Announce, outside
// the lock: the gRPC service (rpc/registry_service.h) asks the node's Info
// there and throws Error(kPermissionDenied) when it disagrees.
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
  using Verifier = std::function<void(const NodeRecord&)>;
  explicit MemoryRegistry(Verifier verify = nullptr);
  ~MemoryRegistry() override;

  std::string name() const override { return "embedded"; }
  LeaseId Announce(const NodeRecord& record, double ttl_s) override;
  bool Renew(LeaseId lease, const NodeRecord& record) override;
  void Withdraw(LeaseId lease) override;
  Snapshot List(const std::string& model_id = "") override;
  int64_t WaitForChange(int64_t since, double timeout_s) override;
  bool SetDraining(const std::string& address, bool draining) override;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Lease {
    double ttl_s = 0;
    std::multimap<TimePoint, LeaseId>::iterator expiry;
    std::string address;
    std::string model_id;
  };

  void ExpireLocked() REQUIRES(mu_);
  void DropLocked(LeaseId id) REQUIRES(mu_);
  void BumpLocked() REQUIRES(mu_);
  NodeRecord* FindRecordLocked(const std::string& model_id, const std::string& address)
      REQUIRES(mu_);

  Verifier verify_;
  Mutex mu_;
  CondVar changed_{&mu_};
  int64_t revision_ GUARDED_BY(mu_) = 1;
  LeaseId next_lease_ GUARDED_BY(mu_);
  std::unordered_map<LeaseId, Lease> leases_ GUARDED_BY(mu_);
  std::multimap<TimePoint, LeaseId> expiry_ GUARDED_BY(mu_);  // earliest deadline first
  // model id -> address -> record: List(model) touches that model only.
  std::unordered_map<std::string, std::map<std::string, NodeRecord>> by_model_ GUARDED_BY(mu_);
  std::unordered_map<std::string, LeaseId> lease_of_address_ GUARDED_BY(mu_);
};

}  // namespace meshnet::registry
