// The client of the embedded registry's gRPC service (rpc/registry_server.h)
// as a registry::Registry, and OpenRegistry, which picks the backend from a
// --registry value. No gRPC types here.
//
//   auto reg = rpc::OpenRegistry("127.0.0.1:7000", client_options);  // gRPC
//   auto reg = rpc::OpenRegistry("etcd://127.0.0.1:2379/meshnet", client_options);
//   auto reg = rpc::OpenRegistry("etcds://10.0.0.5:2379/meshnet", client_options, etcd);
//
// Errors: UNAVAILABLE / DEADLINE_EXCEEDED map to kUnavailable (the registry is
// down: callers keep their cached view), the rest to their ErrorKind.
//
// Thread-safety: safe to use from several threads.
#pragma once

#include <memory>
#include <string>

#include "registry/etcd_registry.h"
#include "registry/registry.h"
#include "rpc/options.h"

namespace meshnet::rpc {

class RemoteRegistry final : public registry::Registry {
 public:
  // `options`: the cluster token, TLS and info_timeout_s (the deadline of
  // every call but WaitForChange).
  RemoteRegistry(std::string address, const ClientOptions& options);
  ~RemoteRegistry() override;

  std::string name() const override;
  registry::Lease Announce(const registry::NodeRecord& record, double ttl_s) override;
  bool Renew(const registry::Lease& lease, const registry::NodeRecord& record) override;
  void Withdraw(const registry::Lease& lease) override;
  registry::Snapshot List(const std::string& model_id = "") override;
  int64_t WaitForChange(int64_t since, double timeout_s) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "etcd://HOST:PORT/prefix" or "etcds://..." (TLS) -> registry::EtcdRegistry;
// "HOST:PORT" -> RemoteRegistry. Throws kInvalidArgument for anything else.
// `etcd`: the files for an etcds:// spec; when empty, an etcds:// spec
// uses the cluster's (options.tls_ca, tls_cert, tls_key), as the embedded
// registry does.
std::unique_ptr<registry::Registry> OpenRegistry(const std::string& spec,
                                                 const ClientOptions& options,
                                                 const registry::EtcdSecurity& etcd = {});

}  // namespace meshnet::rpc
