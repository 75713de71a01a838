#include "rpc/registry_route.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <future>

#include "mesh/cohort_carrier.h"
#include "mesh/route_planner.h"
#include "rpc/client_log.h"
#include "rpc/prove.h"
#include "rpc/remote.h"
#include "util/error.h"
#include "util/mutex.h"

namespace meshnet::rpc {

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

double SecondsSince(SteadyTime t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct Rtt {
  double ms = 0;
  SteadyTime at;
  bool ok = false;
  std::string why;  // when !ok
};

// Has the node prove it holds its record's key at its address (and, with a
// token, that it knows the token: rpc/prove.h), then times one Info call and
// checks the node serves what its record says.
Rtt Measure(RemoteEndpoint& ep, const registry::NodeRecord& r, const ClientOptions& client) {
  Rtt out;
  try {
    ProveNode(r.address, client, r.public_key);
    ep.InfoFull();  // (re)connects: not part of the round trip
    const auto t0 = std::chrono::steady_clock::now();
    const NodeInfo info = ep.InfoFull();
    out.ms = SecondsSince(t0) * 1000;
    const auto& s = info.shard;
    out.ok = s.model_id == r.model_id && s.start_layer == r.start_layer &&
             s.end_layer == r.end_layer && s.total_layers == r.total_layers &&
             s.recipe_fingerprint == r.recipe_fingerprint;
    if (!out.ok) out.why = r.address + " does not serve what its registry record says";
  } catch (const std::exception& e) {
    out.why = r.address + " unreachable (" + e.what() + ")";
  }
  out.at = std::chrono::steady_clock::now();
  return out;
}

}  // namespace

struct RegistryRouteProvider::Impl {
  std::shared_ptr<registry::Registry> registry;
  std::string model_id;
  ClientOptions client;
  std::shared_ptr<util::RankGate> gate;  // ClientOptions::pipeline_depth, shared by the endpoints
  std::unique_ptr<mesh::CohortCarrier> carrier;  // ClientOptions::carry_cohorts, or null
  RegistryRouteOptions options;

  struct Dead {
    SteadyTime since;
    std::string instance;
  };
  mutable Mutex mu;
  registry::Snapshot cache GUARDED_BY(mu);
  bool have_cache GUARDED_BY(mu) = false;
  bool used_cache GUARDED_BY(mu) = false;
  std::map<std::string, std::shared_ptr<RemoteEndpoint>> endpoints GUARDED_BY(mu);
  std::map<std::string, Rtt> rtt GUARDED_BY(mu);
  std::map<std::string, Dead> dead GUARDED_BY(mu);
  std::map<std::string, int64_t> picks GUARDED_BY(mu);
  std::map<std::string, double> costs GUARDED_BY(mu);

  std::vector<registry::NodeRecord> Nodes();
  std::vector<registry::NodeRecord> Usable(std::vector<registry::NodeRecord> nodes,
                                           std::string* notes);
  std::shared_ptr<RemoteEndpoint> EndpointLocked(const std::string& address) REQUIRES(mu);
};

// The model's records: fresh from the registry, else the cached view.
std::vector<registry::NodeRecord> RegistryRouteProvider::Impl::Nodes() {
  try {
    registry::Snapshot s = registry->List(model_id);
    MutexLock lock(&mu);
    if (used_cache) ClientLog().info("event=registry_back registry={}", registry->name());
    cache = s;
    have_cache = true;
    used_cache = false;
    return s.nodes;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUnavailable) throw;
    MutexLock lock(&mu);
    if (!have_cache) {
      throw Error(ErrorKind::kUnavailable,
                  std::string("registry unreachable and no cached view: ") + e.what());
    }
    if (!used_cache) {
      ClientLog().warn("event=registry_cached registry={} nodes={} reason=\"{}\"", registry->name(),
                       cache.nodes.size(), e.what());
    }
    used_cache = true;
    return cache.nodes;
  }
}

