// NodeCore: export, import, moved/ended answers and draining (see
// node/migration.h). A claim (Binding::migrating) holds a session while its KV
// is read or loaded: its steps and truncates wait for the claim to end, so no
// step changes rows being read, and none runs on rows not yet loaded.
#include <algorithm>
#include <chrono>

#include "node/identity.h"
#include "node/node_core.h"
#include "shard/step_cancel.h"
#include "util/secret.h"

namespace meshnet::node {

namespace {
constexpr auto kClaimWait = std::chrono::seconds(60);
}  // namespace

void NodeCore::WaitNotMigratingLocked(Binding& b) {
  Held(b);
  const auto deadline = std::chrono::steady_clock::now() + kClaimWait;
  while (b.migrating) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(ErrorKind::kSessionBusy,
                  "session " + b.session_id.substr(0, 8) + " is being moved to another node");
    }
    step_done_.WaitUntil(deadline);
  }
}

std::optional<StepReply> NodeCore::MovedOrEndedLocked(Binding& b, int64_t epoch) {
  Held(b);
  if (!b.moved_to.empty()) {
    if (b.move_untold) {
      b.move_untold = false;
      --untold_moves_;
      step_done_.SignalAll();  // WaitMovesTold
    }
    counters_.moved_answers.fetch_add(1, std::memory_order_relaxed);
    kv::CacheMiss miss{b.session_id, epoch, kv::CacheMissReason::kMoved,
                       "session moved to " + b.moved_to + "; continue there", b.moved_to};
    return StepReply{std::move(miss)};
  }
  if (!b.ended.empty()) {
    return StepReply{kv::CacheMiss{b.session_id, epoch, kv::CacheMissReason::kReleased, b.ended}};
  }
  return std::nullopt;
}

void NodeCore::EndClaim(const BindingPtr& b) {
  MutexLock lock(&mu_);
  Held(*b);
  b->migrating = false;
  step_done_.SignalAll();
}

SessionExportHeader NodeCore::SelfHeader() const {
  const ShardInfo info = node_->Info();
  const kv::KvCacheRecipe& recipe = node_->adapter().recipe();
  SessionExportHeader h;
  h.model_id = info.model_id;
  h.architecture = info.architecture;
  h.start_layer = info.start_layer;
  h.end_layer = info.end_layer;
  h.total_layers = info.total_layers;
  h.recipe_fingerprint = info.recipe_fingerprint;
  h.kv_dtype = recipe.kv_dtype;
  h.n_kv_heads = recipe.n_kv_heads;
  h.head_dim = recipe.head_dim;
  h.bytes_per_token = recipe.BytesPerToken();
  return h;
}

std::unique_ptr<SessionExporter> NodeCore::BeginExport(const std::string& session_id,
                                                       const std::string* secret) {
  BindingPtr b;
  int64_t epoch = 0;
  std::string secret_digest;
  {
    MutexLock lock(&mu_);
    auto it = bindings_.find(session_id);
    if (it == bindings_.end()) throw Error(ErrorKind::kCacheMiss, "no session bound here");
    b = it->second;
    Held(*b);
    if (secret != nullptr && !DigestEquals(SecretDigest(*secret), b->secret_digest)) {
      throw Error(ErrorKind::kPermissionDenied,
                  "session " + session_id.substr(0, 8) + " is bound to another secret");
    }
    WaitNotMigratingLocked(*b);
    const auto deadline = std::chrono::steady_clock::now() + kClaimWait;
    while (b->in_flight && std::chrono::steady_clock::now() < deadline) {
      step_done_.WaitUntil(deadline);
    }
    if (b->in_flight || b->migrating) throw Error(ErrorKind::kSessionBusy, "session is busy");
    if (!b->moved_to.empty() || !b->ended.empty()) {
      throw Error(ErrorKind::kCacheMiss, "session already moved or ended");
    }
    b->migrating = true;
    // Read under the lock: the claim keeps steps away, not the fields' lock.
    epoch = b->latest_epoch;
    secret_digest = b->secret_digest;
  }
  try {
    kv::ResolveResult r = manager().Resolve(session_id, epoch);
    if (auto* miss = std::get_if<kv::CacheMiss>(&r)) throw kv::CacheMissError(*miss);
    SessionExportHeader h = SelfHeader();
    h.session_id = session_id;
    h.secret_sha256 = std::move(secret_digest);
    h.route_epoch = epoch;
    const bool corrupt = exports_started_.fetch_add(1) == corrupt_export_;
    return std::make_unique<SessionExporter>(std::move(std::get<kv::SessionHandle>(r)),
                                             std::move(h), corrupt, [this, b] { EndClaim(b); });
  } catch (...) {
    EndClaim(b);
    throw;
  }
}

void NodeCore::MarkMoved(const std::string& session_id, const std::string& moved_to) {
  int64_t epoch = 0;
  {
    MutexLock lock(&mu_);
    auto it = bindings_.find(session_id);
    if (it == bindings_.end()) return;  // released meanwhile
    Binding& b = *it->second;
    Held(b);
    DropCachedResult(b);
    b.moved_to = moved_to;
    if (!b.move_untold) ++untold_moves_;
    b.move_untold = true;
    epoch = b.latest_epoch;
  }
  node_->Release(session_id, epoch);
  admission_.Release(session_id);
  counters_.sessions_moved.fetch_add(1, std::memory_order_relaxed);
}

void NodeCore::EndSession(const std::string& session_id, const std::string& detail) {
  int64_t epoch = 0;
  {
    MutexLock lock(&mu_);
    auto it = bindings_.find(session_id);
    if (it == bindings_.end()) return;
    Binding& b = *it->second;
    Held(b);
    WaitNotMigratingLocked(b);
    DropCachedResult(b);
    b.ended = detail;
    epoch = b.latest_epoch;
  }
  node_->Release(session_id, epoch);
  admission_.Release(session_id);
  counters_.sessions_ended.fetch_add(1, std::memory_order_relaxed);
}

