// NodeCore implementation. See node_core.h for the contract.
//
// Lifetime of a binding: created by the first prefill of a session id, linked
// into bindings_ and lru_. Unlinked by Release, or by capacity eviction (never
// while a step is in flight), which also releases its KV state. A step holds
// a shared_ptr to its binding, so an unlink during the step is safe: the step
// finishes on the orphan and its result is simply not cached.
#include "node/node_core.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <stdexcept>

#include "node/identity.h"
#include "shard/step_cancel.h"
#include "util/crc32c.h"
#include "util/secret.h"

namespace meshnet::node {

namespace {

constexpr auto kRetryWait = std::chrono::seconds(60);

using Clock = std::chrono::steady_clock;

int64_t MicrosSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

// A digest of everything in a step request that determines its reply (secret
// and ids aside): a retry must match it to be answered from the cache.
uint32_t RequestDigest(const StepRequest& r, const ReplyFormat& format) {
  uint32_t c = 0;
  auto mix = [&c](const void* p, size_t n) { c = Crc32cExtend(c, p, n); };
  const int64_t head[5] = {r.prefill ? 1 : 0, r.expected_seq_len.has_value() ? 1 : 0,
                           r.expected_seq_len.value_or(0), r.bundle ? 2 : 1,
                           (r.rewind ? 1 : 0) | (r.verify ? 2 : 0)};
  mix(head, sizeof head);
  if (r.bundle) {
    const shard::BoundaryBundle& b = *r.bundle;
    const int64_t shape[4] = {b.n_tokens, b.n_embd, b.next_layer, b.normalized ? 1 : 0};
    mix(shape, sizeof shape);
    mix(b.positions.data(), sizeof(int64_t) * b.positions.size());
    mix(b.residual.data(), sizeof(float) * b.residual.size());
  } else {
    mix(r.token_ids.data(), sizeof(int32_t) * r.token_ids.size());
  }
  const auto& s = r.sampling;
  const float f[2] = {s.temperature, s.top_p};
  const int64_t rest[4] = {s.top_k, static_cast<int64_t>(s.seed),
                           static_cast<int64_t>(format.bundle_dtype), format.want_logits ? 1 : 0};
  mix(f, sizeof f);
  mix(rest, sizeof rest);
  return c;
}

// Bytes a result takes as the caller sends it (what the replay cache counts).
int64_t ReplyBytes(const StepResult& r, const ReplyFormat& format) {
  constexpr int64_t kOverhead = 64;
  if (const auto* b = std::get_if<shard::BoundaryBundle>(&r)) {
    return kOverhead + static_cast<int64_t>(b->residual.size()) * KvDtypeSize(format.bundle_dtype) +
           static_cast<int64_t>(b->positions.size() * sizeof(int64_t));
  }
  if (const auto* t = std::get_if<shard::TailOutput>(&r)) {
    return kOverhead + static_cast<int64_t>(t->logits.size() * sizeof(float));
  }
  const auto& m = std::get<kv::CacheMiss>(r);
  return kOverhead + static_cast<int64_t>(m.session_id.size() + m.detail.size());
}

[[noreturn]] void Denied(const std::string& session_id) {
  throw Error(ErrorKind::kPermissionDenied,
              "session " + session_id.substr(0, 8) +
                  " is bound to another secret; only its opener may use it");
}

kv::CacheMiss UnboundMiss(const std::string& session_id, int64_t route_epoch) {
  return kv::CacheMiss{session_id, route_epoch, kv::CacheMissReason::kUnknownSession,
                       "no session bound on this node"};
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

void NodeCounters::CountResult(const StepResult& result) {
  if (std::holds_alternative<shard::BoundaryBundle>(result)) {
    steps_bundle.fetch_add(1);
  } else if (std::holds_alternative<shard::TailOutput>(result)) {
    steps_tail.fetch_add(1);
  } else {
    steps_miss.fetch_add(1);
  }
}

void NodeCore::Held(const Binding& b) const {
  assert(&b.mu == &mu_);
  (void)b;
}

namespace {
AdmissionOptions WithDefaults(AdmissionOptions a, const Node& node) {
  if (a.max_active == 0) a.max_active = node.manager().config().max_sessions;
  return a;
}
}  // namespace

NodeCore::NodeCore(Node* node, NodeCoreOptions options)
    : node_(node),
      options_(options),
      admission_(WithDefaults(options.admission, *node)),
      instance_id_(RandomId128()),
      corrupt_export_(CorruptExportIndexFromEnv()) {
  if (options_.max_bindings < 1) ThrowInvalidArgument("max_bindings must be >= 1");
  if (options_.replay_cache_bytes < 0) ThrowInvalidArgument("replay_cache_bytes must be >= 0");
}

NodeCore::~NodeCore() = default;

int64_t NodeCore::bindings() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(bindings_.size());
}

NodeInfo NodeCore::Info() {
  NodeInfo out;
  out.shard = node_->Info();
  const kv::HotKvStats s = manager().Stats();
  const auto& hp = node_->shard().hparams();
  out.instance_id = instance_id_;
  out.kv_bytes_reserved = s.bytes_reserved;
  NotePeak();
  out.kv_bytes_reserved_peak =
      std::max(s.bytes_reserved, counters_.kv_bytes_reserved_peak.load(std::memory_order_relaxed));
  out.n_embd = hp.n_embd;
  out.vocab_size = hp.vocab_size;
  out.steps_served =
      counters_.steps_bundle.load() + counters_.steps_tail.load() + counters_.steps_miss.load();
  return out;
}

int64_t NodeCore::BytesForTokens(int64_t n_tokens) const {
  const int64_t bt = manager().config().block_tokens;
  return (n_tokens + bt - 1) / bt * bt * node_->adapter().recipe().BytesPerToken();
}

int64_t NodeCore::Validate(const StepRequest& r) const {
  ValidateSessionKey(r.session_id, r.session_secret, r.route_epoch);
  const int64_t n_tokens = node_->Validate(r);
  const int64_t need = BytesForTokens(n_tokens);
  const int64_t budget = manager().config().budget_bytes;
  if (need > budget) {
    ThrowInvalidArgument("a step of " + std::to_string(n_tokens) + " tokens needs " +
                         std::to_string(need) + " bytes of KV, over this node's whole budget of " +
                         std::to_string(budget));
  }
  return n_tokens;
}

NodeCore::BindingPtr NodeCore::FindChecked(const std::string& session_id,
                                           const std::string& secret_digest) {
  auto it = bindings_.find(session_id);
  if (it == bindings_.end()) return nullptr;
  Held(*it->second);
  if (!DigestEquals(secret_digest, it->second->secret_digest)) Denied(session_id);
  return it->second;
}

NodeCore::BindingPtr NodeCore::CreateBinding(const std::string& session_id,
                                             std::string secret_digest) {
  EvictBindingsOverCapacity();
  auto b = std::make_shared<Binding>(&mu_, session_id);
  Held(*b);
  b->secret_digest = std::move(secret_digest);
  lru_.push_front(b.get());
  b->lru_it = lru_.begin();
  b->touched = std::chrono::steady_clock::now();
  b->linked = true;
  bindings_.emplace(session_id, b);
  return b;
}

void NodeCore::Unlink(Binding& b) {
  Held(b);
  DropCachedResult(b);
  if (b.move_untold) {
    --untold_moves_;
    step_done_.SignalAll();  // WaitMovesTold
  }
  b.move_untold = false;
  b.linked = false;
  lru_.erase(b.lru_it);
  const std::string id = b.session_id;
  bindings_.erase(id);  // may free b
}

void NodeCore::Touch(Binding& b) {
  Held(b);
  b.touched = std::chrono::steady_clock::now();
  if (b.linked) lru_.splice(lru_.begin(), lru_, b.lru_it);
}

void NodeCore::DropCachedResult(Binding& b) {
  Held(b);
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
    Held(*victim);
    if (victim->in_flight) continue;
    const std::string id = victim->session_id;
    const int64_t epoch = victim->latest_epoch;
    ++it;  // Unlink erases `victim` from lru_
    Unlink(*victim);
    node_->Release(id, epoch);
    admission_.Release(id);  // after its state is gone: the slot is really free
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

std::optional<StepReply> NodeCore::ReplayLocked(Binding& b, const Flight& f) {
  Held(b);
  const auto deadline = Clock::now() + kRetryWait;
  while (b.in_flight && b.flight_epoch == f.epoch && b.flight_step == f.step_id) {
    if (Clock::now() >= deadline) {
      throw Error(ErrorKind::kSessionBusy,
                  "step " + std::to_string(f.step_id) + " of this session is still running");
    }
    step_done_.WaitUntil(deadline);
  }
  if (!b.result || b.result_epoch != f.epoch || b.result_step != f.step_id) return std::nullopt;
  if (b.result_digest != f.digest) {
    ThrowInvalidArgument("step id " + std::to_string(f.step_id) +
                         " was already used with a different request at epoch " +
                         std::to_string(f.epoch));
  }
  StepReply replay = *b.result;
  replay.replayed = true;
  return replay;
}

std::optional<StepReply> NodeCore::BeginFlight(const StepRequest& r, Flight* f) {
  std::string secret_digest = SecretDigest(r.session_secret);
  MutexLock lock(&mu_);
  BindingPtr b = FindChecked(r.session_id, secret_digest);
  if (!b) {
    if (!r.prefill) return StepReply{UnboundMiss(r.session_id, r.route_epoch)};
    b = CreateBinding(r.session_id, std::move(secret_digest));
  }
  Touch(*b);
  Held(*b);
  WaitNotMigratingLocked(*b);
  if (std::optional<StepReply> gone = MovedOrEndedLocked(*b, r.route_epoch)) {
    if (!r.prefill) return gone;
    b->moved_to.clear();  // a fresh context here (not draining: Step checked)
    b->ended.clear();
  }
  if (f->step_id != 0) {
    if (std::optional<StepReply> replay = ReplayLocked(*b, *f)) return replay;
  }
  if (b->in_flight) {
    throw Error(ErrorKind::kSessionBusy,
                "another step of session " + r.session_id.substr(0, 8) + " is in flight");
  }
  b->in_flight = true;
  b->flight_epoch = f->epoch;
  b->flight_step = f->step_id;
  b->latest_epoch = std::max(b->latest_epoch, f->epoch);
  f->binding = std::move(b);
  return std::nullopt;
}

void NodeCore::CacheLocked(Binding& b, const Flight& f, const ReplyFormat& format,
                           const StepReply& reply) {
  Held(b);
  DropCachedResult(b);
  const int64_t bytes = ReplyBytes(reply.result, format);
  if (bytes > options_.replay_cache_bytes) return;
  TrimReplayCache(bytes);
  b.result = std::make_unique<StepReply>(reply);
  if (auto* t = std::get_if<shard::TailOutput>(&b.result->result); t && !format.want_logits) {
    t->logits = {};  // never sent for this request: not kept either
  }
  b.result_epoch = f.epoch;
  b.result_step = f.step_id;
  b.result_digest = f.digest;
  b.result_bytes = bytes;
  cached_bytes_ += bytes;
}

void NodeCore::EndFlight(const Flight& f, const ReplyFormat& format, const StepReply* reply) {
  MutexLock lock(&mu_);
  Binding& b = *f.binding;
  Held(b);
  b.in_flight = false;
  if (reply != nullptr && f.step_id != 0 && b.linked) CacheLocked(b, f, format, *reply);
  step_done_.SignalAll();
}

StepReply NodeCore::RunFlight(StepRequest& r, const Flight& f, const ReplyFormat& format) {
  StepReply reply;
  const auto c0 = Clock::now();
  try {
    reply.result = node_->Step(r);
  } catch (...) {
    EndFlight(f, format, nullptr);
    throw;
  }
  reply.compute_micros = MicrosSince(c0);
  EndFlight(f, format, &reply);
  return reply;
}

StepReply NodeCore::Step(StepRequest r, const ReplyFormat& format) {
  const auto t0 = Clock::now();
  try {
    const int64_t n_tokens = Validate(r);
    if (r.prefill && draining()) {
      throw Error(ErrorKind::kUnavailable,
                  "node draining: it takes no new sessions; re-plan the route elsewhere");
    }
    // A new session waits for a slot among the active ones (bounded), polling
    // whether its caller is still there.
    if (r.prefill) admission_.Admit(r.session_id, [] { return shard::StepCancelled(); });
    Flight f;
    if (std::optional<StepReply> answered = OpenFlight(r, format, &f)) return std::move(*answered);
    StepReply reply = RunFlight(r, f, format);
    if (r.prefill && !std::holds_alternative<kv::CacheMiss>(reply.result)) {
      counters_.prefill_tokens.fetch_add(n_tokens, std::memory_order_relaxed);
    }
    NotePeak();
    NoteComputed(r, reply, t0);
    return reply;
  } catch (const Error& e) {
    counters_.CountError(e.kind());
    throw;
  }
}

std::optional<StepReply> NodeCore::OpenFlight(const StepRequest& r, const ReplyFormat& format,
                                              Flight* f) {
  f->epoch = r.route_epoch;
  f->step_id = r.step_id;
  f->digest = RequestDigest(r, format);  // before the step takes the bundle over
  std::optional<StepReply> answered = BeginFlight(r, f);
  if (answered) {
    (answered->replayed ? counters_.steps_replayed : counters_.steps_miss)
        .fetch_add(1, std::memory_order_relaxed);
  }
  return answered;
}

void NodeCore::NoteComputed(const StepRequest& r, const StepReply& reply,
                            std::chrono::steady_clock::time_point t0) {
  admission_.Touch(r.session_id);
  counters_.CountResult(reply.result);
  counters_.ObserveLatency(std::chrono::duration<double>(Clock::now() - t0).count());
}

void NodeCore::BeginMany(std::span<StepRequest> requests, std::span<const ReplyFormat> formats,
                         std::span<Flight> flights, std::span<std::optional<StepReply>> replies,
                         std::span<std::exception_ptr> errors, std::vector<size_t>* run) {
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      StepRequest& r = requests[i];
      if (r.prefill) ThrowInvalidArgument("StepMany's batch path takes decode steps only");
      Validate(r);
      if (std::optional<StepReply> answered = OpenFlight(r, formats[i], &flights[i])) {
        replies[i] = std::move(*answered);
        continue;
      }
      run->push_back(i);  // reserved: cannot throw
    } catch (const Error& e) {
      counters_.CountError(e.kind());
      errors[i] = std::current_exception();
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
}

void NodeCore::StepMany(std::span<StepRequest> requests, std::span<const ReplyFormat> formats,
                        std::span<std::optional<StepReply>> replies,
                        std::span<std::exception_ptr> errors) {
  const auto t0 = Clock::now();
  const size_t n = requests.size();
  // Allocated before any flight begins: nothing below can fail to end one.
  std::vector<Flight> flights(n);
  std::vector<size_t> run;  // the steps that compute
  run.reserve(n);
  std::vector<StepRequest*> ptrs(n);
  std::vector<std::optional<StepResult>> results(n);
  std::vector<std::exception_ptr> failed(n);
  BeginMany(requests, formats, flights, replies, errors, &run);
  const size_t m = run.size();
  for (size_t k = 0; k < m; ++k) ptrs[k] = &requests[run[k]];
  const auto c0 = Clock::now();
  try {
    if (m > 0)
      node_->StepMany(std::span(ptrs).first(m), std::span(results).first(m),
                      std::span(failed).first(m));
  } catch (...) {  // e.g. out of memory: every begun flight still ends below
    for (size_t k = 0; k < m; ++k) {
      if (!results[k] && !failed[k]) failed[k] = std::current_exception();
    }
  }
  const int64_t compute_micros = MicrosSince(c0);
  for (size_t k = 0; k < m; ++k) {
    const size_t i = run[k];
    if (failed[k] || !results[k]) {
      EndFlight(flights[i], formats[i], nullptr);
      errors[i] = failed[k]
                      ? failed[k]
                      : std::make_exception_ptr(std::logic_error("step ended without a result"));
      CountErrorOf(errors[i]);
      continue;
    }
    StepReply reply;
    reply.result = std::move(*results[k]);
    reply.compute_micros = compute_micros;
    EndFlight(flights[i], formats[i], &reply);
    NoteComputed(requests[i], reply, t0);
    replies[i] = std::move(reply);
  }
  if (m > 0) NotePeak();
}

void NodeCore::CountErrorOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    counters_.CountError(error.kind());
  } catch (...) {
  }
}

TruncateReply NodeCore::Truncate(const std::string& session_id, const std::string& secret,
                                 int64_t route_epoch, int64_t length) {
  ValidateSessionKey(session_id, secret, route_epoch);
  const std::string digest = SecretDigest(secret);
  {
    MutexLock lock(&mu_);
    BindingPtr b = FindChecked(session_id, digest);
    if (!b) return UnboundMiss(session_id, route_epoch);
    WaitNotMigratingLocked(*b);
    if (std::optional<StepReply> gone = MovedOrEndedLocked(*b, route_epoch)) {
      return std::get<kv::CacheMiss>(gone->result);
    }
    DropCachedResult(*b);  // the state changes: an older result must not be replayed
  }
  try {
    return manager().Truncate(session_id, route_epoch, length);
  } catch (const kv::CacheMissError& e) {
    return e.miss();
  }
}

bool NodeCore::Park(const std::string& session_id, const std::string& secret, int64_t route_epoch) {
  ValidateSessionKey(session_id, secret, route_epoch);
  const std::string digest = SecretDigest(secret);
  {
    MutexLock lock(&mu_);
    if (!FindChecked(session_id, digest)) return false;
  }
  const bool parked = node_->manager().Park(session_id, route_epoch);
  admission_.Release(session_id);
  return parked;
}

bool NodeCore::Release(const std::string& session_id, const std::string& secret,
                       int64_t route_epoch) {
  ValidateSessionKey(session_id, secret, route_epoch);
  const std::string digest = SecretDigest(secret);
  {
    MutexLock lock(&mu_);
    BindingPtr b = FindChecked(session_id, digest);
    if (!b) return false;
    Unlink(*b);
  }
  const bool released = node_->Release(session_id, route_epoch);
  // Only now, with the state gone, may a waiting session take the slot (else
  // its Open would find the manager full and evict an active session).
  admission_.Release(session_id);
  return released;
}

}  // namespace meshnet::node
