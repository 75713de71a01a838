// HotKvStateManager: the reference operations.
//
// Invariants (all under ManagerState::mu):
//  * An entry is on exactly one of: `lru` (live: in the store, reachable from
//    its IdRecord), `dead` (evicted/expired/released/superseded/replaced while
//    pinned: reachable only from its handles and step), or nowhere (freed).
//    A dead entry is freed, and its blocks returned to the pool, when its last
//    pin (SessionHandle or KvStep) is dropped; a live entry is freed when it is
//    dropped with no pins.
//  * `lru` is ordered by last_tick (oldest first): every refresh sets
//    last_tick = now and moves to the back, and now never decreases (the clock
//    is clamped to the largest value seen). TTL eviction pops from the front
//    while the front is expired.
//  * At most one live entry per session id: only Open inserts, and Open first
//    drops every live entry of its id with a lower epoch (superseded) or the
//    same epoch (replaced), while a higher one would have made it stale. So the
//    (session id, epoch) map of the reference is the id map `ids` plus an
//    epoch compare on IdRecord::live.
//  * An IdRecord exists for every id with a live entry and for at most
//    config.epoch_history ids without one (`idle_ids`, least recently touched
//    first; trimmed at the end of every operation).
//  * Block table: a live or dead entry holds BlocksFor(seq_len) blocks, plus
//    the blocks reserved by its in-flight step (step_active). live_blocks and
//    live_tokens sum the live entries' tables and seq_len, kept incrementally.
//  * The pool never holds more than budget / block_bytes blocks; pool.used()
//    counts live, dead-but-pinned and reserved blocks.
#include "kv/hot_kv_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <variant>

#include "kv/hot_kv_state_internal.h"
#include "ops/kv_quant.h"
#include "util/error.h"

namespace meshnet::kv {

namespace {

// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// True if `s` is empty or only whitespace (Python's `not s.strip()`), reading
// UTF-8; a byte that does not decode counts as a non-space character.
bool IsBlank(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c, len = 1;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1f, len = 2;
    } else if ((c >> 4) == 0xe) {
      cp = c & 0x0f, len = 3;
    } else {
      return false;  // 4-byte sequences are never spaces; invalid bytes are not either
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!IsPySpace(cp)) return false;
    i += len;
  }
  return true;
}

void CheckEpoch(int64_t epoch) {
  if (epoch < 0) ThrowInvalidArgument("route_epoch must be >= 0");
}

}  // namespace

void HotKvStateConfig::Validate() const {
  if (budget_bytes <= 0) ThrowInvalidArgument("budget_bytes must be positive");
  if (max_sessions < 1) ThrowInvalidArgument("max_sessions must be >= 1");
  if (!(ttl_seconds >= 0)) ThrowInvalidArgument("ttl_seconds must be >= 0");
  if (miss_history < 0) ThrowInvalidArgument("miss_history must be >= 0");
  if (block_tokens < 1) ThrowInvalidArgument("block_tokens must be >= 1");
  if (epoch_history < 0) ThrowInvalidArgument("epoch_history must be >= 0");
  if (!(pinned_wait_seconds >= 0 && pinned_wait_seconds <= 3600)) {
    ThrowInvalidArgument("pinned_wait_seconds must be in [0, 3600]");
  }
  if (!(active_seconds >= 0 && active_seconds <= 86400)) {
    ThrowInvalidArgument("active_seconds must be in [0, 86400]");
  }
}

// --- Manager ------------------------------------------------------------------