int64_t NodeCore::EndSessionsIdleSince(std::chrono::steady_clock::time_point since,
                                       const std::string& detail) {
  std::vector<std::string> idle;
  {
    MutexLock lock(&mu_);
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {  // least recently touched first
      const Binding& b = **it;
      Held(b);
      if (b.touched >= since) break;
      if (b.moved_to.empty() && b.ended.empty() && !b.in_flight) idle.push_back(b.session_id);
    }
  }
  for (const std::string& id : idle) EndSession(id, detail);
  return static_cast<int64_t>(idle.size());
}

std::unique_ptr<SessionImporter> NodeCore::BeginImport(SessionExportHeader header) {
  try {
    if (draining()) throw Error(ErrorKind::kUnavailable, "import refused: this node is draining");
    ImportLimits limits;
    limits.self = SelfHeader();
    limits.max_tokens = node_->shard().hparams().context_length;
    limits.budget_bytes = manager().config().budget_bytes;
    auto imp = std::make_unique<SessionImporter>(std::move(header), limits);
    ClaimForImport(*imp);
    return imp;
  } catch (const Error&) {
    counters_.imports_rejected.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
}

// The session's binding (created if new) is claimed, it is admitted, and its
// rows [0, seq_len) are reserved at the import's epoch as one uncommitted step
// (invisible to readers, counted against the budget; LRU eviction makes room
// as for a prefill). The importer's abandon hook undoes all three unless
// CommitImport publishes the step.
void NodeCore::ClaimForImport(SessionImporter& imp) {
  const SessionExportHeader& h = imp.header();
  ImportClaim c{nullptr, false, h.session_id, h.route_epoch, false, false};
  {
    MutexLock lock(&mu_);
    c.binding = FindChecked(h.session_id, h.secret_sha256);
    if (!c.binding) {
      c.binding = CreateBinding(h.session_id, h.secret_sha256);
      c.created = true;
    }
    Held(*c.binding);
    if (!c.created && (c.binding->in_flight || c.binding->migrating)) {
      throw Error(ErrorKind::kSessionBusy, "import refused: the session is busy here");
    }
    c.binding->migrating = true;
  }
  try {
    admission_.Admit(h.session_id, [] { return shard::StepCancelled(); });
    c.admitted = true;
    manager().Open(h.session_id, h.route_epoch);
    c.opened = true;
    // Not cleared: the import writes every row (each chunk's size and the
    // total are checked) before it commits, or rolls back.
    kv::StepResult r = manager().BeginStep(h.session_id, h.route_epoch, h.seq_len, nullptr,
                                           std::nullopt, /*clear_rows=*/false);
    if (auto* miss = std::get_if<kv::CacheMiss>(&r)) throw kv::CacheMissError(*miss);
    imp.Reserve(
        std::move(std::get<kv::KvStep>(r)), [this, c] { UndoImportClaim(c); },
        [this, c] { PublishImportClaim(c); });
  } catch (...) {
    UndoImportClaim(c);
    throw;
  }
}

void NodeCore::UndoImportClaim(const ImportClaim& c) {
  if (c.opened) manager().Release(c.session_id, c.route_epoch);
  if (c.admitted) admission_.Release(c.session_id);
  MutexLock lock(&mu_);
  Held(*c.binding);
  c.binding->migrating = false;
  if (c.created && c.binding->linked) Unlink(*c.binding);
  step_done_.SignalAll();
}

void NodeCore::PublishImportClaim(const ImportClaim& c) {
  MutexLock lock(&mu_);
  Held(*c.binding);
  c.binding->migrating = false;
  c.binding->moved_to.clear();
  c.binding->ended.clear();
  c.binding->latest_epoch = std::max(c.binding->latest_epoch, c.route_epoch);
  step_done_.SignalAll();
}

int64_t NodeCore::CommitImport(SessionImporter& imp) {
  const SessionExportHeader& h = imp.header();
  try {
    if (!imp.finished()) ThrowInvalidArgument("import not verified");
    if (draining()) throw Error(ErrorKind::kUnavailable, "import refused: this node is draining");
    if (std::optional<kv::CacheMiss> miss = imp.step().Commit()) throw kv::CacheMissError(*miss);
  } catch (const Error&) {
    counters_.imports_rejected.fetch_add(1, std::memory_order_relaxed);
    throw;  // the importer's abandon hook undoes the claim
  }
  imp.Publish();
  admission_.Touch(h.session_id);
  NotePeak();
  counters_.sessions_imported.fetch_add(1, std::memory_order_relaxed);
  counters_.import_chunks_verified.fetch_add(imp.chunks(), std::memory_order_relaxed);
  counters_.import_bytes.fetch_add(imp.bytes(), std::memory_order_relaxed);
  return h.seq_len;
}

void NodeCore::StartDraining() { draining_.store(true); }

std::vector<std::string> NodeCore::MovableSessions() {
  std::vector<std::string> out;
  MutexLock lock(&mu_);
  for (const Binding* b : lru_) {
    Held(*b);
    if (b->moved_to.empty() && b->ended.empty()) out.push_back(b->session_id);
  }
  return out;
}

int64_t NodeCore::UntoldMoves() const {
  MutexLock lock(&mu_);
  return untold_moves_;
}

bool NodeCore::WaitMovesTold(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  MutexLock lock(&mu_);
  while (untold_moves_ > 0 && std::chrono::steady_clock::now() < deadline) {
    step_done_.WaitUntil(deadline);
  }
  return untold_moves_ == 0;
}

}  // namespace meshnet::node
