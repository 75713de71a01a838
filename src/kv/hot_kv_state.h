// HotKvStateManager: the bounded, isolated map (session id, route epoch) ->
// paged KV context of a shard's owned layers. The C++ port of the reference
// `meshnet_node/hot_kv_state.py`, behaviour for behaviour, plus:
//
//  * paged storage: a block pool of `block_tokens`-position blocks and a block
//    table per session; appends copy only new rows, truncate frees whole
//    blocks, nothing is re-copied as a sequence grows;
//  * a reserve / write / commit step that lets a computation write new K/V in
//    place while it attends; a failed (uncommitted) step rolls back;
//  * pinning: SessionHandle and KvStep pin a session. Eviction, TTL, release
//    and supersession mark a pinned session dead; its blocks return to the pool
//    when the last pin goes. A second concurrent step on one session is refused
//    (Error kSessionBusy);
//  * O(1) LRU/TTL eviction, incremental byte totals, a bounded latest-epoch map
//    and a bounded miss history.
//
// Order of checks. Every reference operation checks in the reference's order
// (see ../../../shared/spec/kv-trace.md), so the same error wins.
//
// Deliberate differences from the reference (none visible in a trace):
//  * Append validates every layer's shape before evicting anyone or writing
//    anything (the reference checks per layer while appending, after evicting
//    others, and can half-append); the error is still kInvalidArgument at the
//    reference's position in the order of checks.
//  * A same-key re-open records no miss (as the reference), but a pinned old
//    context dies with reason kSupersededEpoch and detail "replaced by a
//    re-open of the same key" (what its KvStep::Commit reports).
//  * The clock is clamped to the largest value seen, so LRU order stays
//    last_tick order even if a Clock misbehaves.
//  * Latest epochs of ids with no live state are forgotten beyond
//    config.epoch_history (least recently touched first); for a forgotten id a
//    lower epoch is no longer stale.
//
// Byte accounting. The budget counts bytes actually reserved:
// blocks * block_tokens * BytesPerToken(), including blocks of dead sessions
// still pinned and rows reserved by in-flight steps. With block_tokens == 1 and
// nothing pinned this equals the reference's seq_len * bytes_per_token.
//
// Eviction under pressure (session cap or byte budget) picks the least
// recently used session that is not this request's own and is not pinned
// (by a SessionHandle or an in-flight KvStep): evicting a pinned session would
// free nothing until the pin goes, and would kill a request in the middle of
// its computation. If no such victim exists the cap may be exceeded by pinned
// sessions only, and a reservation that would fit the budget alone waits (the
// lock released, up to config.pinned_wait_seconds) for pins to go, then fails
// with kBudgetExceeded (the requesting session untouched; victims already
// evicted stay evicted). With config.active_seconds the byte budget's victims
// are chosen to protect active sessions instead (see there).
// TTL expiry, release and supersession do apply to pinned sessions.
//
// Thread-safety: every method is thread-safe. One mutex guards the maps and
// lists; no lock is held while a caller computes with a KvStep or reads through
// a SessionHandle. Contents of a session may be read through a SessionHandle
// only while no step or Truncate runs on that session (the session's owner
// serializes its own steps, truncates and reads); eviction, expiry, release and
// supersession from other threads never move or free pinned rows.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kv/cache_miss.h"
#include "kv/recipe.h"
#include "ops/paged_kv.h"
#include "util/clock.h"

