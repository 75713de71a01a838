// meshnet serve: what a stop signal does (serve_drain.cc).
#pragma once

#include <string>
#include <vector>

#include "rpc/options.h"
#include "rpc/server.h"

namespace meshnet::cli {

// Peer options for handing sessions over: the node's cluster token, and with
// TLS its CA and certificate (the replicas' CA must be --tls-ca).
rpc::ClientOptions DrainPeerOptions(const rpc::NodeServerOptions& server);

// On SIGINT/SIGTERM. Without `drain_to`: stop accepting calls and let
// in-flight steps finish for `grace_s` (the old behaviour). With it: take no
// new sessions, move every live session's KV to one of `drain_to` (verified
// by the replica), keep answering until each moved session's client has
// learnt where it went, then stop; all within `grace_s`. Sessions no replica
// takes end with an explicit miss.
void StopServing(rpc::NodeServer& server, const std::vector<std::string>& drain_to, double grace_s);

}  // namespace meshnet::cli
