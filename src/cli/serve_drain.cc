#include "cli/serve_drain.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "rpc/drain.h"

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

void StopServing(rpc::NodeServer& server, const std::vector<std::string>& drain_to,
                 double grace_s) {
  if (drain_to.empty()) {
    server.Shutdown(grace_s);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto left = [&] {
    const double used =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::max(0.0, grace_s - used);
  };
  rpc::DrainOptions o;
  o.find_replicas = rpc::StaticReplicas(drain_to);
  o.deadline_s = grace_s;
  const rpc::DrainReport r = server.Drain(o);
  for (const auto& note : r.notes) spdlog::warn("event=drain_note message=\"{}\"", note);
  const bool told = server.WaitMovesTold(left());
  spdlog::info("event=drain_done moved={} ended={} clients_told={} seconds={:.3f}", r.moved,
               r.ended, told, r.seconds);
  server.Shutdown(left());
}

}  // namespace meshnet::cli
