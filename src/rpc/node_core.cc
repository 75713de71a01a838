// NodeCore implementation. See node_core.h for the contract.
//
// Lifetime of a binding: created by the first prefill of a session id, linked
// into bindings_ and lru_. Unlinked by Release, or by capacity eviction (never
// while a step is in flight), which also releases its KV state. A step holds
// a shared_ptr to its binding, so an unlink during the step is safe: the step
// finishes on the orphan and its result is simply not cached.
#include "rpc/node_core.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "mesh/generator.h"
#include "rpc/auth.h"
#include "rpc/crc32c.h"
#include "util/error.h"

namespace meshnet::rpc {

namespace {

constexpr auto kRetryWait = std::chrono::seconds(60);
constexpr auto kPinnedWait = std::chrono::seconds(20);

// A digest of everything in a step request that determines its result
// (secret and ids aside): a retry must match it to be answered from cache.
uint32_t RequestDigest(const pb::StepRequest& r) {
  uint32_t c = 0;
  auto mix = [&c](const void* p, size_t n) { c = Crc32cExtend(c, p, n); };
  const int64_t head[4] = {r.prefill() ? 1 : 0, r.has_expected_seq_len() ? 1 : 0,
                           r.expected_seq_len(), static_cast<int64_t>(r.input_case())};
  mix(head, sizeof head);
  if (r.has_tokens()) {
    mix(r.tokens().ids().data(), sizeof(int32_t) * r.tokens().ids_size());
  } else if (r.has_bundle()) {
    const auto& b = r.bundle();
    const int64_t shape[4] = {b.n_tokens(), b.n_embd(), b.next_layer(),
                              static_cast<int64_t>(b.crc32c())};
    mix(shape, sizeof shape);
    mix(b.positions().data(), sizeof(int64_t) * b.positions_size());
  }
  const auto& s = r.sampling();
  const float f[2] = {s.temperature(), s.top_p()};
  const int64_t rest[4] = {s.top_k(), static_cast<int64_t>(s.seed()), r.output_dtype(),
                           r.omit_logits() ? 1 : 0};
  mix(f, sizeof f);
  mix(rest, sizeof rest);
  return c;
}

void ValidateKey(const std::string& session_id, const std::string& secret, int64_t epoch) {
  if (!IsSessionId(session_id)) {
    ThrowInvalidArgument("session id must be 32 lowercase hex characters (128 random bits)");
  }
  if (secret.empty() || secret.size() > 256) {
    ThrowInvalidArgument("session secret must hold 1..256 bytes");
  }
  if (epoch < 0) ThrowInvalidArgument("route epoch must be >= 0");
}

[[noreturn]] void Denied(const std::string& session_id) {
  throw Error(ErrorKind::kPermissionDenied,
              "session " + session_id.substr(0, 8) +
                  " is bound to another secret; only its opener may use it");
}

}  // namespace

void NodeCounters::ObserveLatency(double seconds) {
  int i = 0;
  while (i < kNumLatencyBuckets && seconds > LatencyBucketBound(i)) ++i;
  latency_buckets[i].fetch_add(1, std::memory_order_relaxed);
  latency_count.fetch_add(1, std::memory_order_relaxed);
  latency_sum_nanos.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void NodeCounters::CountError(ErrorKind kind) {
  const int k = static_cast<int>(kind);
  if (k >= 0 && k < 16) errors[k].fetch_add(1, std::memory_order_relaxed);
}

struct NodeCore::Binding {
  std::string session_id;
  std::string secret_digest;  // SHA-256 of the opener's secret
  int64_t latest_epoch = 0;
  bool linked = false;
  std::list<Binding*>::iterator lru_it;
  // The step in flight, if any.
  bool in_flight = false;
  int64_t flight_epoch = 0;
  uint64_t flight_step = 0;
  // The last result, for retries.
  std::unique_ptr<pb::StepResponse> result;
  int64_t result_epoch = 0;
  uint64_t result_step = 0;
  uint32_t result_digest = 0;
  int64_t result_bytes = 0;
};

NodeCore::NodeCore(shard::KvBoundaryAdapter* adapter, std::string model_id, NodeCoreOptions options)
    : adapter_(adapter),
      endpoint_(adapter, std::move(model_id)),
      options_(options),
      instance_id_(mesh::RandomId128()) {
  if (options_.max_bindings < 1) ThrowInvalidArgument("max_bindings must be >= 1");
  if (options_.replay_cache_bytes < 0) ThrowInvalidArgument("replay_cache_bytes must be >= 0");
}

NodeCore::~NodeCore() = default;

int64_t NodeCore::bindings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(bindings_.size());
}

void NodeCore::Info(pb::InfoResponse* out) {
  EncodeInfo(endpoint_.Info(), out);
  const kv::HotKvStats s = manager().Stats();
  const auto& hp = adapter_->shard().hparams();
  out->set_instance_id(instance_id_);
  out->set_kv_bytes_reserved(s.bytes_reserved);
  NotePeak();
  out->set_kv_bytes_reserved_peak(
      std::max(s.bytes_reserved, counters_.kv_bytes_reserved_peak.load(std::memory_order_relaxed)));
  out->set_n_embd(hp.n_embd);
  out->set_vocab_size(hp.vocab_size);
  out->set_steps_served(counters_.steps_bundle.load() + counters_.steps_tail.load() +
                        counters_.steps_miss.load());
}

int64_t NodeCore::BudgetBytes() const { return manager().config().budget_bytes; }

int64_t NodeCore::BytesForTokens(int64_t n_tokens) const {
  const int64_t bt = manager().config().block_tokens;
  return (n_tokens + bt - 1) / bt * bt * adapter_->recipe().BytesPerToken();
}

mesh::StepRequest NodeCore::DecodeAndValidate(const pb::StepRequest& request) const {
  mesh::StepRequest r = DecodeStepRequest(request);
  const shard::ShardRole& role = adapter_->role();
  const shard::LlamaShard& shard = adapter_->shard();
  int64_t n_tokens = 0;
  if (role.is_head()) {
    if (r.bundle) {
      ThrowInvalidArgument("this node owns layer 0 and takes token ids, not a boundary bundle");
    }
    const int vocab = shard.hparams().vocab_size;
    for (int32_t id : r.token_ids) {
      if (id < 0 || id >= vocab) {
        ThrowInvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab) + ")");
      }
    }
    n_tokens = static_cast<int64_t>(r.token_ids.size());
  } else {
    if (!r.bundle) {
      ThrowInvalidArgument("this node starts at layer " + std::to_string(role.start_layer) +
                           " and takes a boundary bundle, not token ids");
    }
    const int64_t expected_start =
        r.prefill ? 0 : r.expected_seq_len.value_or(r.bundle->positions.front());
    shard::CheckBoundary(*r.bundle, shard.arch(), role.start_layer, shard.hparams().n_embd,
                         expected_start);
    n_tokens = r.bundle->n_tokens;
  }
  const int64_t need = BytesForTokens(n_tokens);
  if (need > BudgetBytes()) {
    ThrowInvalidArgument("a step of " + std::to_string(n_tokens) + " tokens needs " +
                         std::to_string(need) + " bytes of KV, over this node's whole budget of " +
                         std::to_string(manager().config().budget_bytes));
  }
  return r;
}

