#include "registry/memory_registry.h"

#include <cmath>
#include <cstring>

#include "util/clock.h"
#include "util/error.h"
#include "util/secret.h"

namespace meshnet::registry {

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

double GrantedTtl(double ttl_s) {
  if (!std::isfinite(ttl_s) || ttl_s <= 0 || ttl_s > 86400) {
    ThrowInvalidArgument("lease TTL must be in (0, 86400] seconds");
  }
  return std::min(ttl_s, kMaxLeaseTtlS);
}

// 63 random bits (never 0): a lease id says nothing about its neighbours.
LeaseId RandomLeaseId() {
  const std::string b = RandomBytes16();
  uint64_t v = 0;
  std::memcpy(&v, b.data(), sizeof v);
  v &= 0x7fffffffffffffffULL;
  return v == 0 ? 1 : static_cast<LeaseId>(v);
}

// Signed within kMaxRecordAgeMs of now (either way): an old copy is refused.
void RequireFresh(const NodeRecord& r) {
  const int64_t now = UnixMillis();
  if (r.signed_at_ms < now - kMaxRecordAgeMs || r.signed_at_ms > now + kMaxRecordAgeMs) {
    throw Error(ErrorKind::kPermissionDenied,
                "announcement of " + r.address + " refused: signed " +
                    std::to_string((now - r.signed_at_ms) / 1000) +
                    " s from the registry's clock (stale copy, or clocks apart)");
  }
}

}  // namespace

MemoryRegistry::MemoryRegistry(Verifier verify) : verify_(std::move(verify)) {}

MemoryRegistry::~MemoryRegistry() = default;

void MemoryRegistry::BumpLocked() {
  ++revision_;
  changed_.SignalAll();
}

void MemoryRegistry::DropLocked(LeaseId id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  Held& l = it->second;
  expiry_.erase(l.expiry);
  auto m = by_model_.find(l.model_id);
  if (m != by_model_.end()) {
    m->second.erase(l.address);
    if (m->second.empty()) by_model_.erase(m);
  }
  auto a = lease_of_address_.find(l.address);
  if (a != lease_of_address_.end() && a->second == id) lease_of_address_.erase(a);
  auto k = lease_of_key_.find(l.public_key);
  if (k != lease_of_key_.end() && k->second == id) lease_of_key_.erase(k);
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

MemoryRegistry::Held* MemoryRegistry::OwnedLocked(const Lease& lease) {
  auto it = leases_.find(lease.id);
  if (it == leases_.end()) return nullptr;
  if (!SecretMatches(lease.secret, it->second.secret_digest)) {
    throw Error(ErrorKind::kPermissionDenied,
                "lease " + std::to_string(lease.id) + ": wrong lease secret");
  }
  return &it->second;
}

Lease MemoryRegistry::Announce(const NodeRecord& record, double ttl_s) {
  record.Validate();
  const double ttl = GrantedTtl(ttl_s);
  RequireSignedRecord(record);
  RequireFresh(record);
  const NodeRecord stored =
      verify_ ? verify_(record) : record;  // outside the lock: it may call the node
  Lease out{RandomLeaseId(), RandomBytes16(), ttl};
  MutexLock lock(&mu_);
  ExpireLocked();
  while (leases_.count(out.id) != 0) out.id = RandomLeaseId();
  // A copy of a record listed earlier (anyone may List) must not displace its
  // node's lease: an announcement is newer than the record it replaces.
  if (auto k = lease_of_key_.find(record.public_key); k != lease_of_key_.end()) {
    const Held& h = leases_.at(k->second);
    const NodeRecord* held = FindRecordLocked(h.model_id, h.address);
    if (held != nullptr && held->signed_at_ms >= record.signed_at_ms) {
      throw Error(ErrorKind::kPermissionDenied,
                  "announcement of " + record.address +
                      " refused: not newer than the record it would replace (a replay)");
    }
  }
  // One record per address and one per node key (an instance announcing
  // again, or a restarted node on its old address, replaces its record).
  if (auto a = lease_of_address_.find(record.address); a != lease_of_address_.end()) {
    DropLocked(a->second);
  }
  if (auto k = lease_of_key_.find(record.public_key); k != lease_of_key_.end()) {
    DropLocked(k->second);
  }
  Held& l = leases_[out.id];
  l.ttl_s = ttl;
  l.secret_digest = SecretDigest(out.secret);
  l.address = record.address;
  l.model_id = record.model_id;
  l.public_key = record.public_key;
  l.expiry = expiry_.emplace(std::chrono::steady_clock::now() + Seconds(ttl), out.id);
  by_model_[record.model_id][record.address] = stored;
  lease_of_address_[record.address] = out.id;
  lease_of_key_[record.public_key] = out.id;
  BumpLocked();
  return out;
}

bool MemoryRegistry::Renew(const Lease& lease, const NodeRecord& record) {
  record.Validate();
  RequireSignedRecord(record);
  MutexLock lock(&mu_);
  ExpireLocked();
  Held* l = OwnedLocked(lease);
  if (l == nullptr) return false;
  NodeRecord* held = FindRecordLocked(l->model_id, l->address);
  if (held == nullptr) return false;
  if (!held->SameIdentity(record)) {
    throw Error(ErrorKind::kPermissionDenied,
                "lease " + std::to_string(lease.id) + " holds " + held->address +
                    "'s announcement; a renewal may not change what the node serves");
  }
  // As for announcements: a renewal is newer than the record it replaces (a
  // replayed renewal is refused).
  if (record.signed_at_ms <= held->signed_at_ms) {
    throw Error(ErrorKind::kPermissionDenied,
                "renewal of " + record.address + " refused: not newer than the held record");
  }
  expiry_.erase(l->expiry);
  l->expiry = expiry_.emplace(std::chrono::steady_clock::now() + Seconds(l->ttl_s), lease.id);
  *held = record;
  BumpLocked();
  return true;
}

void MemoryRegistry::Withdraw(const Lease& lease) {
  MutexLock lock(&mu_);
  if (OwnedLocked(lease) != nullptr) DropLocked(lease.id);
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

}  // namespace meshnet::registry
