// NodeCore: everything a serving node does for one request on top of its
// Node, on node-level types (no transport; rpc/ is a thin shell over it).
//
//  * validation before anything runs: the request is checked against this
//    shard (Node::Validate: role, boundary contract, vocabulary) and a step
//    whose own token count exceeds the KV budget is refused, so a malformed
//    request changes nothing (Error kInvalidArgument / kBoundaryContract);
//  * session binding: the first prefill of a session id binds it to
//    SHA-256(secret); every later step, truncate or release must present the
//    same secret (Error kPermissionDenied). Bindings are bounded
//    (max_bindings, LRU among those without a step in flight); dropping a
//    binding releases the session's state, so an unbound session never has
//    live state and a step for it is answered with a CacheMiss;
//  * idempotent steps: each binding keeps the last result under its
//    (epoch, step id) with a digest of the request and its reply format. A
//    retry with the same key is answered from it (`replayed`), never run
//    twice; a retry arriving while the first is still running waits for it.
//    Cached results are bounded in total bytes (replay_cache_bytes, counted as
//    the encoded result; LRU drop — a decode retry that misses the cache is
//    then refused by expected_seq_len as a CacheMiss, never appended twice).
//    step_id 0 opts out.
// A step that finds the KV room pinned by other in-flight steps waits in the
// KV manager (HotKvStateConfig::pinned_wait_seconds), not here.
//
// No lock is held while the shard computes.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "node/admission.h"
#include "node/migration.h"
#include "node/node.h"
#include "node/step.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/mutex.h"

namespace meshnet::node {

struct NodeCoreOptions {
  int64_t max_bindings = 4096;
  int64_t replay_cache_bytes = 64LL << 20;
  // Which sessions may open KV state (node/admission.h): an active session is
  // never evicted to admit a new one; new ones wait, then kResourceExhausted.
  AdmissionOptions admission;
};

// How the caller will send a result back: part of what a retry must repeat.
struct ReplyFormat {
  KvDtype bundle_dtype = KvDtype::kF32;  // dtype of an answered bundle's rows
  bool want_logits = true;               // a tail answer carries the logits row
};

struct StepReply {
  StepResult result;
  bool replayed = false;       // answered from the result of an earlier try
  int64_t compute_micros = 0;  // time in the shard (0 when replayed or a miss)
};

// Truncate's answer: the new length, or a miss.
using TruncateReply = std::variant<int64_t, kv::CacheMiss>;

// Monotonic counters for metrics (relaxed atomics; read at scrape time).
struct NodeCounters {
  static constexpr int kNumLatencyBuckets = 16;  // upper bounds 50us * 2^i, then +Inf
  static double LatencyBucketBound(int i) { return 50e-6 * static_cast<double>(1 << i); }

  std::atomic<int64_t> steps_bundle{0};
  std::atomic<int64_t> steps_tail{0};
  std::atomic<int64_t> steps_miss{0};
  std::atomic<int64_t> steps_replayed{0};
  std::atomic<int64_t> errors[16] = {};  // by ErrorKind
  std::atomic<int64_t> latency_buckets[kNumLatencyBuckets + 1] = {};
  std::atomic<int64_t> latency_count{0};
  std::atomic<int64_t> latency_sum_nanos{0};
  std::atomic<int64_t> kv_bytes_reserved_peak{0};
  // Positions run by prefill steps (a re-prefill shows here).
  std::atomic<int64_t> prefill_tokens{0};
  // StepMany calls (several sessions' steps in one call) and their steps.
  std::atomic<int64_t> grouped_calls{0};
  std::atomic<int64_t> grouped_steps{0};
  // Migration (node/migration.h).
  std::atomic<int64_t> sessions_exported{0};       // exports read to the end
  std::atomic<int64_t> sessions_imported{0};       // imports verified and loaded
  std::atomic<int64_t> imports_rejected{0};        // imports refused, nothing loaded
  std::atomic<int64_t> import_chunks_verified{0};  // chunks whose CRC32C matched
  std::atomic<int64_t> import_bytes{0};            // KV bytes loaded by imports
  std::atomic<int64_t> kv_transfers{0};    // imports whose bytes came over the KV transfer port
  std::atomic<int64_t> sessions_moved{0};  // handed over to another node
  std::atomic<int64_t> sessions_ended{0};  // ended by a drain (explicit miss)
  std::atomic<int64_t> moved_answers{0};   // steps answered "moved to"
  // Chain forwarding (rpc/forward.h): steps this node sent on to the next
  // hop, and tail answers it wrote on a client's Returns stream.
  std::atomic<int64_t> chain_forwarded{0};
  std::atomic<int64_t> chain_returns{0};

