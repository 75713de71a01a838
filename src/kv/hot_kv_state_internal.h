// Private to hot_kv_state*.cc: the manager's entries, lists and state. See the
// invariants comment at the top of hot_kv_state.cc.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/hot_kv_state.h"
#include "util/mutex.h"

namespace meshnet::kv {

// A minimal intrusive doubly linked list. T has a `ListLinks<T> Member`.
template <typename T>
struct ListLinks {
  T* prev = nullptr;
  T* next = nullptr;
  bool linked = false;
};

template <typename T, ListLinks<T> T::*Member>
class IntrusiveList {
 public:
  T* front() const { return head_; }
  T* back() const { return tail_; }
  static T* Next(const T* t) { return (t->*Member).next; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void PushBack(T* t) {
    ListLinks<T>& l = t->*Member;
    l.prev = tail_;
    l.next = nullptr;
    l.linked = true;
    if (tail_ != nullptr) {
      (tail_->*Member).next = t;
    } else {
      head_ = t;
    }
    tail_ = t;
    ++size_;
  }
  void Remove(T* t) {
    ListLinks<T>& l = t->*Member;
    if (l.prev != nullptr) {
      (l.prev->*Member).next = l.next;
    } else {
      head_ = l.next;
    }
    if (l.next != nullptr) {
      (l.next->*Member).prev = l.prev;
    } else {
      tail_ = l.prev;
    }
    l = ListLinks<T>{};
    --size_;
  }
  void MoveToBack(T* t) {
    if (tail_ == t) return;
    Remove(t);
    PushBack(t);
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
  int64_t size_ = 0;
};

struct IdRecord;

// One (session id, epoch) context. Immutable after construction: session_id,
// route_epoch. Everything else is guarded by ManagerState::mu, except the contents of
// the blocks (owned by the step or readers, see hot_kv_state.h).
struct SessionEntry {
  SessionEntry(std::string id, int64_t epoch) : session_id(std::move(id)), route_epoch(epoch) {}

  const std::string session_id;
  const int64_t route_epoch;

  std::vector<uint8_t*> blocks;  // block table; ceil(seq_len / bt) blocks unless a step holds more
  int64_t seq_len = 0;           // committed positions
  double last_tick = 0;
  bool live = true;
  CacheMissReason death_reason = CacheMissReason::kUnknownSession;
  std::string death_detail;
  int64_t pins = 0;          // SessionHandles + the in-flight KvStep
  bool step_active = false;  // a KvStep owns rows beyond seq_len
  bool parked = false;       // HotKvStateManager::Park: idle until its next step
  IdRecord* id = nullptr;    // while live
  ListLinks<SessionEntry> lru;
};

// Per session id: the latest epoch ever opened (for stale checks) and the one
// live entry, if any.
struct IdRecord {
  const std::string* id = nullptr;  // the map key (stable: node-based map)
  int64_t latest_epoch = 0;
  SessionEntry* live = nullptr;
  ListLinks<IdRecord> idle;  // on ManagerState::idle_ids iff live == nullptr
  int64_t arrival = 0;       // order of first open (HotKvStateConfig::active_seconds)
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct MissKey {
  std::string_view id;  // views the CacheMiss in the list node
  int64_t epoch;
  bool operator==(const MissKey& o) const { return epoch == o.epoch && id == o.id; }
};
struct MissKeyHash {
  size_t operator()(const MissKey& k) const {
    return std::hash<std::string_view>{}(k.id) ^
           (std::hash<int64_t>{}(k.epoch) * 0x9e3779b97f4a7c15ull);
  }
};

struct ManagerState {
  ManagerState(const KvCacheRecipe& recipe, const HotKvStateConfig& config, const Clock* clock);
  ~ManagerState();

  // --- immutable after construction ---
  const Clock* clock;
  HotKvStateConfig config;
  std::string fingerprint;
  int first_layer = 0;
  int num_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kF32;
  int64_t row_bytes = 0;        // KvRowBytes(dtype, n_kv_heads, head_dim)
  int64_t bytes_per_token = 0;  // 2 * row_bytes * num_layers
  int64_t block_bytes = 0;      // block_tokens * bytes_per_token

  mutable Mutex mu;
  // Signalled when a pin goes or blocks return to the pool: a reservation
  // short of room only because of pinned (or protected active) sessions
  // waits on it.
  CondVar unpinned{&mu};
  // --- guarded by mu (the entries and records they point to as well) ---
  BlockPool pool GUARDED_BY(mu);
  double last_now GUARDED_BY(mu) = 0;  // clamps the clock so LRU order stays last_tick order
  IntrusiveList<SessionEntry, &SessionEntry::lru> lru GUARDED_BY(mu);   // live, oldest first
  IntrusiveList<SessionEntry, &SessionEntry::lru> dead GUARDED_BY(mu);  // dead, kept by pins
  std::unordered_map<std::string, IdRecord, StringHash, std::equal_to<>> ids GUARDED_BY(mu);
  // Ids without live state, oldest first.
  IntrusiveList<IdRecord, &IdRecord::idle> idle_ids GUARDED_BY(mu);
  std::list<CacheMiss> miss_list GUARDED_BY(mu);  // oldest first
  std::unordered_map<MissKey, std::list<CacheMiss>::iterator, MissKeyHash> miss_index
      GUARDED_BY(mu);
  int64_t live_blocks GUARDED_BY(mu) = 0;  // blocks in live entries' tables
  int64_t live_tokens GUARDED_BY(mu) = 0;  // sum of live seq_len
  int64_t pinned GUARDED_BY(mu) = 0;       // entries with pins > 0
  int64_t hits GUARDED_BY(mu) = 0;
  int64_t misses[kNumCacheMissReasons] GUARDED_BY(mu) = {};
  int64_t evictions[kNumCacheMissReasons] GUARDED_BY(mu) = {};
  int64_t replaced GUARDED_BY(mu) = 0;
  int64_t pinned_waits GUARDED_BY(mu) = 0;
  int64_t room_waits GUARDED_BY(mu) = 0;
  int64_t next_arrival GUARDED_BY(mu) = 0;

  // --- helpers; all require mu held ---
  double NowLocked() REQUIRES(mu);
  int64_t BlocksFor(int64_t tokens) const {
    return (tokens + config.block_tokens - 1) / config.block_tokens;
  }
  IdRecord* FindId(std::string_view id) REQUIRES(mu);
  // Throws kStaleEpoch if epoch < latest[id]; touches the id's record.
  void CheckStaleLocked(std::string_view id, int64_t epoch) REQUIRES(mu);
  SessionEntry* FindLiveLocked(std::string_view id, int64_t epoch) REQUIRES(mu);
  void EvictExpiredLocked(double now) REQUIRES(mu);
  // Removes a live entry from the store; records `reason` as a miss unless
  // `record` is false. Frees it unless pinned.
  void DropLocked(SessionEntry* e, CacheMissReason reason, bool record, std::string detail = {})
      REQUIRES(mu);
  void RecordMissLocked(std::string_view id, int64_t epoch, CacheMissReason reason,
                        std::string detail) REQUIRES(mu);
  void ForgetMissLocked(std::string_view id, int64_t epoch) REQUIRES(mu);
  CacheMiss RecordedMissLocked(std::string_view id, int64_t epoch) const REQUIRES(mu);
  void TrimIdsLocked() REQUIRES(mu);
  // Evicts LRU entries other than `protect` and unpinned until `done()`.
  template <typename Done>
  void EvictLruUntilLocked(const SessionEntry* protect, Done done) REQUIRES(mu);
  // Room for `protect` under the byte budget: EvictLruUntilLocked, or with
  // config.active_seconds the protecting order (hot_kv_state.h): idle
  // entries in LRU order, then unpinned active ones that arrived after
  // `protect`, the latest first, until `done()`.
  template <typename Done>
  void MakeRoomLocked(const SessionEntry* protect, double now, Done done) REQUIRES(mu);
  // Blocks held by unpinned live entries other than `protect`.
  int64_t EvictableBlocksLocked(const SessionEntry* protect) const REQUIRES(mu);
  // Frees blocks of `e` beyond the first `keep`.
  void ShrinkBlocksLocked(SessionEntry* e, int64_t keep) REQUIRES(mu);
  void PinLocked(SessionEntry* e) REQUIRES(mu);
  void UnpinLocked(SessionEntry* e) REQUIRES(mu);
  void FreeEntryLocked(SessionEntry* e) REQUIRES(mu);
  void TouchLocked(SessionEntry* e, double now) REQUIRES(mu);
  // The first broken invariant ("" if none): byte and token totals equal the
  // sums over sessions, the LRU list holds exactly the live sessions (each
  // reachable from its id record), the dead list exactly the dead pinned
  // ones, the pinned count matches, every owned block is in use in the pool,
  // owned by one session only, and the pool's used count equals the owned
  // blocks (so no block is both free and owned). O(sessions + blocks).
  std::string InvariantViolationLocked() const REQUIRES(mu);
  // With config.check_invariants: aborts naming a broken invariant.
  void DebugCheckLocked() const REQUIRES(mu);
  // A view of owned `layer` over e's block table. Needs mu, or a pin whose
  // owner is the only one who may change e->blocks (an in-flight step).
  ops::PagedKvLayer View(const SessionEntry* e, int layer, int64_t n_positions) const;
};

// Holds the manager's mutex for one mutating operation. On release it trims
// the latest-epoch map (trim_ids) and runs the debug invariant check.
class SCOPED_CAPABILITY MutationLock {
 public:
  explicit MutationLock(ManagerState* m, bool trim_ids = true) ACQUIRE(m->mu)
      : m_(m), trim_ids_(trim_ids) {
    m_->mu.Lock();
  }
  ~MutationLock() RELEASE() {
    m_->mu.AssertHeld();
    if (trim_ids_) m_->TrimIdsLocked();
    m_->DebugCheckLocked();
    m_->mu.Unlock();
  }
  MutationLock(const MutationLock&) = delete;
  MutationLock& operator=(const MutationLock&) = delete;

 private:
  ManagerState* const m_;
  const bool trim_ids_;
};

// Walks from the LRU front once; passes over pinned entries (at most the
// number of in-flight requests) and the protected one.
template <typename Done>
void ManagerState::EvictLruUntilLocked(const SessionEntry* protect, Done done) {
  SessionEntry* e = lru.front();
  while (e != nullptr && !done()) {
    SessionEntry* next = decltype(lru)::Next(e);
    if (e != protect && e->pins == 0) DropLocked(e, CacheMissReason::kEvictedLru, true);
    e = next;
  }
}

template <typename Done>
void ManagerState::MakeRoomLocked(const SessionEntry* protect, double now, Done done) {
  const double active = config.active_seconds;
  if (active <= 0) return EvictLruUntilLocked(protect, done);
  // Parked ones first (kept by their client for later, HotKvStateManager::Park),
  // then idle ones; the list is in last_tick order, so the idle ones lead it.
  for (SessionEntry* p = lru.front(); p != nullptr && !done();) {
    SessionEntry* next = decltype(lru)::Next(p);
    if (p->parked && p != protect && p->pins == 0) {
      DropLocked(p, CacheMissReason::kEvictedLru, true);
    }
    p = next;
  }
  SessionEntry* e = lru.front();
  while (e != nullptr && !done() && now - e->last_tick > active) {
    SessionEntry* next = decltype(lru)::Next(e);
    if (e != protect && e->pins == 0) DropLocked(e, CacheMissReason::kEvictedLru, true);
    e = next;
  }
  while (!done()) {
    SessionEntry* victim = nullptr;
    for (SessionEntry* x = lru.front(); x != nullptr; x = decltype(lru)::Next(x)) {
      if (x == protect || x->pins > 0 || x->id->arrival < protect->id->arrival) continue;
      if (victim == nullptr || x->id->arrival > victim->id->arrival) victim = x;
    }
    if (victim == nullptr) return;
    DropLocked(victim, CacheMissReason::kPreempted, true,
               "the KV budget is full of active sessions and this one arrived last");
  }
}

}  // namespace meshnet::kv
