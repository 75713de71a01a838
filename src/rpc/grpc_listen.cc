#include "rpc/grpc_listen.h"

#include <grpcpp/resource_quota.h>

#include "rpc/grpc_runtime.h"
#include "util/error.h"

namespace meshnet::rpc {

std::unique_ptr<grpc::Server> StartListening(grpc::ServerBuilder& builder,
                                             const std::string& listen,
                                             const std::shared_ptr<grpc::ServerCredentials>& creds,
                                             int max_threads, const std::string& quota_name,
                                             const std::string& why, int* port) {
  QuietAbslDebugChecks();
  *port = 0;
  builder.AddListeningPort(listen, creds, port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota(quota_name);
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) {
    throw Error(ErrorKind::kUnavailable, "cannot listen on '" + listen + "'" + why);
  }
  return server;
}

}  // namespace meshnet::rpc
