// The registry side of `meshnet serve`: --registry (announce this node under
// a lease renewed by heartbeat), --registry-listen (also serve an embedded
// registry) and --lease-ttl. Kept out of serve_cmd.cc's RunServe.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "registry/etcd_registry.h"
#include "registry/registry.h"

namespace meshnet::rpc {
class NodeServer;
}

namespace meshnet::cli {

struct ServeRegistryFlags {
  std::string registry;         // HOST:PORT, etcd://HOST:PORT/prefix or etcds://...
  registry::EtcdSecurity etcd;  // --etcd-*: for etcds:// (default: the node's TLS files)
  std::string registry_listen;  // serve an embedded registry here too
  double lease_ttl_s = 10.0;
  std::string registry_http;  // the embedded registry's status page / JSON / metrics
};

void AddServeRegistryFlags(CLI::App* sub, ServeRegistryFlags* f);

// Whatever the flags started: stopped (record withdrawn, registry closed) on
// destruction. For a drain: SetDraining(true) marks the record draining at
// once and in every later heartbeat (clients stop routing new sessions here,
// the status page shows it), and
// registry::FindReplicas(registry(), record(), bytes) names the replicas of
// this node's range with room for a session's KV.
class ServeRegistry {
 public:
  virtual ~ServeRegistry() = default;
  virtual void SetDraining(bool draining) = 0;
  virtual registry::Registry& registry() = 0;
  virtual registry::NodeRecord record() const = 0;
};

// Starts the embedded registry (printing "registry on HOST:PORT", and
// "registry page on HOST:PORT" with --registry-http) and the announcer.
// `token`, `tls_*`: the node's own cluster token and TLS files, used for the
// registry too. Null when no registry flag is set.
std::unique_ptr<ServeRegistry> StartServeRegistry(const ServeRegistryFlags& f,
                                                  const rpc::NodeServer& server,
                                                  const std::string& token,
                                                  const std::string& tls_ca,
                                                  const std::string& tls_cert,
                                                  const std::string& tls_key, bool insecure);

}  // namespace meshnet::cli