NodeCore::BindingPtr NodeCore::FindChecked(const std::string& session_id,
                                           const std::string& secret_digest) {
  auto it = bindings_.find(session_id);
  if (it == bindings_.end()) return nullptr;
  if (!DigestEquals(secret_digest, it->second->secret_digest)) Denied(session_id);
  return it->second;
}

NodeCore::BindingPtr NodeCore::CreateBinding(const std::string& session_id,
                                             std::string secret_digest) {
  EvictBindingsOverCapacity();
  auto b = std::make_shared<Binding>();
  b->session_id = session_id;
  b->secret_digest = std::move(secret_digest);
  lru_.push_front(b.get());
  b->lru_it = lru_.begin();
  b->linked = true;
  bindings_.emplace(session_id, b);
  return b;
}

void NodeCore::Touch(Binding& b) {
  if (b.linked) lru_.splice(lru_.begin(), lru_, b.lru_it);
}

void NodeCore::DropCachedResult(Binding& b) {
  if (!b.result) return;
  cached_bytes_ -= b.result_bytes;
  b.result.reset();
  b.result_bytes = 0;
}

void NodeCore::EvictBindingsOverCapacity() {
  // Oldest first; a binding with a step in flight stays.
  auto it = lru_.end();
  while (static_cast<int64_t>(bindings_.size()) >= options_.max_bindings && it != lru_.begin()) {
    --it;
    Binding* victim = *it;
    if (victim->in_flight) continue;
    const std::string id = victim->session_id;
    const int64_t epoch = victim->latest_epoch;
    DropCachedResult(*victim);
    victim->linked = false;
    it = lru_.erase(it);
    bindings_.erase(id);  // may free *victim
    manager().Release(id, epoch);
  }
}