namespace meshnet::kv {

struct HotKvStateConfig {
  int64_t budget_bytes = 64LL << 20;
  int64_t max_sessions = 8;
  double ttl_seconds = 600.0;  // 0 disables TTL
  int64_t miss_history = 256;
  int block_tokens = 16;  // 1 gives the reference's exact byte accounting
  // How many session ids whose state is gone still remember their latest epoch
  // (for stale-epoch checks). Ids with live state are always remembered.
  int64_t epoch_history = 1 << 16;
  // How long (real time, not the injected Clock) a reservation that would fit
  // waits for sessions pinned by other in-flight steps to release their room
  // before failing with kBudgetExceeded. That shortage is transient; 0 fails
  // at once.
  double pinned_wait_seconds = 5.0;
  // Protection of active sessions (0: off, the reference's LRU over every
  // unpinned session; what traces replay). Otherwise a session with a step
  // within the last `active_seconds` (the Clock's) is active, and room for a
  // reservation under the byte budget comes from, in order: idle sessions
  // (least recently used first); then active sessions that arrived after the
  // requester, the latest first (preemption: a session keeps its arrival
  // across re-opens, so one preempted and re-prefilled goes before later
  // ones, and the earliest sessions always progress to their end). When only
  // the eviction of earlier active sessions could make room, a session with
  // state is itself the latest: it is preempted (its step answers the miss,
  // and steps batched behind it do not stall); a new context waits for room
  // (as for pinned room, up to pinned_wait_seconds), then fails with
  // kResourceExhausted: busy, retry. Without it, sessions
  // that together outgrow the budget evict each other's state round after
  // round (each re-prefill evicting another) until they give up. The session
  // cap (max_sessions) keeps the reference's LRU either way.
  double active_seconds = 0;
  // Debug: after every mutating operation, check the internal invariants
  // (HotKvStateManager::InvariantViolation) and abort naming a broken one.
  // O(sessions + blocks) per operation. On by default in sanitizer builds.
#ifdef MESHNET_CHECK_INVARIANTS
  bool check_invariants = true;
#else
  bool check_invariants = false;
#endif

  // Reference checks (budget > 0, max_sessions >= 1, ttl >= 0, miss_history >= 0)
  // plus block_tokens >= 1, epoch_history >= 0, pinned_wait_seconds in
  // [0, 3600] and active_seconds in [0, 86400] (serve's --active-window).
  // Throws kInvalidArgument.
  void Validate() const;
};

// Counters and gauges for metrics. All gauges are exact at the moment of the
// snapshot; counters are monotonic over the manager's life.
struct HotKvStats {
  int64_t live_sessions = 0;
  int64_t pinned_sessions = 0;  // live or dead sessions with pins
  int64_t bytes_in_use = 0;     // sum(seq_len) * bytes_per_token over live sessions
  int64_t bytes_reserved = 0;   // blocks held (live + dead-but-pinned) * block bytes
  int64_t bytes_budget = 0;
  int64_t blocks_used = 0;
  int64_t blocks_free = 0;      // allocated from the OS, on the free list
  int64_t blocks_capacity = 0;  // budget / block bytes
  int64_t hits = 0;             // lookups (resolve/get/step/append/truncate) finding live state
  int64_t misses[kNumCacheMissReasons] = {};     // misses answered, by reason
  int64_t evictions[kNumCacheMissReasons] = {};  // sessions dropped, by reason
  int64_t replaced = 0;           // contexts replaced by a same-key re-open (no miss recorded)
  int64_t remembered_epochs = 0;  // size of the latest-epoch map
  int64_t remembered_misses = 0;  // size of the miss history
  int64_t pinned_waits = 0;       // waits of reservations for room pinned by in-flight steps
  int64_t room_waits = 0;         // waits for room held by earlier active sessions (active_seconds)
};

// One owned layer's new K/V for Append (reference: kv_by_layer[layer] = (k, v)).
// keys/values are row-major (n_tokens, n_kv_heads, head_dim) in float32 and are
// rounded to the recipe's kv dtype.
struct LayerKv {
  int layer = 0;
  int64_t n_tokens = 0;
  std::span<const float> keys;
  std::span<const float> values;
};

// While one lives on a thread, that thread's reservations do not wait for
// room pinned by other in-flight steps: they throw PinnedRoomError at once.
// For a caller that may hold those pins itself (node::Node::StepMany begins
// several steps before it runs any): it runs what it holds, then retries
// without one.
class ScopedNoPinnedWait {
 public:
  ScopedNoPinnedWait();
  ~ScopedNoPinnedWait();
  ScopedNoPinnedWait(const ScopedNoPinnedWait&) = delete;
  ScopedNoPinnedWait& operator=(const ScopedNoPinnedWait&) = delete;

