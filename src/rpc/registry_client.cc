#include "rpc/registry_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "proto/meshnet.grpc.pb.h"
#include "registry/etcd_registry.h"
#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/registry_codec.h"
#include "rpc/remote.h"
#include "rpc/status.h"
#include "util/error.h"

namespace meshnet::rpc {

struct RemoteRegistry::Impl {
  std::string address;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Registry::Stub> stub;
  std::string bearer;

  // Runs one unary call with a deadline; throws for a non-OK status.
  template <typename Req, typename Resp, typename Method>
  Resp Call(Method method, const Req& req, const char* name, double timeout_s) const {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(timeout_s));
    if (!bearer.empty()) ctx.AddMetadata("authorization", bearer);
    Resp resp;
    const grpc::Status s = (stub.get()->*method)(&ctx, req, &resp);
    if (!s.ok()) ThrowForStatus(s, ctx, "registry " + address, name);
    return resp;
  }
};

RemoteRegistry::RemoteRegistry(std::string address, const ClientOptions& options)
    : impl_(std::make_unique<Impl>()) {
  options.Validate();
  impl_->address = std::move(address);
  impl_->options = options;
  impl_->channel = MakeClientChannel(impl_->address, options);
  impl_->stub = pb::Registry::NewStub(impl_->channel);
  if (!options.auth_token.empty()) impl_->bearer = BearerValue(options.auth_token);
}

RemoteRegistry::~RemoteRegistry() = default;

std::string RemoteRegistry::name() const { return impl_->address; }

registry::Lease RemoteRegistry::Announce(const registry::NodeRecord& record, double ttl_s) {
  pb::RegistryAnnounceRequest req;
  EncodeRecord(record, req.mutable_record());
  req.set_ttl_s(ttl_s);
  // The registry has the node prove itself before it answers: allow for that.
  const auto resp = impl_->Call<pb::RegistryAnnounceRequest, pb::RegistryAnnounceResponse>(
      &pb::Registry::Stub::Announce, req, "Announce", 2 * impl_->options.info_timeout_s + 1);
  return registry::Lease{resp.lease(), resp.lease_secret(),
                         resp.ttl_s() > 0 ? resp.ttl_s() : ttl_s};
}

bool RemoteRegistry::Renew(const registry::Lease& lease, const registry::NodeRecord& record) {
  pb::RegistryRenewRequest req;
  req.set_lease(lease.id);
  req.set_lease_secret(lease.secret);
  EncodeRecord(record, req.mutable_record());
  return impl_
      ->Call<pb::RegistryRenewRequest, pb::RegistryRenewResponse>(
          &pb::Registry::Stub::Renew, req, "Renew", impl_->options.info_timeout_s)
      .renewed();
}

void RemoteRegistry::Withdraw(const registry::Lease& lease) {
  pb::RegistryWithdrawRequest req;
  req.set_lease(lease.id);
  req.set_lease_secret(lease.secret);
  impl_->Call<pb::RegistryWithdrawRequest, pb::RegistryWithdrawResponse>(
      &pb::Registry::Stub::Withdraw, req, "Withdraw", impl_->options.info_timeout_s);
}

registry::Snapshot RemoteRegistry::List(const std::string& model_id) {
  pb::RegistryListRequest req;
  req.set_model_id(model_id);
  const auto resp = impl_->Call<pb::RegistryListRequest, pb::RegistryListResponse>(
      &pb::Registry::Stub::List, req, "List", impl_->options.info_timeout_s);
  registry::Snapshot s;
  s.revision = resp.revision();
  for (const auto& n : resp.nodes()) s.nodes.push_back(DecodeRecord(n));
  return s;
}

int64_t RemoteRegistry::WaitForChange(int64_t since, double timeout_s) {
  pb::RegistryWaitRequest req;
  req.set_since(since);
  const double t = std::clamp(timeout_s, 0.0, 60.0);
  req.set_timeout_ms(static_cast<int64_t>(t * 1000));
  return impl_
      ->Call<pb::RegistryWaitRequest, pb::RegistryWaitResponse>(&pb::Registry::Stub::WaitForChange,
                                                                req, "WaitForChange",
                                                                t + impl_->options.info_timeout_s)
      .revision();
}

std::unique_ptr<registry::Registry> OpenRegistry(const std::string& spec,
                                                 const ClientOptions& options,
                                                 const registry::EtcdSecurity& etcd) {
  if (registry::IsEtcdUrl(spec)) {
    const registry::EtcdAddress address = registry::ParseEtcdUrl(spec);
    registry::EtcdSecurity sec = etcd;
    if (address.tls && !sec.has_tls_files()) {
      sec.ca_file = options.tls_ca;
      sec.cert_file = options.tls_cert;
      sec.key_file = options.tls_key;
    }
    return std::make_unique<registry::EtcdRegistry>(address, options.info_timeout_s, sec);
  }
  if (spec.find("://") != std::string::npos) {
    ThrowInvalidArgument("--registry '" + spec +
                         "': expected HOST:PORT (embedded registry), etcd://HOST:PORT/prefix "
                         "or etcds://HOST:PORT/prefix");
  }
  try {
    if (spec.find(',') != std::string::npos) throw Error(ErrorKind::kInvalidArgument, "");
    ParseNodeList(spec);  // one host:port with a port in 1..65535
  } catch (const Error&) {
    ThrowInvalidArgument("invalid --registry '" + spec +
                         "': expected one HOST:PORT (embedded registry, port 1..65535), "
                         "etcd://HOST:PORT/prefix or etcds://HOST:PORT/prefix");
  }
  return std::make_unique<RemoteRegistry>(spec, options);
}

}  // namespace meshnet::rpc