void NodeCore::TrimReplayCache(int64_t incoming) {
  for (auto it = lru_.rbegin();
       it != lru_.rend() && cached_bytes_ + incoming > options_.replay_cache_bytes; ++it) {
    DropCachedResult(**it);
  }
}

void NodeCore::NotePeak() {
  const int64_t now = manager().Stats().bytes_reserved;
  int64_t peak = counters_.kv_bytes_reserved_peak.load(std::memory_order_relaxed);
  while (now > peak && !counters_.kv_bytes_reserved_peak.compare_exchange_weak(
                           peak, now, std::memory_order_relaxed)) {
  }
}

void NodeCore::Step(const pb::StepRequest& request, pb::StepResponse* response) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    mesh::StepRequest r = DecodeAndValidate(request);
    const uint32_t req_digest = RequestDigest(request);
    std::string secret_digest = SecretDigest(r.session_secret);
    const KvDtype out_dtype = request.output_dtype() == pb::DTYPE_UNSPECIFIED
                                  ? KvDtype::kF32
                                  : FromWireDtype(request.output_dtype());
    const bool want_logits = !request.omit_logits();
    const std::string session_id = r.session_id;
    const int64_t epoch = r.route_epoch;
    const uint64_t step_id = r.step_id;

    BindingPtr b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      b = FindChecked(session_id, secret_digest);
      if (!b) {
        if (!r.prefill) {
          lock.unlock();
          kv::CacheMiss miss{session_id, epoch, kv::CacheMissReason::kUnknownSession,
                             "no session bound on this node"};
          EncodeCacheMiss(miss, response->mutable_miss());
          counters_.steps_miss.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        b = CreateBinding(session_id, std::move(secret_digest));
      }
      Touch(*b);
      if (step_id != 0) {
        auto same_in_flight = [&] {
          return b->in_flight && b->flight_epoch == epoch && b->flight_step == step_id;
        };
        if (!step_done_.wait_for(lock, kRetryWait, [&] { return !same_in_flight(); })) {
          throw Error(ErrorKind::kSessionBusy,
                      "step " + std::to_string(step_id) + " of this session is still running");
        }
        if (b->result && b->result_epoch == epoch && b->result_step == step_id) {
          if (b->result_digest != req_digest) {
            ThrowInvalidArgument("step id " + std::to_string(step_id) +
                                 " was already used with a different request at epoch " +
                                 std::to_string(epoch));
          }
          response->CopyFrom(*b->result);
          response->set_replayed(true);
          counters_.steps_replayed.fetch_add(1, std::memory_order_relaxed);
          return;
        }
      }
      if (b->in_flight) {
        throw Error(ErrorKind::kSessionBusy,
                    "another step of session " + session_id.substr(0, 8) + " is in flight");
      }
      b->in_flight = true;
      b->flight_epoch = epoch;
      b->flight_step = step_id;
      b->latest_epoch = std::max(b->latest_epoch, epoch);
    }

    // Ends the flight whatever happens; caches a successful result.
    auto finish = [&](const pb::StepResponse* result) {
      std::lock_guard<std::mutex> lock(mu_);
      b->in_flight = false;
      if (result != nullptr && step_id != 0 && b->linked) {
        DropCachedResult(*b);
        const int64_t bytes = static_cast<int64_t>(result->ByteSizeLong());
        if (bytes <= options_.replay_cache_bytes) {
          TrimReplayCache(bytes);
          b->result = std::make_unique<pb::StepResponse>(*result);
          b->result_epoch = epoch;
          b->result_step = step_id;
          b->result_digest = req_digest;
          b->result_bytes = bytes;
          cached_bytes_ += bytes;
        }
      }
      step_done_.notify_all();
    };

    // A session that fits the budget on its own but finds the room pinned by
    // other sessions' in-flight steps waits for steps to finish (bounded),
    // instead of failing: that shortage is transient. Retrying is safe: a
    // failed reservation changes nothing (a prefill only re-opens its context).
    const bool fits_alone = r.prefill || r.expected_seq_len.has_value();
    const int64_t total_tokens =
        (r.prefill ? 0 : r.expected_seq_len.value_or(0)) +
        (r.bundle ? r.bundle->n_tokens : static_cast<int64_t>(r.token_ids.size()));
    const bool can_wait = fits_alone && BytesForTokens(total_tokens) <= BudgetBytes();
    const auto c0 = std::chrono::steady_clock::now();
    const auto wait_until = c0 + kPinnedWait;
    mesh::StepResult result;
    try {
      while (true) {
        try {
          result = endpoint_.Step(r);
          break;
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kBudgetExceeded || !can_wait ||
              std::chrono::steady_clock::now() >= wait_until) {
            throw;
          }
          counters_.budget_waits.fetch_add(1, std::memory_order_relaxed);
          std::unique_lock<std::mutex> lock(mu_);
          step_done_.wait_for(lock, std::chrono::milliseconds(20));
        }
      }
      EncodeStepResult(result, epoch, out_dtype, want_logits, response);
    } catch (...) {
      finish(nullptr);
      throw;
    }
    const auto c1 = std::chrono::steady_clock::now();
    response->set_compute_micros(
        std::chrono::duration_cast<std::chrono::microseconds>(c1 - c0).count());
    finish(response);
    NotePeak();
    switch (response->result_case()) {
      case pb::StepResponse::kBundle:
        counters_.steps_bundle.fetch_add(1);
        break;
      case pb::StepResponse::kTail:
        counters_.steps_tail.fetch_add(1);
        break;
      default:
        counters_.steps_miss.fetch_add(1);
        break;
    }
    counters_.ObserveLatency(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } catch (const Error& e) {
    counters_.CountError(e.kind());
    throw;
  }
}