std::shared_ptr<RemoteEndpoint> RegistryRouteProvider::Impl::EndpointLocked(
    const std::string& address) {
  auto& ep = endpoints[address];
  if (!ep) ep = std::make_shared<RemoteEndpoint>(address, client, gate);
  return ep;
}

// Drops draining and dead nodes, (re)measures round trips, drops nodes whose
// Info fails or disagrees with their record.
std::vector<registry::NodeRecord> RegistryRouteProvider::Impl::Usable(
    std::vector<registry::NodeRecord> nodes, std::string* notes) {
  std::vector<registry::NodeRecord> live;
  std::vector<std::pair<size_t, std::shared_ptr<RemoteEndpoint>>> stale;
  {
    MutexLock lock(&mu);
    for (auto& r : nodes) {
      if (r.draining) continue;
      auto d = dead.find(r.address);
      if (d != dead.end()) {
        if (d->second.instance == r.instance_id &&
            SecondsSince(d->second.since) < client.dead_cooldown_s) {
          *notes += "; " + r.address + " marked dead";
          continue;
        }
        dead.erase(d);
      }
      auto t = rtt.find(r.address);
      if (t == rtt.end() || SecondsSince(t->second.at) >= options.rtt_refresh_s || !t->second.ok) {
        stale.emplace_back(live.size(), EndpointLocked(r.address));
      }
      live.push_back(std::move(r));
    }
  }
  std::vector<std::future<Rtt>> measured;  // in parallel, no lock held
  for (auto& [i, ep] : stale) {
    measured.push_back(std::async(
        std::launch::async, [ep = ep, r = live[i], c = client] { return Measure(*ep, r, c); }));
  }
  MutexLock lock(&mu);
  for (size_t k = 0; k < stale.size(); ++k) {
    Rtt fresh = measured[k].get();
    Rtt& slot = rtt[live[stale[k].first].address];
    if (fresh.ok && slot.ok) fresh.ms = 0.5 * (slot.ms + fresh.ms);  // smooth
    slot = fresh;
  }
  std::vector<registry::NodeRecord> out;
  for (auto& r : live) {
    const Rtt& t = rtt[r.address];
    if (!t.ok) {
      *notes += "; " + t.why;
      continue;
    }
    out.push_back(std::move(r));
  }
  return out;
}

RegistryRouteProvider::RegistryRouteProvider(std::shared_ptr<registry::Registry> registry,
                                             std::string model_id, const ClientOptions& client,
                                             RegistryRouteOptions options)
    : impl_(std::make_unique<Impl>()) {
  client.Validate();
  if (model_id.empty()) ThrowInvalidArgument("a registry route needs the model's identity");
  impl_->registry = std::move(registry);
  impl_->model_id = std::move(model_id);
  impl_->client = client;
  impl_->gate = MakePipelineGate(client);
  impl_->carrier = MakeCohortCarrier(client);
  impl_->options = options;
}

RegistryRouteProvider::~RegistryRouteProvider() = default;

mesh::CohortCarrier* RegistryRouteProvider::carrier() { return impl_->carrier.get(); }

