// Starting a gRPC server on one address, as the node and the registry do.
// Internal to rpc/.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace meshnet::rpc {

// Starts `builder` (services registered, options set) on `listen` with
// `creds`: SO_REUSEPORT off (gRPC sets it by default, and a second server on
// the same port would then bind too and take a share of this one's
// connections), at most `max_threads` handler threads (a ResourceQuota named
// `quota_name`). Writes the bound port. Throws kUnavailable "cannot listen on
// '<listen>'<why>" when it cannot listen.
std::unique_ptr<grpc::Server> StartListening(grpc::ServerBuilder& builder,
                                             const std::string& listen,
                                             const std::shared_ptr<grpc::ServerCredentials>& creds,
                                             int max_threads, const std::string& quota_name,
                                             const std::string& why, int* port);

}  // namespace meshnet::rpc