void NodeCore::Truncate(const pb::TruncateRequest& request, pb::TruncateResponse* response) {
  ValidateKey(request.session_id(), request.session_secret(), request.route_epoch());
  const std::string digest = SecretDigest(request.session_secret());
  {
    std::lock_guard<std::mutex> lock(mu_);
    BindingPtr b = FindChecked(request.session_id(), digest);
    if (b) {
      DropCachedResult(*b);  // the state changes: an older result must not be replayed
    } else {
      kv::CacheMiss miss{request.session_id(), request.route_epoch(),
                         kv::CacheMissReason::kUnknownSession, "no session bound on this node"};
      EncodeCacheMiss(miss, response->mutable_miss());
      return;
    }
  }
  try {
    response->set_seq_len(
        manager().Truncate(request.session_id(), request.route_epoch(), request.length()));
  } catch (const kv::CacheMissError& e) {
    EncodeCacheMiss(e.miss(), response->mutable_miss());
  }
}

void NodeCore::Release(const pb::ReleaseRequest& request, pb::ReleaseResponse* response) {
  ValidateKey(request.session_id(), request.session_secret(), request.route_epoch());
  const std::string digest = SecretDigest(request.session_secret());
  {
    std::lock_guard<std::mutex> lock(mu_);
    BindingPtr b = FindChecked(request.session_id(), digest);
    if (!b) {
      response->set_released(false);
      return;
    }
    DropCachedResult(*b);
    b->linked = false;
    lru_.erase(b->lru_it);
    bindings_.erase(request.session_id());
  }
  response->set_released(manager().Release(request.session_id(), request.route_epoch()));
}

}  // namespace meshnet::rpc
