// RegistryServer: the embedded registry (registry::MemoryRegistry) served
// over gRPC as the Registry service of proto/meshnet.proto, by
// `meshnet registry` and `meshnet serve --registry-listen`. No gRPC types here.
//
// Security is the nodes': the cluster token on every call and TLS (mutual
// with tls_ca). Records must be signed by their node key, and Renew and
// Withdraw must present the lease secret Announce gave (registry/registry.h).
// With verify_nodes, an announcement is accepted only after the announced
// address proved (rpc/prove.h: no token is sent to it) that it holds the
// record's key, answers to that address, serves the same model, layer range,
// layer count, KV recipe and instance, and, with a token, knows the token;
// the record's load fields are then taken from that answer. Otherwise the
// caller gets PERMISSION_DENIED.
//
// Announcements are verified off the gRPC handler threads: at most
// max_verifying at once and max_verifying_per_peer per caller (more get
// RESOURCE_EXHAUSTED at once), so callers announcing addresses that never
// answer cannot take the threads heartbeats need. Long polls (WaitForChange)
// hold a handler thread each: at most max_waits at once (and never more than
// a quarter of max_rpc_threads) and max_waits_per_peer per caller, more get
// RESOURCE_EXHAUSTED at once, so waiting callers cannot take the threads
// Renew and Announce need. A caller, for these limits, is an IPv4 address or
// an IPv6 /64 (util/host_port.h: PeerAddressKey).
//
// Thread-safety: Start/Shutdown from one thread; registry() from any.
#pragma once

#include <memory>
#include <string>

#include "registry/memory_registry.h"
#include "rpc/options.h"

namespace meshnet::rpc {

class NodeServer;

struct RegistryServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string auth_token;  // empty: none required
  std::string tls_cert;    // server certificate chain (PEM); enables TLS
  std::string tls_key;
  std::string tls_ca;     // require client certificates signed by it
  bool insecure = false;  // allow a non-loopback listen without token or client certificates
  bool verify_nodes = true;
  ClientOptions node_client;  // how the registry reaches nodes to verify them (token: never sent)
  int max_rpc_threads = 64;
  int max_verifying = 4;
  int max_verifying_per_peer = 2;
  int max_waits = 16;  // long polls at once, all callers (capped at max_rpc_threads / 4)
  int max_waits_per_peer = 8;

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
  // Announcements refused because too many were being verified.
  int64_t announces_refused() const;
  // Long polls refused because too many were waiting.
  int64_t long_polls_refused() const;
  // Stops serving (waiting long polls are cancelled). Idempotent.
  void Shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What the registry checks of an announcement (see above) with `node_client`
// (its TLS; its token only checks the node's member proof). Returns the
// record to store, load fields from the node's answer. Throws
// kPermissionDenied naming the difference, kUnavailable when the node cannot
// be reached.
registry::NodeRecord VerifyAnnouncement(const registry::NodeRecord& record,
                                        const ClientOptions& node_client);

// What a serving node announces: its canonical bound address, Info, load,
// free KV and `draining`, signed with its node key.
registry::NodeRecord NodeRecordOf(const NodeServer& server, bool draining = false);

}  // namespace meshnet::rpc