namespace {

// Every step checks its recipe against the manager's (`mine`, whose
// fingerprint is `fingerprint`): the same fields pass without a fingerprint,
// a JSON document and a SHA-256 (kv_bench BM_RecipeCheckedStep put a checked
// step at 4.3x an unchecked one).
void CheckRecipe(const KvCacheRecipe& mine, const std::string& fingerprint,
                 const KvCacheRecipe* recipe) {
  if (recipe == nullptr || *recipe == mine) return;
  const std::string theirs = recipe->Fingerprint();
  if (theirs != fingerprint) {
    throw Error(ErrorKind::kIncompatibleRecipe,
                "request cache recipe does not match this shard's loaded recipe (request " +
                    theirs + " vs shard " + fingerprint + ")");
  }
}

// Validates an append up front (the reference validates per layer only while
// appending, after evicting others): exactly the owned layers, one token count,
// (n, heads, dim) keys and values. Returns the token count.
int64_t ValidateKv(const ManagerState& m, std::span<const LayerKv> kv) {
  std::vector<bool> seen(static_cast<size_t>(m.num_layers), false);
  bool exact = static_cast<int>(kv.size()) == m.num_layers;
  std::string got;
  for (const LayerKv& l : kv) {
    got += (got.empty() ? "" : ", ") + std::to_string(l.layer);
    const int idx = l.layer - m.first_layer;
    if (idx < 0 || idx >= m.num_layers || seen[static_cast<size_t>(idx)]) {
      exact = false;
    } else {
      seen[static_cast<size_t>(idx)] = true;
    }
  }
  if (!exact) {
    ThrowInvalidArgument("append must cover exactly the owned layers [" +
                         std::to_string(m.first_layer) + ".." +
                         std::to_string(m.first_layer + m.num_layers - 1) + "], got [" + got + "]");
  }
  const int64_t n = kv[0].n_tokens;
  for (const LayerKv& l : kv) {
    if (l.n_tokens != n) ThrowInvalidArgument("append token counts disagree across layers");
  }
  if (n < 0) ThrowInvalidArgument("append token count must be >= 0");
  const int64_t row = int64_t{m.n_kv_heads} * m.head_dim;
  for (const LayerKv& l : kv) {
    const std::string want = "(" + std::to_string(n) + ", " + std::to_string(m.n_kv_heads) + ", " +
                             std::to_string(m.head_dim) + ")";
    if (static_cast<int64_t>(l.keys.size()) != n * row) {
      ThrowInvalidArgument("layer " + std::to_string(l.layer) + " keys must be " + want + ", got " +
                           std::to_string(l.keys.size()) + " values");
    }
    if (static_cast<int64_t>(l.values.size()) != n * row) {
      ThrowInvalidArgument("layer " + std::to_string(l.layer) + " values must be " + want +
                           ", got " + std::to_string(l.values.size()) + " values");
    }
  }
  return n;
}

// The lookup every reading op starts with (mu held), in the reference's
// order: stale epoch (throws), TTL eviction at `now`, live lookup. A dead key
// answers its recorded miss (counted).
std::variant<SessionEntry*, CacheMiss> LookupLiveLocked(ManagerState& m, std::string_view id,
                                                        int64_t epoch, double now) REQUIRES(m.mu) {
  m.CheckStaleLocked(id, epoch);
  m.EvictExpiredLocked(now);
  if (SessionEntry* e = m.FindLiveLocked(id, epoch)) return e;
  CacheMiss miss = m.RecordedMissLocked(id, epoch);
  ++m.misses[static_cast<int>(miss.reason)];
  return miss;
}

struct Begun {
  SessionEntry* entry;
  int64_t start_pos;
  int64_t n_new;
};

// A reservation that would fit the budget, but whose room is held by other
// sessions pinned by in-flight steps, or (`active`) by active sessions that
// arrived before it (HotKvStateConfig::active_seconds): transient. Thrown by
// BeginLocked and handled by BeginWaitingLocked, which waits for room.
struct RoomShortage {
  std::string message;
  bool active = false;
};

// No room for `extra` more blocks of `e` after MakeRoomLocked. Held by
// pins, or by a new context's earlier active sessions: throws RoomShortage
// (the caller waits). Held by earlier active sessions while `e` has state:
// `e` is the latest of the active sessions, and is preempted itself (its
// miss returned) rather than stall, in a batch, the steps queued behind it.
CacheMiss NoRoomLocked(ManagerState& m, SessionEntry* e, int64_t extra) REQUIRES(m.mu) {
  const bool active = m.config.active_seconds > 0 &&
                      m.pool.used() - m.EvictableBlocksLocked(e) + extra <= m.pool.capacity();
  if (active && e->seq_len > 0) {
    CacheMiss miss{e->session_id, e->route_epoch, CacheMissReason::kPreempted,
                   "the KV budget is full of active sessions that arrived before it"};
    m.DropLocked(e, CacheMissReason::kPreempted, true, miss.detail);
    ++m.misses[static_cast<int>(CacheMissReason::kPreempted)];
    return miss;
  }
  const std::string holders =
      active ? "active sessions that arrived before it" : "sessions pinned by in-flight requests";
  throw RoomShortage{"session " + ShortSessionId(e->session_id) + " needs " +
                         std::to_string(extra * m.block_bytes) + " more bytes but " + holders +
                         " hold the rest of the KV budget " + std::to_string(m.config.budget_bytes),
                     active};
}

// The shared check sequence of Append and BeginStep (mu held): stale, TTL,
// live lookup, busy, expected_seq_len, shape (Append), budget with eviction
// of others (LRU, or MakeRoomLocked's protecting order), reserve, refresh.
// Returns a CacheMiss value on a miss (this session's own preemption too).
std::variant<Begun, CacheMiss> BeginLocked(ManagerState& m, std::string_view id, int64_t epoch,
                                           std::optional<int64_t> expected,
                                           const std::span<const LayerKv>* kv, int64_t n_new)
    REQUIRES(m.mu) {
  const double now = m.NowLocked();
  auto found = LookupLiveLocked(m, id, epoch, now);
  if (auto* miss = std::get_if<CacheMiss>(&found)) return std::move(*miss);
  SessionEntry* e = std::get<SessionEntry*>(found);
  if (e->step_active) {
    throw Error(ErrorKind::kSessionBusy, "session " + ShortSessionId(id) + " epoch " +
                                             std::to_string(epoch) +
                                             " already has a step in flight; concurrent steps "
                                             "on one session are refused");
  }
  if (expected.has_value() && *expected != e->seq_len) {
    std::string detail = "cache holds " + std::to_string(e->seq_len) + ", caller expected " +
                         std::to_string(*expected);
    m.DropLocked(e, CacheMissReason::kSeqLenMismatch, true, detail);
    ++m.misses[static_cast<int>(CacheMissReason::kSeqLenMismatch)];
    return CacheMiss{std::string(id), epoch, CacheMissReason::kSeqLenMismatch, detail};
  }
  if (kv != nullptr) n_new = ValidateKv(m, *kv);
  if (n_new < 0) ThrowInvalidArgument("n_new must be >= 0");
  const int64_t need = m.BlocksFor(e->seq_len + n_new);
  if (need > m.pool.capacity()) {
    throw Error(ErrorKind::kBudgetExceeded,
                "session " + ShortSessionId(id) + " needs " + std::to_string(need * m.block_bytes) +
                    " bytes which exceeds the KV budget " + std::to_string(m.config.budget_bytes));
  }
  const int64_t have = static_cast<int64_t>(e->blocks.size());
  const int64_t extra = need - have;
  m.MakeRoomLocked(e, now, [&] {
    m.mu.AssertHeld();  // called under the lock by MakeRoomLocked
    return m.pool.used() + extra <= m.pool.capacity();
  });
  if (m.pool.used() + extra > m.pool.capacity()) return NoRoomLocked(m, e, extra);
  ++m.hits;
  try {
    for (int64_t i = 0; i < extra; ++i) {
      e->blocks.push_back(m.pool.Allocate());  // non-null: capacity checked above
      ++m.live_blocks;
    }
  } catch (...) {
    m.ShrinkBlocksLocked(e, have);
    throw;
  }
  m.TouchLocked(e, now);
  e->step_active = true;
  m.PinLocked(e);
  return Begun{e, e->seq_len, n_new};
}

thread_local bool no_pinned_wait = false;  // a ScopedNoPinnedWait lives on this thread

// BeginLocked, waiting (mu released) up to config.pinned_wait_seconds of real
// time while the only obstacle is room pinned by other in-flight steps. Each
// attempt re-runs the whole check sequence, since the state may change while
// the lock is released. Throws kBudgetExceeded when the wait runs out.
std::variant<Begun, CacheMiss> BeginWaitingLocked(ManagerState& m, std::string_view id,
                                                  int64_t epoch, std::optional<int64_t> expected,
                                                  const std::span<const LayerKv>* kv, int64_t n_new)
    REQUIRES(m.mu) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(m.config.pinned_wait_seconds));
  while (true) {
    try {
      return BeginLocked(m, id, epoch, expected, kv, n_new);
    } catch (const RoomShortage& shortage) {
      if (no_pinned_wait) throw PinnedRoomError(shortage.message);
      if (std::chrono::steady_clock::now() >= deadline) {
        // Held by earlier active sessions: busy until they end (callers
        // retry with backoff), not a budget the request can never fit.
        if (shortage.active) throw Error(ErrorKind::kResourceExhausted, shortage.message);
        throw Error(ErrorKind::kBudgetExceeded, shortage.message);
      }
      ++(shortage.active ? m.room_waits : m.pinned_waits);
      m.unpinned.WaitUntil(deadline);
    }
  }
}

