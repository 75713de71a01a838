// NodeCore: everything a node does for one request, independent of the
// transport (the gRPC service in node_service.cc is a thin shell over it).
// Internal to rpc/.
//
//  * validation before anything runs: the request is decoded and checked
//    against this shard (role, boundary contract, vocabulary, a step whose
//    own token count exceeds the KV budget) so a malformed message changes
//    nothing (Error kInvalidArgument / kBoundaryContract);
//  * session binding: the first prefill of a session id binds it to
//    SHA-256(secret); every later step, truncate or release must present the
//    same secret (Error kPermissionDenied). Bindings are bounded
//    (max_bindings, LRU among those without a step in flight); dropping a
//    binding releases the session's state, so an unbound session never has
//    live state and a step for it is answered with a CacheMiss;
//  * idempotent steps: each binding keeps the last result under its
//    (epoch, step id) with a digest of the request. A retry with the same key
//    is answered from it (`replayed`), never run twice; a retry arriving while
//    the first is still running waits for it. Cached results are bounded in
//    total bytes (replay_cache_bytes; LRU drop — a decode retry that misses the
//    cache is then refused by expected_seq_len as a CacheMiss, never appended
//    twice). step_id 0 opts out;
//  * a step whose session fits the budget alone but finds the room pinned by
//    other in-flight steps (kBudgetExceeded from the manager) waits for steps
//    to finish and retries, up to 20 s, instead of failing.
//
// Invariants (mu_): every binding is in bindings_ and on lru_ (front = most
// recent); cached_bytes_ == sum of cached result sizes. No lock is held while
// the shard computes.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "mesh/in_process.h"
#include "rpc/codec.h"
#include "shard/kv_boundary_adapter.h"

namespace meshnet::rpc {

struct NodeCoreOptions {
  int64_t max_bindings = 4096;
  int64_t replay_cache_bytes = 64LL << 20;
};

// Monotonic counters for metrics (relaxed atomics; read at scrape time).
struct NodeCounters {
  static constexpr int kNumLatencyBuckets = 16;  // upper bounds 50us * 2^i, then +Inf
  static double LatencyBucketBound(int i) { return 50e-6 * static_cast<double>(1 << i); }

  std::atomic<int64_t> steps_bundle{0};
  std::atomic<int64_t> steps_tail{0};
  std::atomic<int64_t> steps_miss{0};
  std::atomic<int64_t> steps_replayed{0};
  std::atomic<int64_t> budget_waits{0};  // retries after room was pinned by other steps
  std::atomic<int64_t> errors[16] = {};  // by ErrorKind
  std::atomic<int64_t> latency_buckets[kNumLatencyBuckets + 1] = {};
  std::atomic<int64_t> latency_count{0};
  std::atomic<int64_t> latency_sum_nanos{0};
  std::atomic<int64_t> kv_bytes_reserved_peak{0};

  void ObserveLatency(double seconds);
  void CountError(ErrorKind kind);
};

class NodeCore {
 public:
  // `adapter` must outlive the core.
  NodeCore(shard::KvBoundaryAdapter* adapter, std::string model_id, NodeCoreOptions options = {});
  ~NodeCore();
  NodeCore(const NodeCore&) = delete;
  NodeCore& operator=(const NodeCore&) = delete;

  void Info(pb::InfoResponse* out);
  // Throws meshnet::Error (the service maps it to a status).
  void Step(const pb::StepRequest& request, pb::StepResponse* response);
  // A CacheMiss is a value: it goes into response->miss (status OK).
  void Truncate(const pb::TruncateRequest& request, pb::TruncateResponse* response);
  void Release(const pb::ReleaseRequest& request, pb::ReleaseResponse* response);

  kv::HotKvStateManager& manager() const { return adapter_->manager(); }
  const shard::KvBoundaryAdapter& adapter() const { return *adapter_; }
  NodeCounters& counters() { return counters_; }
  const std::string& instance_id() const { return instance_id_; }
  int64_t bindings() const;

 private:
  struct Binding;
  using BindingPtr = std::shared_ptr<Binding>;

  mesh::StepRequest DecodeAndValidate(const pb::StepRequest& request) const;
  // Looks up the binding and checks the secret (kPermissionDenied). Requires mu_.
  BindingPtr FindChecked(const std::string& session_id, const std::string& secret_digest);
  BindingPtr CreateBinding(const std::string& session_id, std::string secret_digest);
  void Touch(Binding& b);
  void DropCachedResult(Binding& b);
  void EvictBindingsOverCapacity();
  void TrimReplayCache(int64_t incoming);
  void NotePeak();
  int64_t BudgetBytes() const;
  // KV bytes `n_tokens` positions occupy in whole blocks.
  int64_t BytesForTokens(int64_t n_tokens) const;

  shard::KvBoundaryAdapter* adapter_;
  mesh::InProcessEndpoint endpoint_;
  NodeCoreOptions options_;
  std::string instance_id_;
  NodeCounters counters_;

  mutable std::mutex mu_;
  std::condition_variable step_done_;
  std::unordered_map<std::string, BindingPtr> bindings_;  // GUARDED_BY(mu_)
  std::list<Binding*> lru_;                               // GUARDED_BY(mu_)
  int64_t cached_bytes_ = 0;                              // GUARDED_BY(mu_)
};

}  // namespace meshnet::rpc
