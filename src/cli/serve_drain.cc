#include "cli/serve_drain.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "util/error.h"

namespace meshnet::cli {

rpc::ClientOptions DrainPeerOptions(const rpc::NodeServerOptions& server) {
  rpc::ClientOptions peers;
  peers.auth_token = server.auth_token;
  if (!server.tls_cert.empty() && !server.tls_ca.empty()) {
    peers.tls_ca = server.tls_ca;
    peers.tls_cert = server.tls_cert;
    peers.tls_key = server.tls_key;
  }
  return peers;
}

rpc::ReplicaFinder RegistryReplicas(std::shared_ptr<ServeRegistry> registry) {
  return [registry = std::move(registry)](const node::ShardInfo&, int64_t bytes) {
    std::vector<rpc::DrainTarget> out;
    try {
      for (const auto& r :
           registry::FindReplicas(registry->registry(), registry->record(), bytes)) {
        out.push_back({r.address, r.public_key});  // the key its signed record names
      }
    } catch (const Error& e) {
      spdlog::warn("event=replicas_unknown message=\"{}\"", e.what());
    }
    return out;
  };
}

void InstallDrainHooks(rpc::NodeServer& server, const std::shared_ptr<ServeRegistry>& registry) {
  if (!registry) return;
  server.SetDrainHooks(RegistryReplicas(registry),
                       [registry](bool draining) { registry->SetDraining(draining); });
}

void StopServing(rpc::NodeServer& server, const std::vector<std::string>& drain_to,
                 std::shared_ptr<ServeRegistry> registry, double grace_s) {
  server.SetDrainHooks({}, {});  // a late admin drain holds its own reference
  if (drain_to.empty() && !registry) {
    server.Shutdown(grace_s);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto left = [&] {
    const double used =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::max(0.0, grace_s - used);
  };
  if (registry) registry->SetDraining(true);  // planners stop choosing this node
  rpc::DrainOptions o;
  o.find_replicas = drain_to.empty() ? RegistryReplicas(registry) : rpc::StaticReplicas(drain_to);
  o.deadline_s = grace_s;
  const rpc::DrainReport r = server.Drain(o);
  for (const auto& note : r.notes) spdlog::warn("event=drain_note message=\"{}\"", note);
  const bool told = server.WaitMovesTold(left());
  spdlog::info("event=drain_done moved={} ended={} clients_told={} seconds={:.3f}", r.moved,
               r.ended, told, r.seconds);
  o.find_replicas = {};
  registry.reset();  // withdraws the record (unless a late admin drain still holds it)
  server.Shutdown(left());
}

}  // namespace meshnet::cli