// `rows` consecutive rows of `row` values (n_kv_heads heads of head_dim).
void StoreRows(const ManagerState& m, uint8_t* dst, const float* src, int64_t rows) {
  const int64_t n = rows * m.n_kv_heads * m.head_dim;
  if (m.dtype == KvDtype::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (IsQuantizedKv(m.dtype)) {
    ops::QuantizeKvRow(m.dtype, src, static_cast<int>(rows * m.n_kv_heads), m.head_dim, dst);
  } else {
    for (int64_t i = 0; i < n; ++i) StoreAs(m.dtype, dst + 2 * i, src[i]);
  }
}

}  // namespace

ScopedNoPinnedWait::ScopedNoPinnedWait() : outer_(no_pinned_wait) { no_pinned_wait = true; }
ScopedNoPinnedWait::~ScopedNoPinnedWait() { no_pinned_wait = outer_; }

HotKvStateManager::HotKvStateManager(KvCacheRecipe recipe, HotKvStateConfig config,
                                     const Clock* clock)
    : recipe_(std::move(recipe)), config_(config) {
  recipe_.Validate();
  config_.Validate();
  if (clock == nullptr) ThrowInvalidArgument("clock must not be null");
  if (config_.block_tokens > std::numeric_limits<int64_t>::max() / recipe_.BytesPerToken()) {
    ThrowInvalidArgument("block_tokens * bytes_per_token overflows");
  }
  impl_ = std::make_unique<ManagerState>(recipe_, config_, clock);
}