mesh::Route RegistryRouteProvider::Plan() {
  Impl& m = *impl_;
  std::string notes;
  const std::vector<registry::NodeRecord> nodes = m.Usable(m.Nodes(), &notes);
  if (nodes.empty()) {
    throw Error(ErrorKind::kUnavailable, "no live node in registry " + m.registry->name() +
                                             " serves model " + m.model_id.substr(0, 16) + notes);
  }
  MutexLock lock(&m.mu);
  // Round trips count only beyond a tolerance over the fastest replica of the
  // same range (loopback and LAN jitter must not decide, a far node does).
  std::map<std::pair<int, int>, double> best;
  for (const auto& r : nodes) {
    const double ms = m.rtt[r.address].ms;
    auto [it, fresh] = best.try_emplace({r.start_layer, r.end_layer}, ms);
    if (!fresh) it->second = std::min(it->second, ms);
  }
  std::vector<double> costs;
  for (const auto& r : nodes) {
    const auto picked_before = m.picks.find(r.address);
    const int64_t sent = picked_before == m.picks.end() ? 0 : picked_before->second;
    const double fastest = best[{r.start_layer, r.end_layer}];
    const double excess = std::max(0.0, m.rtt[r.address].ms - std::max(2 * fastest, fastest + 5));
    costs.push_back(registry::NodeCost(r, excess, sent, m.options.weights));
  }
  std::vector<size_t> picked;
  try {
    picked = mesh::PlanRoute(registry::ToCandidates(nodes, costs), nodes.front().total_layers);
  } catch (const Error& e) {
    throw Error(e.kind(), e.what() + notes);
  }
  mesh::Route route;
  for (size_t i = 0; i < nodes.size(); ++i) {
    m.costs[nodes[i].address] = costs[i];
    ClientLog().debug(
        "event=route_cost node={} layers={}-{} rtt_ms={:.3f} load={} kv_free={} cost={:.3f}",
        nodes[i].address, nodes[i].start_layer, nodes[i].end_layer, m.rtt[nodes[i].address].ms,
        nodes[i].in_flight_steps + nodes[i].live_sessions, nodes[i].kv_bytes_free, costs[i]);
  }
  for (size_t k : picked) {
    ++m.picks[nodes[k].address];
    route.hops.push_back(m.EndpointLocked(nodes[k].address));
  }
  ClientLog().info("event=route_planned route=\"{}\" cached={}", route.Describe(), m.used_cache);
  return route;
}

void RegistryRouteProvider::MarkDead(const mesh::ShardEndpoint& endpoint) {
  MutexLock lock(&impl_->mu);
  std::string instance;
  for (const auto& r : impl_->cache.nodes) {
    if (r.address == endpoint.name()) instance = r.instance_id;
  }
  impl_->dead[endpoint.name()] = {std::chrono::steady_clock::now(), instance};
  impl_->rtt.erase(endpoint.name());
  ClientLog().info("event=node_dead node={}", endpoint.name());
}

std::shared_ptr<mesh::ShardEndpoint> RegistryRouteProvider::EndpointFor(
    const std::string& address) {
  if (address.empty()) return nullptr;
  std::vector<registry::NodeRecord> nodes;
  try {
    nodes = impl_->Nodes();
  } catch (const Error& e) {
    ClientLog().warn("event=move_not_followed node={} message=\"{}\"", address, e.what());
    return nullptr;
  }
  for (const auto& r : nodes) {
    if (r.address != address) continue;
    MutexLock lock(&impl_->mu);
    return impl_->EndpointLocked(address);
  }
  return nullptr;
}

std::map<std::string, int64_t> RegistryRouteProvider::planned() const {
  MutexLock lock(&impl_->mu);
  return impl_->picks;
}

std::map<std::string, double> RegistryRouteProvider::last_costs() const {
  MutexLock lock(&impl_->mu);
  return impl_->costs;
}

bool RegistryRouteProvider::used_cache() const {
  MutexLock lock(&impl_->mu);
  return impl_->used_cache;
}

std::string RegistryRouteProvider::MetricsText() const {
  using prometheus::MetricType;
  prometheus::MetricFamily cost{"meshnet_route_node_cost",
                                "Cost of each node at the latest plan (lower is better)",
                                MetricType::Gauge,
                                {}};
  prometheus::MetricFamily planned{"meshnet_route_sessions_planned_total",
                                   "Sessions this client planned over each node",
                                   MetricType::Counter,
                                   {}};
  MutexLock lock(&impl_->mu);
  for (const auto& [node, c] : impl_->costs) {
    prometheus::ClientMetric m;
    m.label = {{"node", node}};
    m.gauge.value = c;
    cost.metric.push_back(m);
  }
  for (const auto& [node, n] : impl_->picks) {
    prometheus::ClientMetric m;
    m.label = {{"node", node}};
    m.counter.value = static_cast<double>(n);
    planned.metric.push_back(m);
  }
  return prometheus::TextSerializer().Serialize({cost, planned});
}

}  // namespace meshnet::rpc
