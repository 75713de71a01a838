// RegistryServer: the embedded registry (registry::MemoryRegistry) served
// over gRPC as the Registry service of proto/meshnet.proto, by
// `meshnet registry` and `meshnet serve --registry-listen`. No gRPC types here.
//
// Security is the nodes': the cluster token on every call and TLS (mutual
// with tls_ca). With verify_nodes, an announcement is accepted only after the
// registry called the announced address's Info (with `node_client`'s token and
// TLS) and found the same model identity, layer range, layer count, KV recipe
// and instance id; otherwise the caller gets PERMISSION_DENIED.
//
// Thread-safety: Start/Shutdown from one thread; registry() from any.
#pragma once

#include <memory>
#include <string>

#include "registry/memory_registry.h"
#include "rpc/options.h"

namespace meshnet::rpc {

struct RegistryServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string auth_token;  // empty: none required
  std::string tls_cert;    // server certificate chain (PEM); enables TLS
  std::string tls_key;
  std::string tls_ca;     // require client certificates signed by it
  bool insecure = false;  // allow a non-loopback listen without token or client certificates
  bool verify_nodes = true;
  ClientOptions node_client;  // how the registry reaches nodes to verify them
  int max_rpc_threads = 64;

  void Validate() const;
};

class RegistryServer {
 public:
  explicit RegistryServer(RegistryServerOptions options);
  ~RegistryServer();  // Shutdown()
  RegistryServer(const RegistryServer&) = delete;
  RegistryServer& operator=(const RegistryServer&) = delete;

  // Binds and serves; kUnavailable when the address cannot be bound.
  void Start();
  std::string bound_address() const;
  registry::MemoryRegistry& registry();
  // Stops serving (waiting long polls are cancelled). Idempotent.
  void Shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What the registry checks of an announcement: the node's Info (as
// `node_client` sees it) must match the record. Throws kPermissionDenied
// naming the difference, kUnavailable when the node cannot be reached.
void VerifyAnnouncement(const registry::NodeRecord& record, const ClientOptions& node_client);

class NodeServer;
// What a serving node announces: its bound address, Info, load and free KV.
registry::NodeRecord NodeRecordOf(const NodeServer& server);

}  // namespace meshnet::rpc