  void ObserveLatency(double seconds);
  void CountError(ErrorKind kind);
  void CountResult(const StepResult& result);
};

class NodeCore {
 public:
  // `node` must outlive the core. kInvalidArgument for bad options.
  explicit NodeCore(Node* node, NodeCoreOptions options = {});
  ~NodeCore();
  NodeCore(const NodeCore&) = delete;
  NodeCore& operator=(const NodeCore&) = delete;

  NodeInfo Info();
  // Throws meshnet::Error; a CacheMiss is a value in the reply.
  StepReply Step(StepRequest request, const ReplyFormat& format = {});
  // Step for the decode steps of several sessions (a StepMany call; distinct
  // sessions, no prefill), each with its own checks, flight, reply and
  // counters as Step, on this thread; the ones that compute are queued in
  // the batcher together (Node::StepMany), so they need no thread each.
  // replies[i], or errors[i] with what Step would have thrown.
  void StepMany(std::span<StepRequest> requests, std::span<const ReplyFormat> formats,
                std::span<std::optional<StepReply>> replies, std::span<std::exception_ptr> errors);
  TruncateReply Truncate(const std::string& session_id, const std::string& secret,
                         int64_t route_epoch, int64_t length);
  // Whether state was held.
  bool Release(const std::string& session_id, const std::string& secret, int64_t route_epoch);
  // The session's client keeps it for a later request (a prefix cache):
  // idle from now until its next step, for the KV budget
  // (kv::HotKvStateManager::Park) and for admission (its slot frees now).
  // Whether state was held.
  bool Park(const std::string& session_id, const std::string& secret, int64_t route_epoch);

  // --- Migration (node/migration.h, node_core_migrate.cc) ---------------------
  // Claims a bound session with live state (waits for its step in flight; its
  // later steps, truncates wait until the exporter goes) and returns an
  // exporter of its KV. `secret`: the caller must know the session's secret;
  // nullptr: the node's own drain. kPermissionDenied for another secret,
  // Error(kCacheMiss) when no live state is held, kSessionBusy when another
  // export holds it.
  std::unique_ptr<SessionExporter> BeginExport(const std::string& session_id,
                                               const std::string* secret);
  // After the target verified and loaded the export (its exporter still
  // alive): the local state goes; later steps get a kMoved miss naming
  // `moved_to`.
  void MarkMoved(const std::string& session_id, const std::string& moved_to);
  // Drops a session's state; later steps get a kReleased miss with `detail`.
  void EndSession(const std::string& session_id, const std::string& detail);
  // EndSession for every session with live state whose last step came before
  // `since` (e.g. sessions whose clients gave up while this process was
  // stopped). Returns how many.
  int64_t EndSessionsIdleSince(std::chrono::steady_clock::time_point since,
                               const std::string& detail) EXCLUDES(mu_);
  // Verifies an import's header against this node (identity, range, recipe,
  // dtype, shapes, budget; refused while draining), then claims the session
  // (binding, admission slot) and reserves its KV rows as an uncommitted step
  // that the importer writes into; kSessionBusy while the session steps here.
  // The importer undoes all of it if destroyed before CommitImport.
  std::unique_ptr<SessionImporter> BeginImport(SessionExportHeader header);
  // Publishes a finished (verified) import's rows. Anything failing leaves
  // nothing behind once the importer goes. Returns the positions loaded.
  int64_t CommitImport(SessionImporter& importer);
  // From now on new sessions (prefills) get Error(kUnavailable, "draining").
  void StartDraining();
  // New sessions are taken again (sessions already moved or ended stay so);
  // whether the node was draining.
  bool StopDraining() { return draining_.exchange(false); }
  bool draining() const { return draining_.load(); }
  // Sessions bound here with state that is neither moved nor ended.
  std::vector<std::string> MovableSessions() EXCLUDES(mu_);
  // Moved sessions whose client has not been told yet.
  int64_t UntoldMoves() const EXCLUDES(mu_);
  // Waits until every moved session's client was told (or released it), up
  // to `seconds`; whether all were.
  bool WaitMovesTold(double seconds) EXCLUDES(mu_);

