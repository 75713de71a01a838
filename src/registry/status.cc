#include "registry/status.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cstdio>
#include <map>

#include "registry/planner.h"
#include "util/sizes.h"

namespace meshnet::registry {

namespace {

nlohmann::json ModelJson(const std::vector<NodeRecord>& nodes) {
  nlohmann::json m;
  m["model_id"] = nodes.front().model_id;
  m["architecture"] = nodes.front().architecture;
  m["total_layers"] = nodes.front().total_layers;
  m["nodes"] = nlohmann::json::array();
  for (const auto& r : nodes) m["nodes"].push_back(ToJson(r));
  const auto routes = EnumerateRoutes(nodes, nodes.front().total_layers, kMaxListedRoutes + 1);
  m["route_count"] = routes.size() > kMaxListedRoutes ? -1 : static_cast<int64_t>(routes.size());
  m["routes"] = nlohmann::json::array();
  for (size_t i = 0; i < routes.size() && i < kMaxListedRoutes; ++i) {
    nlohmann::json route = nlohmann::json::array();
    for (size_t k : routes[i]) route.push_back(nodes[k].address);
    m["routes"].push_back(route);
  }
  return m;
}

prometheus::ClientMetric Gauge(double v, std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric c;
  c.gauge.value = v;
  c.label = std::move(labels);
  return c;
}

}  // namespace

nlohmann::json StatusJson(const Snapshot& snapshot, const std::string& registry_name) {
  std::map<std::string, std::vector<NodeRecord>> by_model;
  for (const auto& r : snapshot.nodes) by_model[r.model_id].push_back(r);
  nlohmann::json out;
  out["registry"] = registry_name;
  out["revision"] = snapshot.revision;
  out["models"] = nlohmann::json::array();
  for (auto& [id, nodes] : by_model) {
    SortRecords(nodes);
    out["models"].push_back(ModelJson(nodes));
  }
  return out;
}

std::string StatusText(const nlohmann::json& status) {
  std::string out = "registry " + status.value("registry", std::string()) + " (revision " +
                    std::to_string(status.value("revision", int64_t{0})) + ")\n";
  if (status["models"].empty()) out += "no nodes registered\n";
  char line[512];
  for (const auto& m : status["models"]) {
    out += "\nmodel " + m["model_id"].get<std::string>().substr(0, 16) + " (" +
           m["architecture"].get<std::string>() + ", " +
           std::to_string(m["total_layers"].get<int>()) + " layers)\n";
    std::snprintf(line, sizeof line, "  %-22s %-7s %8s %9s %10s %9s  %s\n", "node", "layers",
                  "sessions", "in-flight", "kv free", "sess free", "state");
    out += line;
    for (const auto& n : m["nodes"]) {
      const std::string layers = std::to_string(n["start_layer"].get<int>()) + "-" +
                                 std::to_string(n["end_layer"].get<int>());
      std::snprintf(line, sizeof line, "  %-22s %-7s %8lld %9lld %10s %9lld  %s\n",
                    n["address"].get<std::string>().c_str(), layers.c_str(),
                    static_cast<long long>(n["live_sessions"].get<int64_t>()),
                    static_cast<long long>(n["in_flight_steps"].get<int64_t>()),
                    FormatByteSize(n["kv_bytes_free"].get<int64_t>()).c_str(),
                    static_cast<long long>(n["sessions_free"].get<int64_t>()),
                    n["draining"].get<bool>() ? "draining" : "serving");
      out += line;
    }
    const int64_t count = m["route_count"].get<int64_t>();
    out += "  routes: " +
           (count < 0 ? "more than " + std::to_string(kMaxListedRoutes) : std::to_string(count)) +
           "\n";
    for (const auto& route : m["routes"]) {
      std::string chain;
      for (const auto& a : route) chain += (chain.empty() ? "" : " -> ") + a.get<std::string>();
      out += "    " + chain + "\n";
    }
  }
  return out;
}

std::string StatusMetrics(const nlohmann::json& status) {
  using prometheus::MetricFamily;
  using prometheus::MetricType;
  MetricFamily nodes{"meshnet_registry_nodes", "Live nodes per model", MetricType::Gauge, {}};
  MetricFamily routes{"meshnet_registry_routes",
                      "Complete routes per model (-1: more than 64)",
                      MetricType::Gauge,
                      {}};
  MetricFamily kv{
      "meshnet_registry_node_kv_bytes_free", "Free KV bytes per node", MetricType::Gauge, {}};
  MetricFamily live{
      "meshnet_registry_node_live_sessions", "Live sessions per node", MetricType::Gauge, {}};
  MetricFamily flight{
      "meshnet_registry_node_in_flight_steps", "Steps running per node", MetricType::Gauge, {}};
  MetricFamily drain{
      "meshnet_registry_node_draining", "1 while a node drains", MetricType::Gauge, {}};
  for (const auto& m : status["models"]) {
    const std::string model = m["model_id"].get<std::string>().substr(0, 16);
    nodes.metric.push_back(Gauge(static_cast<double>(m["nodes"].size()), {{"model", model}}));
    routes.metric.push_back(Gauge(m["route_count"].get<double>(), {{"model", model}}));
    for (const auto& n : m["nodes"]) {
      const std::vector<prometheus::ClientMetric::Label> labels = {
          {"model", model},
          {"node", n["address"].get<std::string>()},
          {"layers", std::to_string(n["start_layer"].get<int>()) + "-" +
                         std::to_string(n["end_layer"].get<int>())}};
      kv.metric.push_back(Gauge(n["kv_bytes_free"].get<double>(), labels));
      live.metric.push_back(Gauge(n["live_sessions"].get<double>(), labels));
      flight.metric.push_back(Gauge(n["in_flight_steps"].get<double>(), labels));
      drain.metric.push_back(Gauge(n["draining"].get<bool>() ? 1 : 0, labels));
    }
  }
  return prometheus::TextSerializer().Serialize({nodes, routes, kv, live, flight, drain});
}

}  // namespace meshnet::registry