HotKvStateManager::~HotKvStateManager() = default;

int64_t HotKvStateManager::block_bytes() const { return impl_->block_bytes; }

SessionHandle HotKvStateManager::Open(std::string_view session_id, int64_t route_epoch,
                                      const KvCacheRecipe* recipe) {
  if (IsBlank(session_id)) ThrowInvalidArgument("session_id must be a non-empty string");
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  CheckRecipe(recipe_, m.fingerprint, recipe);
  MutationLock lock(&m);
  m.CheckStaleLocked(session_id, route_epoch);
  const double now = m.NowLocked();
  m.EvictExpiredLocked(now);
  IdRecord* r = m.FindId(session_id);
  if (r != nullptr && r->live != nullptr) {
    if (r->live->route_epoch == route_epoch) {
      // A re-open at the same epoch replaces the prior context (no miss recorded).
      m.DropLocked(r->live, CacheMissReason::kSupersededEpoch, false,
                   "replaced by a re-open of the same key");
    } else {
      m.DropLocked(r->live, CacheMissReason::kSupersededEpoch, true);
    }
  }
  if (r == nullptr) {
    auto [it, inserted] = m.ids.try_emplace(std::string(session_id));
    r = &it->second;
    r->id = &it->first;
    r->arrival = m.next_arrival++;
  } else {
    m.idle_ids.Remove(r);
  }
  auto* e = new SessionEntry(std::string(session_id), route_epoch);
  e->last_tick = now;
  e->id = r;
  r->live = e;
  r->latest_epoch = route_epoch;
  m.lru.PushBack(e);
  m.ForgetMissLocked(session_id, route_epoch);
  m.EvictLruUntilLocked(e, [&] {
    m.mu.AssertHeld();  // called under the lock by EvictLruUntilLocked
    return m.lru.size() <= m.config.max_sessions;
  });
  m.PinLocked(e);
  return SessionHandle(this, e);
}

