#include "cli/remote_route.h"

#include "rpc/registry_client.h"
#include "rpc/registry_route.h"
#include "rpc/remote.h"
#include "util/error.h"

namespace meshnet::cli {

std::unique_ptr<mesh::RouteProvider> MakeNodeRouteProvider(const std::string& nodes,
                                                           const std::string& registry,
                                                           const rpc::ClientOptions& co,
                                                           const registry::EtcdSecurity& etcd) {
  if (!nodes.empty() && !registry.empty()) {
    ThrowInvalidArgument("give --nodes or --registry, not both");
  }
  co.Validate();
  if (!nodes.empty()) return rpc::MakeRemoteRouteProvider(rpc::ParseNodeList(nodes), co);
  if (registry.empty()) ThrowInvalidArgument("give --nodes or --registry");
  std::shared_ptr<registry::Registry> reg = rpc::OpenRegistry(registry, co, etcd);
  return std::make_unique<rpc::RegistryRouteProvider>(std::move(reg), co.expected_model_id, co);
}

}  // namespace meshnet::cli
