#include "rpc/metrics.h"

#include <atomic>
#include <string>

#include "kv/cache_miss.h"
#include "node/node_core.h"
#include "rpc/server_trim.h"
#include "util/error.h"

namespace meshnet::rpc {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

ClientMetric Gauge(double v, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  return m;
}

ClientMetric Counter(double v, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = v;
  return m;
}

void AddGauge(std::vector<MetricFamily>& out, const char* name, const char* help, double v) {
  MetricFamily f = Family(name, help, MetricType::Gauge);
  f.metric.push_back(Gauge(v));
  out.push_back(std::move(f));
}

constexpr ErrorKind kKinds[] = {
    ErrorKind::kInvalidArgument,  ErrorKind::kStaleEpoch,        ErrorKind::kIncompatibleRecipe,
    ErrorKind::kBudgetExceeded,   ErrorKind::kCacheMiss,         ErrorKind::kSessionBusy,
    ErrorKind::kBoundaryContract, ErrorKind::kMalformedFile,     ErrorKind::kUnavailable,
    ErrorKind::kPermissionDenied, ErrorKind::kResourceExhausted,
};

}  // namespace

namespace {

void AddKvGauges(std::vector<MetricFamily>& out, const kv::HotKvStats& s,
                 const node::NodeCounters& c, int64_t bindings) {
  AddGauge(out, "meshnet_kv_live_sessions", "Sessions with live KV state", s.live_sessions);
  AddGauge(out, "meshnet_kv_pinned_sessions", "Sessions pinned by an in-flight step",
           s.pinned_sessions);
  AddGauge(out, "meshnet_kv_bytes_in_use", "KV bytes of committed positions", s.bytes_in_use);
  AddGauge(out, "meshnet_kv_bytes_reserved", "KV bytes held in blocks", s.bytes_reserved);
  AddGauge(out, "meshnet_kv_bytes_budget", "KV byte budget", s.bytes_budget);
  AddGauge(out, "meshnet_kv_bytes_reserved_peak", "High-water mark of reserved KV bytes",
           static_cast<double>(c.kv_bytes_reserved_peak.load()));
  AddGauge(out, "meshnet_kv_blocks_used", "KV blocks in use", s.blocks_used);
  AddGauge(out, "meshnet_kv_blocks_free", "KV blocks on the free list", s.blocks_free);
  AddGauge(out, "meshnet_kv_blocks_capacity", "KV blocks the budget allows", s.blocks_capacity);
  AddGauge(out, "meshnet_session_bindings", "Session-secret bindings remembered",
           static_cast<double>(bindings));
}

void AddKvCounters(std::vector<MetricFamily>& out, const kv::HotKvStats& s) {
  MetricFamily hits =
      Family("meshnet_kv_hits_total", "Lookups that found live state", MetricType::Counter);
  hits.metric.push_back(Counter(static_cast<double>(s.hits)));
  out.push_back(std::move(hits));

  MetricFamily misses =
      Family("meshnet_kv_misses_total", "Cache misses answered, by reason", MetricType::Counter);
  MetricFamily evictions =
      Family("meshnet_kv_evictions_total", "Sessions dropped, by reason", MetricType::Counter);
  for (int i = 0; i < kv::kNumCacheMissReasons; ++i) {
    const std::string reason(kv::CacheMissReasonName(static_cast<kv::CacheMissReason>(i)));
    misses.metric.push_back(Counter(static_cast<double>(s.misses[i]), {{"reason", reason}}));
    evictions.metric.push_back(Counter(static_cast<double>(s.evictions[i]), {{"reason", reason}}));
  }
  out.push_back(std::move(misses));
  out.push_back(std::move(evictions));
}

void AddStepCounters(std::vector<MetricFamily>& out, const node::NodeCounters& c,
                     int64_t pinned_waits, int64_t room_waits) {
  MetricFamily steps =
      Family("meshnet_steps_total", "Steps answered, by result", MetricType::Counter);
  steps.metric.push_back(
      Counter(static_cast<double>(c.steps_bundle.load()), {{"result", "bundle"}}));
  steps.metric.push_back(Counter(static_cast<double>(c.steps_tail.load()), {{"result", "tail"}}));
  steps.metric.push_back(Counter(static_cast<double>(c.steps_miss.load()), {{"result", "miss"}}));
  steps.metric.push_back(
      Counter(static_cast<double>(c.steps_replayed.load()), {{"result", "replayed"}}));
  out.push_back(std::move(steps));

  MetricFamily waits = Family("meshnet_step_budget_waits_total",
                              "Waits of KV reservations for room pinned by other in-flight steps",
                              MetricType::Counter);
  waits.metric.push_back(Counter(static_cast<double>(pinned_waits)));
  out.push_back(std::move(waits));
  MetricFamily room = Family("meshnet_step_room_waits_total",
                             "Waits of new contexts for KV room held by earlier active sessions",
                             MetricType::Counter);
  room.metric.push_back(Counter(static_cast<double>(room_waits)));
  out.push_back(std::move(room));

  MetricFamily errors =
      Family("meshnet_step_errors_total", "Failed calls, by error kind", MetricType::Counter);
  for (ErrorKind k : kKinds) {
    errors.metric.push_back(Counter(static_cast<double>(c.errors[static_cast<int>(k)].load()),
                                    {{"kind", std::string(ErrorKindName(k))}}));
  }
  out.push_back(std::move(errors));
}

void AddCounter(std::vector<MetricFamily>& out, const char* name, const char* help,
                const std::atomic<int64_t>& v) {
  MetricFamily f = Family(name, help, MetricType::Counter);
  f.metric.push_back(Counter(static_cast<double>(v.load())));
  out.push_back(std::move(f));
}

// Prefill positions and session migration (node/migration.h, rpc/drain.h).
void AddMigrationCounters(std::vector<MetricFamily>& out, const node::NodeCounters& c,
                          bool draining) {
  AddCounter(out, "meshnet_prefill_tokens_total", "Positions run by prefill steps",
             c.prefill_tokens);
  AddCounter(out, "meshnet_grouped_calls_total",
             "StepMany calls: steps of several sessions in one call", c.grouped_calls);
  AddCounter(out, "meshnet_grouped_steps_total", "Steps that came in StepMany calls",
             c.grouped_steps);
  AddCounter(out, "meshnet_chain_forwarded_steps_total",
             "Chain steps this node sent on to the next hop itself", c.chain_forwarded);
  AddCounter(out, "meshnet_chain_direct_returns_total",
             "Tail answers written on a client's Returns stream (direct return)", c.chain_returns);
  AddCounter(out, "meshnet_sessions_exported_total", "Sessions exported to their owner",
             c.sessions_exported);
  AddCounter(out, "meshnet_sessions_imported_total",
             "Sessions imported (every chunk and the digest verified)", c.sessions_imported);
  AddCounter(out, "meshnet_imports_rejected_total", "Imports refused; nothing loaded",
             c.imports_rejected);
  AddCounter(out, "meshnet_import_chunks_verified_total",
             "KV chunks of loaded imports whose CRC32C matched", c.import_chunks_verified);
  AddCounter(out, "meshnet_import_bytes_total", "KV bytes loaded by imports", c.import_bytes);
  AddCounter(out, "meshnet_kv_transfers_total",
             "Imports whose KV came over the KV transfer port (not the gRPC stream)",
             c.kv_transfers);
  AddCounter(out, "meshnet_sessions_moved_total", "Sessions handed over to another node",
             c.sessions_moved);
  AddCounter(out, "meshnet_sessions_ended_total", "Sessions a drain ended with a miss",
             c.sessions_ended);
  AddCounter(out, "meshnet_moved_answers_total", "Steps answered 'moved to'", c.moved_answers);
  AddGauge(out, "meshnet_draining", "1 while the node drains (takes no new sessions)",
           draining ? 1 : 0);
}

void AddLatency(std::vector<MetricFamily>& out, const node::NodeCounters& c) {
  MetricFamily lat =
      Family("meshnet_step_latency_seconds", "Step latency on the node", MetricType::Histogram);
  ClientMetric h;
  uint64_t cumulative = 0;
  for (int i = 0; i <= node::NodeCounters::kNumLatencyBuckets; ++i) {
    cumulative += static_cast<uint64_t>(c.latency_buckets[i].load());
    ClientMetric::Bucket b;
    b.cumulative_count = cumulative;
    b.upper_bound = i < node::NodeCounters::kNumLatencyBuckets
                        ? node::NodeCounters::LatencyBucketBound(i)
                        : std::numeric_limits<double>::infinity();
    h.histogram.bucket.push_back(b);
  }
  h.histogram.sample_count = cumulative;
  h.histogram.sample_sum = static_cast<double>(c.latency_sum_nanos.load()) * 1e-9;
  lat.metric.push_back(std::move(h));
  out.push_back(std::move(lat));
}

void AddHeapTrimCounters(std::vector<MetricFamily>& out) {
  const HeapTrimStats t = GetHeapTrimStats();
  MetricFamily large =
      Family("meshnet_large_calls_total",
             "Calls that received a message of 4 MiB or more, once ended", MetricType::Counter);
  large.metric.push_back(Counter(static_cast<double>(t.large_calls)));
  out.push_back(std::move(large));
  MetricFamily trims =
      Family("meshnet_heap_trims_total", "Free heap pages returned to the OS after large calls",
             MetricType::Counter);
  trims.metric.push_back(Counter(static_cast<double>(t.trims)));
  out.push_back(std::move(trims));
}

// The node's continuous batching (node/batcher.h): how full its forward passes
// are and how much of the time it computes.
void AddBatchCounters(std::vector<MetricFamily>& out, const node::BatchStats& b) {
  AddCounter(out, "meshnet_batches_total", "Batched forward passes run", b.batches);
  AddCounter(out, "meshnet_batch_rows_total", "Token rows computed in batched forward passes",
             b.rows);
  AddCounter(out, "meshnet_batch_steps_total",
             "Sessions' steps in batched forward passes (summed over the batches)", b.steps);
  AddGauge(out, "meshnet_batch_max_sessions", "Most sessions seen in one batch",
           static_cast<double>(b.max_sessions.load()));
  MetricFamily busy = Family("meshnet_batch_busy_seconds_total",
                             "Time spent in batched forward passes", MetricType::Counter);
  busy.metric.push_back(Counter(static_cast<double>(b.busy_ns.load()) * 1e-9));
  out.push_back(std::move(busy));
}

}  // namespace

std::vector<MetricFamily> NodeMetrics::Collect() const {
  std::vector<MetricFamily> out;
  const kv::HotKvStats s = core_->manager().Stats();
  node::NodeCounters& c = core_->counters();
  AddKvGauges(out, s, c, core_->bindings());
  AddKvCounters(out, s);
  AddStepCounters(out, c, s.pinned_waits, s.room_waits);
  AddLatency(out, c);
  AddMigrationCounters(out, c, core_->draining());
  AddHeapTrimCounters(out);
  AddBatchCounters(out, core_->node().batcher().stats());
  return out;
}

}  // namespace meshnet::rpc
