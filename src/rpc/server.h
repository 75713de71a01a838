// NodeServer: a meshnet node on gRPC. Serves the MeshNode service
// (proto/meshnet.proto) for one shard, the standard gRPC health service, and
// optionally a Prometheus /metrics endpoint. No gRPC types in this header.
//
//   NodeServer server(&node, options);
//   server.Start();                 // binds; bound_address() is now known
//   ... wait for a signal ...
//   server.Shutdown(10.0);          // stop accepting, finish in-flight steps
//
// Every MeshNode call checks its credential (rpc/server_auth.h: the cluster
// token, or for Drain/Undrain the admin token) in constant time, on its
// metadata before its message is read; the health service and Prove are
// open. The node has an Ed25519 key (NodeServerOptions::node_key_file, else
// one per process) with which it proves its identity (rpc/prove.h) and signs
// its registry record.
//
// Thread-safety: Start/Shutdown from one thread; the accessors from any.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "node/step.h"
#include "rpc/drain.h"
#include "rpc/options.h"
#include "util/signing_key.h"

namespace meshnet::node {
class Node;
}

namespace meshnet::rpc {

class NodeServer {
 public:
  // `node` must outlive the server. Validates options (kInvalidArgument).
  NodeServer(node::Node* node, NodeServerOptions options);
  ~NodeServer();  // Shutdown(0) if still running
  NodeServer(const NodeServer&) = delete;
  NodeServer& operator=(const NodeServer&) = delete;

  // Binds and starts serving. Throws Error(kInvalidArgument) for unreadable
  // TLS files and Error(kUnavailable) when the address cannot be bound.
  void Start();
  // "host:port" actually bound (port 0 resolved).
  std::string bound_address() const;
  // NodeServerOptions::advertise, else the canonical bound address ("" when
  // that names no host).
  std::string advertised_address() const;
  // "host:port" of /metrics, empty without an exposer.
  std::string metrics_address() const;
  // The KV transfer port (rpc/kv_transfer.h); 0 when none is open.
  int kv_transfer_port() const;
  // The random id of this process's node (changes on restart).
  std::string instance_id() const;
  // The node's key (signs its registry record and its Prove answers).
  const SigningKey& node_key() const;
  // Stops taking new sessions and moves live ones (rpc/drain.h); the node
  // keeps serving (moved sessions' next steps learn where they went).
  // `options.client` empty of a token: the server's peer options.
  DrainReport Drain(DrainOptions options);
  // For a Drain call (`meshnet admin drain`) that names no targets: where
  // replicas come from; and what to do first on Drain (on_drain(true): a
  // registry marks this node draining) and on Undrain (on_drain(false)). May
  // be called while serving.
  void SetDrainHooks(ReplicaFinder finder, std::function<void(bool draining)> on_drain);
  // Waits up to `seconds` until every moved session's client was told.
  bool WaitMovesTold(double seconds);
  // The node's Info as MeshNode.Info answers it (for the registry announcer).
  node::NodeInfo Info() const;
  // Steps running now, and the KV manager's session cap.
  int64_t steps_in_flight() const;
  const node::NodeCounters& counters() const;
  int64_t max_sessions() const;
  // Stops accepting calls and waits up to `grace_seconds` for in-flight calls,
  // then cancels the rest. Idempotent.
  void Shutdown(double grace_seconds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshnet::rpc