 private:
  bool outer_;
};
// kBudgetExceeded: the reservation would fit, but pinned room holds it up.
class PinnedRoomError : public Error {
 public:
  explicit PinnedRoomError(const std::string& message)
      : Error(ErrorKind::kBudgetExceeded, message) {}
};

class HotKvStateManager;
struct SessionEntry;  // private to hot_kv_state.cc
struct ManagerState;  // private to hot_kv_state.cc

// A pin on one session's context. Move-only. While held, the session's blocks
// stay allocated even if it is evicted, released or superseded (alive() turns
// false). Must not outlive its manager.
class SessionHandle {
 public:
  SessionHandle() = default;
  SessionHandle(SessionHandle&& other) noexcept;
  SessionHandle& operator=(SessionHandle&& other) noexcept;
  SessionHandle(const SessionHandle&) = delete;
  SessionHandle& operator=(const SessionHandle&) = delete;
  ~SessionHandle();

  bool valid() const { return entry_ != nullptr; }
  const std::string& session_id() const;
  int64_t route_epoch() const;
  int64_t seq_len() const;  // committed positions
  bool alive() const;       // still in the store
  // A read view of owned layer `layer` (absolute index) over [0, seq_len).
  ops::PagedKvLayer Layer(int layer) const;
  // Committed K or V of `layer` widened (q8_0 / q4_0: dequantized) to
  // float32, (seq_len, heads, dim).
  std::vector<float> ReadKeys(int layer) const;
  std::vector<float> ReadValues(int layer) const;

 private:
  friend class HotKvStateManager;
  SessionHandle(HotKvStateManager* m, SessionEntry* e) : manager_(m), entry_(e) {}
  HotKvStateManager* manager_ = nullptr;
  SessionEntry* entry_ = nullptr;
};

// An exclusive, in-flight step that reserved rows [start_pos, start_pos+n_new)
// on a session. Move-only. Commit() publishes the rows; destruction without a
// successful Commit() rolls back (the reserved blocks return to the pool).
class KvStep {
 public:
  KvStep() = default;
  KvStep(KvStep&& other) noexcept;
  KvStep& operator=(KvStep&& other) noexcept;
  KvStep(const KvStep&) = delete;
  KvStep& operator=(const KvStep&) = delete;
  ~KvStep();

  bool valid() const { return entry_ != nullptr; }
  const std::string& session_id() const;
  int64_t route_epoch() const;
  int64_t start_pos() const { return start_pos_; }
  int64_t n_new() const { return n_new_; }
  // Read/write view of owned layer `layer` (absolute index) over
  // [0, start_pos + n_new). The computation reads [0, start_pos) and writes the
  // reserved rows [start_pos, start_pos + n_new).
  ops::PagedKvLayer Layer(int layer) const;

  // Publishes the reserved rows: seq_len += n_new, last_tick = now, MRU.
  // Returns the CacheMiss (and rolls back) if the session died during the step
  // (evicted, expired, released, superseded or replaced). The step is finished
  // either way.
  std::optional<CacheMiss> Commit();
  // Explicit rollback (what the destructor does).
  void Rollback();

 private:
  friend class HotKvStateManager;
  HotKvStateManager* manager_ = nullptr;
  SessionEntry* entry_ = nullptr;
  int64_t start_pos_ = 0;
  int64_t n_new_ = 0;
};

using ResolveResult = std::variant<SessionHandle, CacheMiss>;
using StepResult = std::variant<KvStep, CacheMiss>;

class HotKvStateManager {
 public:
  // Validates recipe and config (kInvalidArgument). `clock` must outlive the
  // manager.
  HotKvStateManager(KvCacheRecipe recipe, HotKvStateConfig config,
                    const Clock* clock = SteadyClock::Default());
  // Requires that no SessionHandle or KvStep is still held (aborts naming
  // the count otherwise: a pin would point into freed memory).
  ~HotKvStateManager();
  HotKvStateManager(const HotKvStateManager&) = delete;
  HotKvStateManager& operator=(const HotKvStateManager&) = delete;

  const KvCacheRecipe& recipe() const { return recipe_; }
  const HotKvStateConfig& config() const { return config_; }
  int64_t block_bytes() const;

  // --- The reference operations (same checks, same order) -----------------

