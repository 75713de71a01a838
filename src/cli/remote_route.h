// The route provider for gRPC nodes, from --nodes (a fixed list) or
// --registry (HOST:PORT or etcd://HOST:PORT/prefix); shared by `generate` and
// `api`.
#pragma once

#include <memory>
#include <string>

#include "mesh/generator.h"
#include "rpc/options.h"

namespace meshnet::cli {

// Exactly one of `nodes` and `registry` must be set (kInvalidArgument
// otherwise). `co.expected_model_id` is the model routed by registry.
std::unique_ptr<mesh::RouteProvider> MakeNodeRouteProvider(const std::string& nodes,
                                                           const std::string& registry,
                                                           const rpc::ClientOptions& co);

}  // namespace meshnet::cli
