#include "registry/memory_registry.h"

#include <cmath>
#include <random>

#include "util/error.h"

namespace meshnet::registry {

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

void CheckTtl(double ttl_s) {
  if (!std::isfinite(ttl_s) || ttl_s <= 0 || ttl_s > 86400) {
    ThrowInvalidArgument("lease TTL must be in (0, 86400] seconds");
  }
}

}  // namespace

MemoryRegistry::MemoryRegistry(Verifier verify) : verify_(std::move(verify)) {
  MutexLock lock(&mu_);
  // Lease ids are not secrets (the cluster token guards the service), but a
  // random start keeps a restarted registry from honouring old ids.
  next_lease_ = static_cast<LeaseId>(std::random_device{}() & 0x7fffffff) << 20 | 1;
}

MemoryRegistry::~MemoryRegistry() = default;

void MemoryRegistry::BumpLocked() {
  ++revision_;
  changed_.SignalAll();
}

void MemoryRegistry::DropLocked(LeaseId id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  Lease& l = it->second;
  expiry_.erase(l.expiry);
  auto m = by_model_.find(l.model_id);
  if (m != by_model_.end()) {
    m->second.erase(l.address);
    if (m->second.empty()) by_model_.erase(m);
  }
  auto a = lease_of_address_.find(l.address);
  if (a != lease_of_address_.end() && a->second == id) lease_of_address_.erase(a);
  leases_.erase(it);
  BumpLocked();
}

void MemoryRegistry::ExpireLocked() {
  const TimePoint now = std::chrono::steady_clock::now();
  while (!expiry_.empty() && expiry_.begin()->first <= now) DropLocked(expiry_.begin()->second);
}

NodeRecord* MemoryRegistry::FindRecordLocked(const std::string& model_id,
                                             const std::string& address) {
  auto m = by_model_.find(model_id);
  if (m == by_model_.end()) return nullptr;
  auto r = m->second.find(address);
  return r == m->second.end() ? nullptr : &r->second;
}

LeaseId MemoryRegistry::Announce(const NodeRecord& record, double ttl_s) {
  record.Validate();
  CheckTtl(ttl_s);
  if (verify_) verify_(record);  // outside the lock: it may call the node
  MutexLock lock(&mu_);
  ExpireLocked();
  auto old = lease_of_address_.find(record.address);
  if (old != lease_of_address_.end()) DropLocked(old->second);
  const LeaseId id = next_lease_++;
  Lease& l = leases_[id];
  l.ttl_s = ttl_s;
  l.address = record.address;
  l.model_id = record.model_id;
  l.expiry = expiry_.emplace(std::chrono::steady_clock::now() + Seconds(ttl_s), id);
  by_model_[record.model_id][record.address] = record;
  lease_of_address_[record.address] = id;
  BumpLocked();
  return id;
}

bool MemoryRegistry::Renew(LeaseId lease, const NodeRecord& record) {
  record.Validate();
  MutexLock lock(&mu_);
  ExpireLocked();
  auto it = leases_.find(lease);
  if (it == leases_.end()) return false;
  Lease& l = it->second;
  NodeRecord* held = FindRecordLocked(l.model_id, l.address);
  if (held == nullptr) return false;
  if (!held->SameIdentity(record)) {
    throw Error(ErrorKind::kPermissionDenied,
                "lease " + std::to_string(lease) + " holds " + held->address +
                    "'s announcement; a renewal may not change what the node serves");
  }
  expiry_.erase(l.expiry);
  l.expiry = expiry_.emplace(std::chrono::steady_clock::now() + Seconds(l.ttl_s), lease);
  const bool was_draining = held->draining;
  *held = record;
  held->draining = record.draining || was_draining;  // sticky until SetDraining(false)
  BumpLocked();
  return true;
}

void MemoryRegistry::Withdraw(LeaseId lease) {
  MutexLock lock(&mu_);
  DropLocked(lease);
}

Snapshot MemoryRegistry::List(const std::string& model_id) {
  MutexLock lock(&mu_);
  ExpireLocked();
  Snapshot s;
  s.revision = revision_;
  auto add = [&s](const std::map<std::string, NodeRecord>& nodes) {
    for (const auto& [address, r] : nodes) s.nodes.push_back(r);
  };
  if (!model_id.empty()) {
    auto m = by_model_.find(model_id);
    if (m != by_model_.end()) add(m->second);
  } else {
    for (const auto& [model, nodes] : by_model_) add(nodes);
  }
  SortRecords(s.nodes);
  return s;
}

int64_t MemoryRegistry::WaitForChange(int64_t since, double timeout_s) {
  const TimePoint deadline = std::chrono::steady_clock::now() + Seconds(std::max(0.0, timeout_s));
  MutexLock lock(&mu_);
  while (true) {
    ExpireLocked();
    if (revision_ > since) return revision_;
    TimePoint wake = deadline;
    if (!expiry_.empty()) wake = std::min(wake, expiry_.begin()->first);
    if (std::chrono::steady_clock::now() >= deadline) return revision_;
    changed_.WaitUntil(wake);
  }
}

bool MemoryRegistry::SetDraining(const std::string& address, bool draining) {
  MutexLock lock(&mu_);
  ExpireLocked();
  auto a = lease_of_address_.find(address);
  if (a == lease_of_address_.end()) return false;
  NodeRecord* r = FindRecordLocked(leases_.at(a->second).model_id, address);
  if (r == nullptr) return false;
  r->draining = draining;
  BumpLocked();
  return true;
}

}  // namespace meshnet::registry