  Node& node() const { return *node_; }
  kv::HotKvStateManager& manager() const { return node_->manager(); }
  NodeCounters& counters() { return counters_; }
  const SessionAdmission& admission() const { return admission_; }
  const std::string& instance_id() const { return instance_id_; }
  int64_t bindings() const EXCLUDES(mu_);

 private:
  // Every field but the immutable session_id is guarded by NodeCore::mu_,
  // which `mu` names for the thread-safety analysis (NodeCore::Held tells it a
  // binding's mu is the held mu_).
  struct Binding {
    Binding(Mutex* core_mu, std::string id) : mu(*core_mu), session_id(std::move(id)) {}
    Mutex& mu;
    const std::string session_id;
    std::string secret_digest GUARDED_BY(mu);  // SHA-256 of the opener's secret
    int64_t latest_epoch GUARDED_BY(mu) = 0;
    bool linked GUARDED_BY(mu) = false;
    std::list<Binding*>::iterator lru_it GUARDED_BY(mu);
    // The step in flight, if any.
    bool in_flight GUARDED_BY(mu) = false;
    int64_t flight_epoch GUARDED_BY(mu) = 0;
    uint64_t flight_step GUARDED_BY(mu) = 0;
    // The last reply, for retries.
    std::unique_ptr<StepReply> result GUARDED_BY(mu);
    int64_t result_epoch GUARDED_BY(mu) = 0;
    uint64_t result_step GUARDED_BY(mu) = 0;
    uint32_t result_digest GUARDED_BY(mu) = 0;
    int64_t result_bytes GUARDED_BY(mu) = 0;
    // Migration (node_core_migrate.cc): an export or import holds the session
    // (its steps wait); once moved, steps are answered with a kMoved miss; a
    // session a drain ended is answered with `ended` as the miss detail.
    bool migrating GUARDED_BY(mu) = false;
    std::string moved_to GUARDED_BY(mu);
    std::string ended GUARDED_BY(mu);
    bool move_untold GUARDED_BY(mu) = false;  // moved, and no step has been told yet
    std::chrono::steady_clock::time_point touched GUARDED_BY(mu);  // last step or bind
  };
  using BindingPtr = std::shared_ptr<Binding>;
  // The step being run: its binding and its retry key.
  struct Flight {
    BindingPtr binding;
    int64_t epoch = 0;
    uint64_t step_id = 0;
    uint32_t digest = 0;  // RequestDigest of the request and reply format
  };