int64_t HotKvStateManager::Append(std::string_view session_id, int64_t route_epoch,
                                  std::span<const LayerKv> kv, const KvCacheRecipe* recipe,
                                  std::optional<int64_t> expected_seq_len) {
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  CheckRecipe(recipe_, m.fingerprint, recipe);
  StepResult begun = ReserveStep(session_id, route_epoch, expected_seq_len, &kv, 0);
  if (auto* miss = std::get_if<CacheMiss>(&begun)) throw CacheMissError(std::move(*miss));
  KvStep& step = std::get<KvStep>(begun);
  // Copy only the new rows, without the lock: the step owns them.
  const int64_t row = int64_t{m.n_kv_heads} * m.head_dim;
  // Rows of consecutive positions inside one block are contiguous in its K and
  // V planes, so each run up to a block boundary is one copy.
  for (const LayerKv& l : kv) {
    const ops::PagedKvLayer v = m.View(step.entry_, l.layer, step.start_pos_ + step.n_new_);
    for (int64_t t = 0; t < step.n_new_;) {
      const int64_t pos = step.start_pos_ + t;
      const int64_t run = std::min<int64_t>(step.n_new_ - t, v.block_tokens - pos % v.block_tokens);
      StoreRows(m, v.KRow(pos), l.keys.data() + t * row, run);
      StoreRows(m, v.VRow(pos), l.values.data() + t * row, run);
      t += run;
    }
  }
  const int64_t end = step.start_pos_ + step.n_new_;
  if (auto miss = step.Commit()) throw CacheMissError(std::move(*miss));
  return end;
}

StepResult HotKvStateManager::BeginStep(std::string_view session_id, int64_t route_epoch,
                                        int64_t n_new, const KvCacheRecipe* recipe,
                                        std::optional<int64_t> expected_seq_len, bool clear_rows) {
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  CheckRecipe(recipe_, m.fingerprint, recipe);
  StepResult begun = ReserveStep(session_id, route_epoch, expected_seq_len, nullptr, n_new);
  if (std::holds_alternative<CacheMiss>(begun) || !clear_rows) return begun;
  KvStep& step = std::get<KvStep>(begun);
  // Reserved rows may hold another session's old data: clear them (outside
  // the lock) so a computation that skips a row never publishes foreign KV.
  for (int layer = m.first_layer; layer < m.first_layer + m.num_layers; ++layer) {
    const ops::PagedKvLayer v = m.View(step.entry_, layer, step.start_pos_ + step.n_new_);
    for (int64_t p = step.start_pos_; p < step.start_pos_ + step.n_new_;) {
      const int64_t run =
          std::min<int64_t>(step.start_pos_ + step.n_new_ - p, v.block_tokens - p % v.block_tokens);
      std::memset(v.KRow(p), 0, static_cast<size_t>(run) * v.row_bytes);
      std::memset(v.VRow(p), 0, static_cast<size_t>(run) * v.row_bytes);
      p += run;
    }
  }
  return begun;
}

StepResult HotKvStateManager::ReserveStep(std::string_view session_id, int64_t route_epoch,
                                          std::optional<int64_t> expected_seq_len,
                                          const std::span<const LayerKv>* kv, int64_t n_new) {
  ManagerState& m = *impl_;
  MutationLock lock(&m);
  auto r = BeginWaitingLocked(m, session_id, route_epoch, expected_seq_len, kv, n_new);
  if (auto* miss = std::get_if<CacheMiss>(&r)) return std::move(*miss);
  const Begun& b = std::get<Begun>(r);
  KvStep step;
  step.manager_ = this;
  step.entry_ = b.entry;
  step.start_pos_ = b.start_pos;
  step.n_new_ = b.n_new;
  return step;
}

std::string HotKvStateManager::InvariantViolation() const {
  MutexLock lock(&impl_->mu);
  return impl_->InvariantViolationLocked();
}

int64_t HotKvStateManager::Truncate(std::string_view session_id, int64_t route_epoch,
                                    int64_t length) {
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  MutationLock lock(&m);
  const double now = m.NowLocked();
  auto found = LookupLiveLocked(m, session_id, route_epoch, now);
  if (auto* miss = std::get_if<CacheMiss>(&found)) throw CacheMissError(std::move(*miss));
  SessionEntry* e = std::get<SessionEntry*>(found);
  if (e->step_active) {
    throw Error(ErrorKind::kSessionBusy, "cannot truncate session " + ShortSessionId(session_id) +
                                             " epoch " + std::to_string(route_epoch) +
                                             " while a step is in flight on it");
  }
  if (length < 0) ThrowInvalidArgument("truncate length must be >= 0");
  ++m.hits;
  const int64_t keep = std::min(length, e->seq_len);
  m.live_tokens -= e->seq_len - keep;
  e->seq_len = keep;
  m.ShrinkBlocksLocked(e, m.BlocksFor(keep));
  m.TouchLocked(e, now);
  return keep;
}