  // Creates (or replaces) an empty context. Errors: kInvalidArgument (blank
  // session id, negative epoch), kIncompatibleRecipe, kStaleEpoch.
  SessionHandle Open(std::string_view session_id, int64_t route_epoch,
                     const KvCacheRecipe* recipe = nullptr);

  // Appends K/V for exactly the owned layers (all-or-nothing: every shape is
  // validated before anything is evicted or written). Returns the new seq_len.
  // Errors: kInvalidArgument, kIncompatibleRecipe, kStaleEpoch,
  // CacheMissError, kBudgetExceeded (session untouched), kSessionBusy.
  int64_t Append(std::string_view session_id, int64_t route_epoch, std::span<const LayerKv> kv,
                 const KvCacheRecipe* recipe = nullptr,
                 std::optional<int64_t> expected_seq_len = std::nullopt);

  // Keeps the first min(length, seq_len) positions (whole blocks beyond are
  // freed). Errors: kInvalidArgument (negative epoch; negative length, checked
  // after the lookup), kStaleEpoch, CacheMissError, kSessionBusy.
  int64_t Truncate(std::string_view session_id, int64_t route_epoch, int64_t length);

  // Drops the key if present (no stale check, no TTL eviction) and always
  // records `released` for it. Returns whether it was in the store.
  bool Release(std::string_view session_id, int64_t route_epoch);

  // Not a reference operation: the session's client keeps it for later (a
  // prefix cache) and runs no step meanwhile. With config.active_seconds it
  // counts as idle until its next step: room for others comes from parked
  // sessions first (least recently used first), whatever their last step.
  // Without active_seconds, LRU as before. Returns whether the key was live.
  bool Park(std::string_view session_id, int64_t route_epoch);

  // The live context (pinned) or an explicit CacheMiss.
  ResolveResult Resolve(std::string_view session_id, int64_t route_epoch,
                        const KvCacheRecipe* recipe = nullptr,
                        std::optional<int64_t> expected_seq_len = std::nullopt);
  // Strict accessor: throws CacheMissError on a miss.
  SessionHandle Get(std::string_view session_id, int64_t route_epoch,
                    const KvCacheRecipe* recipe = nullptr,
                    std::optional<int64_t> expected_seq_len = std::nullopt);

  // --- The paged step path --------------------------------------------------

  // Resolve + reserve in one: checks like Append (epoch, recipe, stale, TTL,
  // live, expected_seq_len, budget with LRU eviction of others), refreshes the
  // session (last_tick, MRU) and reserves room for `n_new` positions. Errors as
  // Append; a dead key is a CacheMiss value, not an exception. The reserved
  // rows are zeroed (they may hold another session's old data) unless
  // `clear_rows` is false: only for a caller that writes every reserved row
  // before it commits (a verified import), or rolls back.
  StepResult BeginStep(std::string_view session_id, int64_t route_epoch, int64_t n_new,
                       const KvCacheRecipe* recipe = nullptr,
                       std::optional<int64_t> expected_seq_len = std::nullopt,
                       bool clear_rows = true);

  // --- Introspection ----------------------------------------------------------

  int64_t SessionCount();      // evicts expired first (reference session_count)
  int64_t TotalBytes() const;  // reserved bytes of live sessions
  // Live keys in LRU order, oldest first.
  std::vector<std::pair<std::string, int64_t>> SessionKeys() const;
  HotKvStats Stats() const;
  // The first broken internal invariant, "" if none (see
  // HotKvStateConfig::check_invariants). For tests.
  std::string InvariantViolation() const;

 private:
  friend class SessionHandle;
  friend class KvStep;
  // Append's and BeginStep's reservation (the manager's lock held inside):
  // the checks of BeginStep (with `kv`'s shapes for Append), waiting for
  // pinned room; the step or the miss.
  StepResult ReserveStep(std::string_view session_id, int64_t route_epoch,
                         std::optional<int64_t> expected_seq_len,
                         const std::span<const LayerKv>* kv, int64_t n_new);
  KvCacheRecipe recipe_;
  HotKvStateConfig config_;
  std::unique_ptr<ManagerState> impl_;
};

}  // namespace meshnet::kv