  // Tells the thread-safety analysis that `b`'s fields, guarded by b.mu (which
  // is mu_), may be used: mu_ is held.
  void Held(const Binding& b) const REQUIRES(mu_) ASSERT_CAPABILITY(b.mu);
  // Returns the positions the step adds.
  int64_t Validate(const StepRequest& r) const;
  // The miss for a moved or ended binding, if it is one.
  std::optional<StepReply> MovedOrEndedLocked(Binding& b, int64_t epoch) REQUIRES(mu_);
  // Waits (bounded) while an export or import holds the binding.
  void WaitNotMigratingLocked(Binding& b) REQUIRES(mu_);
  void EndClaim(const BindingPtr& b) EXCLUDES(mu_);
  // An import's hold on its session (ClaimForImport), ended by the importer.
  struct ImportClaim {
    BindingPtr binding;
    bool created = false;  // the binding is the import's own
    std::string session_id;
    int64_t route_epoch = 0;
    bool admitted = false;
    bool opened = false;  // the KV context at route_epoch exists
  };
  void ClaimForImport(SessionImporter& imp) EXCLUDES(mu_);
  void UndoImportClaim(const ImportClaim& c) EXCLUDES(mu_);
  void PublishImportClaim(const ImportClaim& c) EXCLUDES(mu_);
  SessionExportHeader SelfHeader() const;
  // Binds or finds the session and claims the step (filling `flight`), or
  // answers it at once: a miss for an unbound session, the cached result of a
  // retry.
  std::optional<StepReply> BeginFlight(const StepRequest& r, Flight* flight) EXCLUDES(mu_);
  // Waits while a try of the same step runs; the cached result of an earlier
  // try, if any (kInvalidArgument if the step id was used for another request).
  std::optional<StepReply> ReplayLocked(Binding& b, const Flight& f) REQUIRES(mu_);
  StepReply RunFlight(StepRequest& r, const Flight& f, const ReplyFormat& format);
  // Fills `f` for the request and begins its flight; an answer that needs no
  // computing (a replay, a miss, a move) is returned and counted.
  std::optional<StepReply> OpenFlight(const StepRequest& r, const ReplyFormat& format, Flight* f);
  // A computed step's bookkeeping: its admission slot touched, its result and
  // latency (since t0) counted.
  void NoteComputed(const StepRequest& r, const StepReply& reply,
                    std::chrono::steady_clock::time_point t0);
  // StepMany's first part: each step's checks and flight; the indices of the
  // steps left to compute go to `run` (reserved for every step).
  void BeginMany(std::span<StepRequest> requests, std::span<const ReplyFormat> formats,
                 std::span<Flight> flights, std::span<std::optional<StepReply>> replies,
                 std::span<std::exception_ptr> errors, std::vector<size_t>* run);
  void CountErrorOf(const std::exception_ptr& e);
  // Ends the flight; caches `reply` (when given) for retries.
  void EndFlight(const Flight& f, const ReplyFormat& format, const StepReply* reply) EXCLUDES(mu_);
  void CacheLocked(Binding& b, const Flight& f, const ReplyFormat& format, const StepReply& reply)
      REQUIRES(mu_);
  // Looks up the binding and checks the secret (kPermissionDenied).
  BindingPtr FindChecked(const std::string& session_id, const std::string& secret_digest)
      REQUIRES(mu_);
  BindingPtr CreateBinding(const std::string& session_id, std::string secret_digest) REQUIRES(mu_);
  void Unlink(Binding& b) REQUIRES(mu_);
  void Touch(Binding& b) REQUIRES(mu_);
  void DropCachedResult(Binding& b) REQUIRES(mu_);
  void EvictBindingsOverCapacity() REQUIRES(mu_);
  void TrimReplayCache(int64_t incoming) REQUIRES(mu_);
  void NotePeak();
  // KV bytes `n_tokens` positions occupy in whole blocks.
  int64_t BytesForTokens(int64_t n_tokens) const;

  Node* node_;
  NodeCoreOptions options_;
  SessionAdmission admission_;
  std::string instance_id_;
  NodeCounters counters_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> exports_started_{0};
  const int64_t corrupt_export_;  // test hook (node/migration.h)

  mutable Mutex mu_;
  CondVar step_done_{&mu_};  // a flight ended
  std::unordered_map<std::string, BindingPtr> bindings_ GUARDED_BY(mu_);
  // Every binding in bindings_ is on lru_ (front = most recent).
  std::list<Binding*> lru_ GUARDED_BY(mu_);
  int64_t cached_bytes_ GUARDED_BY(mu_) = 0;  // sum of cached result sizes
  int64_t untold_moves_ GUARDED_BY(mu_) = 0;
};

}  // namespace meshnet::node
