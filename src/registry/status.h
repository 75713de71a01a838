// What `meshnet status` prints and the registry's page shows: per model, its
// nodes (range, load, free KV, draining) and the routes that can serve it.
//
//   {"revision": R, "registry": NAME,
//    "models": [{"model_id", "architecture", "total_layers",
//                "nodes": [record...], "route_count", "routes": [["a:1","b:2"],...]}]}
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "registry/record.h"

namespace meshnet::registry {

inline constexpr size_t kMaxListedRoutes = 64;

nlohmann::json StatusJson(const Snapshot& snapshot, const std::string& registry_name);
// A human table of StatusJson.
std::string StatusText(const nlohmann::json& status);
// Prometheus text exposition of StatusJson (meshnet_registry_* gauges).
std::string StatusMetrics(const nlohmann::json& status);

}  // namespace meshnet::registry
