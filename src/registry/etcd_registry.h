// EtcdRegistry: the registry on an etcd v3 cluster (Debian bookworm's
// etcd-server 3.4), for meshes that outgrow one embedded registry.
//
// Why hand-written: Debian packages no C++ etcd client, and etcd's gRPC API
// would mean vendoring its .proto files. etcd serves the same API as JSON
// over HTTP (its grpc-gateway, /v3/...), which cpp-httplib and nlohmann-json
// (both already dependencies) speak in a few calls: lease grant / keepalive /
// timetolive / revoke, kv put / range, and watch (a streamed response, one
// JSON object per line). Keys and values are base64 (OpenSSL's codec).
//
// Layout: one key per node, <prefix>/nodes/<model id>/<address>, whose value
// is the record's JSON, attached to the node's lease. List(model) is a range
// over that model's keys only. Revisions are etcd's.
//
// Limits: plain HTTP to etcd (no etcd TLS or etcd auth here); each call opens
// its own connection (the gateway is on loopback or a LAN).
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "registry/registry.h"

namespace meshnet::registry {

struct EtcdAddress {
  std::string host;
  int port = 2379;
  std::string prefix = "/meshnet";  // no trailing '/'
};

// "etcd://HOST:PORT/prefix" (prefix optional). Throws kInvalidArgument.
EtcdAddress ParseEtcdUrl(const std::string& url);
bool IsEtcdUrl(const std::string& spec);

class EtcdRegistry final : public Registry {
 public:
  // `timeout_s` bounds every call but WaitForChange (which has its own).
  explicit EtcdRegistry(EtcdAddress address, double timeout_s = 5.0);

  std::string name() const override;
  LeaseId Announce(const NodeRecord& record, double ttl_s) override;
  bool Renew(LeaseId lease, const NodeRecord& record) override;
  void Withdraw(LeaseId lease) override;
  Snapshot List(const std::string& model_id = "") override;
  int64_t WaitForChange(int64_t since, double timeout_s) override;
  bool SetDraining(const std::string& address, bool draining) override;

 private:
  // POSTs `body` to the gateway; the answer's JSON. kUnavailable when etcd
  // cannot be reached, kInvalidArgument for an error answer.
  nlohmann::json Call(const std::string& path, const nlohmann::json& body) const;
  std::string Key(const NodeRecord& r) const;
  void Put(const std::string& key, const NodeRecord& r, LeaseId lease) const;

  EtcdAddress address_;
  double timeout_s_;
};

}  // namespace meshnet::registry
