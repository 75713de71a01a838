// The route provider for gRPC nodes, from --nodes (a fixed list) or
// --registry (HOST:PORT, etcd://HOST:PORT/prefix or etcds://...); shared by
// `generate` and `api`.
#pragma once

#include <memory>
#include <string>

#include "mesh/generator.h"
#include "registry/etcd_registry.h"
#include "rpc/options.h"

namespace meshnet::cli {

// Exactly one of `nodes` and `registry` must be set (kInvalidArgument
// otherwise). `co.expected_model_id` is the model routed by registry;
// `etcd`: --etcd-* for an etcds:// registry (rpc::OpenRegistry).
std::unique_ptr<mesh::RouteProvider> MakeNodeRouteProvider(const std::string& nodes,
                                                           const std::string& registry,
                                                           const rpc::ClientOptions& co,
                                                           const registry::EtcdSecurity& etcd);

}  // namespace meshnet::cli