bool HotKvStateManager::Release(std::string_view session_id, int64_t route_epoch) {
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  MutationLock lock(&m);
  SessionEntry* e = m.FindLiveLocked(session_id, route_epoch);
  if (e != nullptr) {
    m.DropLocked(e, CacheMissReason::kReleased, true);
  } else {
    m.RecordMissLocked(session_id, route_epoch, CacheMissReason::kReleased, {});
  }
  return e != nullptr;
}

bool HotKvStateManager::Park(std::string_view session_id, int64_t route_epoch) {
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  MutationLock lock(&m);
  SessionEntry* e = m.FindLiveLocked(session_id, route_epoch);
  if (e != nullptr) e->parked = true;
  return e != nullptr;
}

ResolveResult HotKvStateManager::Resolve(std::string_view session_id, int64_t route_epoch,
                                         const KvCacheRecipe* recipe,
                                         std::optional<int64_t> expected_seq_len) {
  CheckEpoch(route_epoch);
  ManagerState& m = *impl_;
  CheckRecipe(recipe_, m.fingerprint, recipe);
  MutationLock lock(&m);
  const double now = m.NowLocked();
  auto found = LookupLiveLocked(m, session_id, route_epoch, now);
  if (auto* miss = std::get_if<CacheMiss>(&found)) return std::move(*miss);
  SessionEntry* e = std::get<SessionEntry*>(found);
  if (expected_seq_len.has_value() && *expected_seq_len != e->seq_len) {
    std::string detail = "cache holds " + std::to_string(e->seq_len) + ", caller expected " +
                         std::to_string(*expected_seq_len);
    m.DropLocked(e, CacheMissReason::kSeqLenMismatch, true, detail);
    ++m.misses[static_cast<int>(CacheMissReason::kSeqLenMismatch)];
    return CacheMiss{std::string(session_id), route_epoch, CacheMissReason::kSeqLenMismatch,
                     detail};
  }
  ++m.hits;
  m.TouchLocked(e, now);
  m.PinLocked(e);
  return SessionHandle(this, e);
}

SessionHandle HotKvStateManager::Get(std::string_view session_id, int64_t route_epoch,
                                     const KvCacheRecipe* recipe,
                                     std::optional<int64_t> expected_seq_len) {
  ResolveResult r = Resolve(session_id, route_epoch, recipe, expected_seq_len);
  if (auto* miss = std::get_if<CacheMiss>(&r)) throw CacheMissError(std::move(*miss));
  return std::move(std::get<SessionHandle>(r));
}

int64_t HotKvStateManager::SessionCount() {
  ManagerState& m = *impl_;
  MutationLock lock(&m);
  m.EvictExpiredLocked(m.NowLocked());
  return m.lru.size();
}

int64_t HotKvStateManager::TotalBytes() const {
  MutexLock lock(&impl_->mu);
  return impl_->live_blocks * impl_->block_bytes;
}

std::vector<std::pair<std::string, int64_t>> HotKvStateManager::SessionKeys() const {
  MutexLock lock(&impl_->mu);
  std::vector<std::pair<std::string, int64_t>> keys;
  keys.reserve(static_cast<size_t>(impl_->lru.size()));
  for (SessionEntry* e = impl_->lru.front(); e != nullptr; e = decltype(impl_->lru)::Next(e)) {
    keys.emplace_back(e->session_id, e->route_epoch);
  }
  return keys;
}

HotKvStats HotKvStateManager::Stats() const {
  const ManagerState& m = *impl_;
  MutexLock lock(&m.mu);
  HotKvStats s;
  s.live_sessions = m.lru.size();
  s.pinned_sessions = m.pinned;
  s.bytes_in_use = m.live_tokens * m.bytes_per_token;
  s.bytes_reserved = m.pool.used() * m.block_bytes;
  s.bytes_budget = m.config.budget_bytes;
  s.blocks_used = m.pool.used();
  s.blocks_free = m.pool.free_blocks();
  s.blocks_capacity = m.pool.capacity();
  s.hits = m.hits;
  for (int i = 0; i < kNumCacheMissReasons; ++i) {
    s.misses[i] = m.misses[i];
    s.evictions[i] = m.evictions[i];
  }
  s.replaced = m.replaced;
  s.pinned_waits = m.pinned_waits;
  s.room_waits = m.room_waits;
  s.remembered_epochs = static_cast<int64_t>(m.ids.size());
  s.remembered_misses = static_cast<int64_t>(m.miss_list.size());
  return s;
}

}  // namespace meshnet::kv
