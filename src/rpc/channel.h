// Client channels and deadlines shared by the node client (rpc/remote.h) and
// the registry client (rpc/registry_client.h). Internal to rpc/.
//
// Thread-safety: pure functions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "rpc/options.h"

namespace meshnet::rpc {

// A channel to `address` with the client's TLS settings, quick reconnects and
// its own connection (not shared through the global subchannel pool).
std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& address,
                                                 const ClientOptions& o);

// A deadline `seconds` from now. Clamped to [0, a year]: --timeout 1e13 is
// "no practical limit", and must not overflow int64 microseconds (which put
// the deadline in the past and marked a healthy node dead).
std::chrono::system_clock::time_point DeadlineAfter(double seconds);

}  // namespace meshnet::rpc
