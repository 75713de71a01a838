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
// Security: "etcds://HOST:PORT/prefix" speaks HTTPS (cpp-httplib's OpenSSL
// client). etcd's certificate is always verified, its host name or IP
// against the certificate's subjectAltName, with EtcdSecurity::ca_file (or
// the system CAs when none is given); a client certificate and key answer an
// etcd started with --client-cert-auth. An untrusted server is
// kPermissionDenied, naming OpenSSL's reason. With EtcdSecurity::user (etcd
// auth enabled), a token from /v3/auth/authenticate goes in every request's
// Authorization header; a token etcd forgot (its TTL, a restart) is renewed
// once per call. A bad password or a refused operation is kPermissionDenied.
//
// Limits: each call opens its own
// connection (and TLS session), which is fine for heartbeats every few
// seconds but not for a hot path.
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "registry/registry.h"
#include "util/error.h"
#include "util/mutex.h"

namespace httplib {
class ClientImpl;
enum class Error;
}  // namespace httplib

namespace meshnet::registry {

struct EtcdAddress {
  std::string host;
  int port = 2379;
  std::string prefix = "/meshnet";  // no trailing '/'
  bool tls = false;                 // etcds://
};

// "etcd://HOST:PORT/prefix" or "etcds://HOST:PORT/prefix" (TLS); the prefix
// is optional. Throws kInvalidArgument.
EtcdAddress ParseEtcdUrl(const std::string& url);
// Whether `spec` starts with etcd:// or etcds://.
bool IsEtcdUrl(const std::string& spec);

// What lets a client into a secured etcd, all optional: TLS files (PEM, for
// etcds:// only) and an etcd user.
struct EtcdSecurity {
  std::string ca_file;    // CA of etcd's server certificate (empty: the system CAs)
  std::string cert_file;  // client certificate, for etcd's --client-cert-auth
  std::string key_file;   // its private key
  std::string user;       // etcd auth: user name (empty: no auth)
  std::string password;
  bool has_tls_files() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
  // kInvalidArgument for a certificate without key (or the reverse), files
  // given for a plain etcd:// address, a file that cannot be read, or a
  // password without a user.
  void Validate(const EtcdAddress& address) const;
};

class EtcdRegistry final : public Registry {
 public:
  // `timeout_s` bounds every call but WaitForChange (which has its own).
  // `security` is validated here (kInvalidArgument); no connection is made yet.
  explicit EtcdRegistry(EtcdAddress address, double timeout_s = 5.0, EtcdSecurity security = {});

  std::string name() const override;
  // Leases are etcd's (no secret: etcd's own auth decides who may write).
  Lease Announce(const NodeRecord& record, double ttl_s) override;
  bool Renew(const Lease& lease, const NodeRecord& record) override;
  void Withdraw(const Lease& lease) override;
  // Only records signed by the node key they carry, stored under their own
  // key: a record any other etcd writer made or changed is left out. And
  // only records held under a lease and signed within kMaxLeaseTtlS plus
  // kListClockSkewMs (registry.h): a node's old record put back by a writer
  // (with no lease, or under a lease the writer keeps alive) is left out too.
  Snapshot List(const std::string& model_id = "") override;
  int64_t WaitForChange(int64_t since, double timeout_s) override;

 private:
  // POSTs `body` to the gateway with the auth token; the answer's JSON.
  // kUnavailable when etcd cannot be reached, kPermissionDenied when auth
  // fails, kInvalidArgument for another error answer.
  nlohmann::json Call(const std::string& path, const nlohmann::json& body) const;
  // One POST with `token` ("" = none).
  nlohmann::json Post(const std::string& path, const nlohmann::json& body,
                      const std::string& token) const;
  // The auth token ("" without a user), from etcd when there is none yet or
  // `renew`.
  std::string Token(bool renew) const;
  // A client for one call, TLS set up when the address is etcds://.
  std::unique_ptr<httplib::ClientImpl> Client() const;
  // The Error for a call that failed with `err` (a TLS failure named).
  Error Failure(const std::string& path, httplib::Error err, const httplib::ClientImpl& cli) const;
  std::string Key(const NodeRecord& r) const;
  void Put(const std::string& key, const NodeRecord& r, LeaseId lease) const;
  void Revoke(LeaseId lease) const;

  EtcdAddress address_;
  double timeout_s_;
  EtcdSecurity sec_;
  mutable Mutex mu_;
  mutable std::string token_ GUARDED_BY(mu_);
};

}  // namespace meshnet::registry
