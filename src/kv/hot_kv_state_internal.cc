// ManagerState: the locked helpers behind HotKvStateManager. The invariants
// they maintain are stated at the top of hot_kv_state.cc.
#include "kv/hot_kv_state_internal.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_set>

#include "util/error.h"

namespace meshnet::kv {

ManagerState::ManagerState(const KvCacheRecipe& recipe, const HotKvStateConfig& cfg, const Clock* c)
    : clock(c),
      config(cfg),
      fingerprint(recipe.Fingerprint()),
      first_layer(recipe.start_layer),
      num_layers(recipe.num_owned_layers()),
      n_kv_heads(recipe.n_kv_heads),
      head_dim(recipe.head_dim),
      dtype(recipe.kv_dtype),
      row_bytes(KvRowBytes(recipe.kv_dtype, recipe.n_kv_heads, recipe.head_dim)),
      bytes_per_token(recipe.BytesPerToken()),
      block_bytes(bytes_per_token * cfg.block_tokens),
      pool(static_cast<size_t>(block_bytes), cfg.budget_bytes / block_bytes) {}

ManagerState::~ManagerState() {
  // A SessionHandle or KvStep that outlived the manager would point into
  // freed memory: a bug in the caller, reported where it happens.
  if (pinned != 0) {
    std::fprintf(stderr,
                 "meshnet: HotKvStateManager destroyed with %lld pinned session(s): a "
                 "SessionHandle or KvStep outlived its manager\n",
                 static_cast<long long>(pinned));
    std::abort();
  }
  while (SessionEntry* e = lru.front()) {
    lru.Remove(e);
    FreeEntryLocked(e);
  }
  while (SessionEntry* e = dead.front()) {
    dead.Remove(e);
    FreeEntryLocked(e);
  }
}

double ManagerState::NowLocked() {
  const double t = clock->Now();
  if (t > last_now) last_now = t;
  return last_now;
}

IdRecord* ManagerState::FindId(std::string_view id) {
  auto it = ids.find(id);
  return it == ids.end() ? nullptr : &it->second;
}

void ManagerState::CheckStaleLocked(std::string_view id, int64_t epoch) {
  IdRecord* r = FindId(id);
  if (r == nullptr) return;
  if (r->live == nullptr) idle_ids.MoveToBack(r);  // touched
  if (epoch < r->latest_epoch) {
    throw Error(ErrorKind::kStaleEpoch, "session " + ShortSessionId(id) + " route epoch " +
                                            std::to_string(epoch) + " is stale; current epoch is " +
                                            std::to_string(r->latest_epoch));
  }
}

SessionEntry* ManagerState::FindLiveLocked(std::string_view id, int64_t epoch) {
  IdRecord* r = FindId(id);
  if (r == nullptr || r->live == nullptr || r->live->route_epoch != epoch) return nullptr;
  return r->live;
}

void ManagerState::EvictExpiredLocked(double now) {
  const double ttl = config.ttl_seconds;
  if (ttl <= 0) return;
  while (SessionEntry* e = lru.front()) {
    if (!(now - e->last_tick > ttl)) break;
    DropLocked(e, CacheMissReason::kEvictedTtl, true);
  }
}

void ManagerState::DropLocked(SessionEntry* e, CacheMissReason reason, bool record,
                              std::string detail) {
  lru.Remove(e);
  IdRecord* r = e->id;
  r->live = nullptr;
  idle_ids.PushBack(r);
  e->id = nullptr;
  live_blocks -= static_cast<int64_t>(e->blocks.size());
  live_tokens -= e->seq_len;
  e->live = false;
  e->death_reason = reason;
  if (record) {
    ++evictions[static_cast<int>(reason)];
    RecordMissLocked(e->session_id, e->route_epoch, reason, detail);
  } else {
    ++replaced;
  }
  e->death_detail = std::move(detail);
  if (e->pins == 0) {
    FreeEntryLocked(e);
  } else {
    dead.PushBack(e);
  }
}

void ManagerState::RecordMissLocked(std::string_view id, int64_t epoch, CacheMissReason reason,
                                    std::string detail) {
  if (config.miss_history <= 0) return;
  ForgetMissLocked(id, epoch);
  miss_list.push_back(CacheMiss{std::string(id), epoch, reason, std::move(detail)});
  auto it = std::prev(miss_list.end());
  miss_index.emplace(MissKey{it->session_id, epoch}, it);
  while (static_cast<int64_t>(miss_list.size()) > config.miss_history) {
    miss_index.erase(MissKey{miss_list.front().session_id, miss_list.front().route_epoch});
    miss_list.pop_front();
  }
}

void ManagerState::ForgetMissLocked(std::string_view id, int64_t epoch) {
  auto it = miss_index.find(MissKey{id, epoch});
  if (it == miss_index.end()) return;
  auto node = it->second;
  miss_index.erase(it);
  miss_list.erase(node);
}

CacheMiss ManagerState::RecordedMissLocked(std::string_view id, int64_t epoch) const {
  auto it = miss_index.find(MissKey{id, epoch});
  if (it != miss_index.end()) return *it->second;
  return CacheMiss{std::string(id), epoch, CacheMissReason::kUnknownSession, {}};
}

void ManagerState::TrimIdsLocked() {
  while (idle_ids.size() > config.epoch_history) {
    IdRecord* r = idle_ids.front();
    idle_ids.Remove(r);
    ids.erase(ids.find(std::string_view(*r->id)));
  }
}

void ManagerState::ShrinkBlocksLocked(SessionEntry* e, int64_t keep) {
  if (static_cast<int64_t>(e->blocks.size()) > keep) unpinned.SignalAll();  // room returns
  while (static_cast<int64_t>(e->blocks.size()) > keep) {
    pool.Free(e->blocks.back());
    e->blocks.pop_back();
    if (e->live) --live_blocks;
  }
}

int64_t ManagerState::EvictableBlocksLocked(const SessionEntry* protect) const {
  int64_t n = 0;
  for (const SessionEntry* e = lru.front(); e != nullptr; e = decltype(lru)::Next(e)) {
    if (e != protect && e->pins == 0) n += static_cast<int64_t>(e->blocks.size());
  }
  return n;
}

void ManagerState::PinLocked(SessionEntry* e) {
  if (e->pins++ == 0) ++pinned;
}

void ManagerState::UnpinLocked(SessionEntry* e) {
  if (--e->pins > 0) return;
  --pinned;
  unpinned.SignalAll();
  if (!e->live) {
    dead.Remove(e);
    FreeEntryLocked(e);
  }
}

void ManagerState::FreeEntryLocked(SessionEntry* e) {
  if (!e->blocks.empty()) unpinned.SignalAll();  // room returns
  for (uint8_t* b : e->blocks) pool.Free(b);
  delete e;
}

void ManagerState::TouchLocked(SessionEntry* e, double now) {
  e->last_tick = now;
  e->parked = false;
  lru.MoveToBack(e);
}

ops::PagedKvLayer ManagerState::View(const SessionEntry* e, int layer, int64_t n_positions) const {
  const int idx = layer - first_layer;
  if (idx < 0 || idx >= num_layers) {
    ThrowInvalidArgument("layer " + std::to_string(layer) + " is not owned by this shard (owned " +
                         std::to_string(first_layer) + ".." +
                         std::to_string(first_layer + num_layers - 1) + ")");
  }
  const int64_t bt = config.block_tokens;
  ops::PagedKvLayer v;
  v.blocks = e->blocks.data();
  v.block_tokens = static_cast<int32_t>(bt);
  v.k_offset = static_cast<size_t>(2 * idx * bt * row_bytes);
  v.v_offset = static_cast<size_t>((2 * idx + 1) * bt * row_bytes);
  v.row_bytes = static_cast<size_t>(row_bytes);
  v.n_kv_heads = n_kv_heads;
  v.head_dim = head_dim;
  v.dtype = dtype;
  v.n_positions = n_positions;
  return v;
}

namespace {

std::string Num(int64_t v) { return std::to_string(v); }

}  // namespace

std::string ManagerState::InvariantViolationLocked() const {
  int64_t tokens = 0, live_owned = 0, owned = 0, live = 0, with_pins = 0;
  std::unordered_set<const uint8_t*> seen;
  auto own = [&](const SessionEntry* e) -> std::string {
    mu.AssertHeld();  // called below, under the lock
    for (const uint8_t* b : e->blocks) {
      if (!pool.InUse(b)) return "session " + e->session_id + " owns a block the pool has free";
      if (!seen.insert(b).second) return "a block is owned twice (again by " + e->session_id + ")";
    }
    owned += static_cast<int64_t>(e->blocks.size());
    with_pins += e->pins > 0 ? 1 : 0;
    return "";
  };
  for (const SessionEntry* e = lru.front(); e != nullptr; e = decltype(lru)::Next(e)) {
    if (!e->live) return "dead session " + e->session_id + " on the LRU list";
    if (e->id == nullptr || e->id->live != e) return "live session " + e->session_id + " unlinked";
    if (!e->step_active && BlocksFor(e->seq_len) != static_cast<int64_t>(e->blocks.size())) {
      return "session " + e->session_id + " holds blocks beyond its length";
    }
    if (std::string bad = own(e); !bad.empty()) return bad;
    tokens += e->seq_len;
    live_owned += static_cast<int64_t>(e->blocks.size());
    ++live;
  }
  for (const SessionEntry* e = dead.front(); e != nullptr; e = decltype(dead)::Next(e)) {
    if (e->live || e->pins == 0) return "dead list holds " + e->session_id + " live or unpinned";
    if (std::string bad = own(e); !bad.empty()) return bad;
  }
  int64_t ids_live = 0;
  for (const auto& [id, r] : ids) ids_live += r.live != nullptr ? 1 : 0;
  if (ids_live != live) return "id records name " + Num(ids_live) + " live, LRU " + Num(live);
  if (idle_ids.size() != static_cast<int64_t>(ids.size()) - live) return "idle id list wrong";
  if (tokens != live_tokens) return "live_tokens " + Num(live_tokens) + " != " + Num(tokens);
  if (live_owned != live_blocks)
    return "live_blocks " + Num(live_blocks) + " != " + Num(live_owned);
  if (owned != pool.used()) return "pool uses " + Num(pool.used()) + ", owned " + Num(owned);
  if (with_pins != pinned) return "pinned " + Num(pinned) + " != " + Num(with_pins);
  return "";
}

void ManagerState::DebugCheckLocked() const {
  if (!config.check_invariants) return;
  const std::string bad = InvariantViolationLocked();
  if (bad.empty()) return;
  std::fprintf(stderr, "meshnet: HotKvStateManager invariant broken: %s\n", bad.c_str());
  std::abort();
}

}  // namespace meshnet::kv
