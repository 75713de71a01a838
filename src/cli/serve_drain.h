// meshnet serve: what a stop signal does (serve_drain.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/serve_registry.h"
#include "rpc/drain.h"
#include "rpc/options.h"
#include "rpc/server.h"

namespace meshnet::cli {

// Peer options for handing sessions over: the node's cluster token, and with
// TLS its CA and certificate (the replicas' CA must be --tls-ca).
rpc::ClientOptions DrainPeerOptions(const rpc::NodeServerOptions& server);

// Replicas of this node's range (same model and KV recipe) that the registry
// lists as live, not draining, with a free session slot and the session's KV
// bytes free, most free KV first, each with the key of its signed record
// (the push checks it: rpc/migrate.h). An unreachable registry names none.
rpc::ReplicaFinder RegistryReplicas(std::shared_ptr<ServeRegistry> registry);

// With a registry: `meshnet admin drain` without targets drains to
// RegistryReplicas and marks this node draining in the registry first;
// `meshnet admin undrain` clears the mark.
void InstallDrainHooks(rpc::NodeServer& server, const std::shared_ptr<ServeRegistry>& registry);

// On SIGINT/SIGTERM. Without `drain_to` or a registry: withdraw from the
// registry (if any), stop accepting calls and let in-flight steps finish for
// `grace_s` (the old behaviour). With `drain_to`, or else with a registry
// (`registry` non-null): mark this node draining in the registry, take no
// new sessions, move every live session's KV to one of `drain_to` or of the
// registry's replicas (verified by the replica), keep answering until each
// moved session's client has learnt where it went, withdraw from the
// registry, then stop; all within `grace_s`. Sessions no replica takes end
// with an explicit miss.
void StopServing(rpc::NodeServer& server, const std::vector<std::string>& drain_to,
                 std::shared_ptr<ServeRegistry> registry, double grace_s);

}  // namespace meshnet::cli
