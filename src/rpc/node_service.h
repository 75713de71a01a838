// NodeService: the meshnet.v1 messages over a node::NodeCore. Decodes (the
// wire-level checks of rpc/codec.h), calls the core, encodes the answer; the
// gRPC service in server.cc only adds the cluster token and status mapping.
// Internal to rpc/ (takes protobuf types).
//
// Thread-safety: all methods are thread-safe (NodeCore is).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <span>

#include "node/node.h"
#include "node/node_core.h"
#include "rpc/codec.h"
#include "rpc/drain.h"
#include "rpc/options.h"
#include "util/mutex.h"

namespace meshnet::rpc {

class NodeService {
 public:
  // `node` must outlive the service.
  explicit NodeService(node::Node* node, node::NodeCoreOptions options = {});

  void Info(pb::InfoResponse* out);
  // Throws meshnet::Error (the server maps it to a status); a CacheMiss goes
  // into response->miss (status OK).
  void Step(const pb::StepRequest& request, pb::StepResponse* response);
  // Steps `which` of a StepMany call (decode steps of distinct sessions) in
  // one go (node::NodeCore::StepMany): step i's answer into out's outcome i,
  // or errors[i] with what Step would have thrown for it.
  void StepMany(const pb::StepManyRequest& request, std::span<const int> which,
                pb::StepManyResponse* out, std::span<std::exception_ptr> errors);
  void Truncate(const pb::TruncateRequest& request, pb::TruncateResponse* response);
  void Release(const pb::ReleaseRequest& request, pb::ReleaseResponse* response);
  // Session migration (rpc/migrate.h, rpc/drain.h). `write` / `read` return
  // false when the stream is closed / at its end.
  void ExportSession(const pb::ExportSessionRequest& request,
                     const std::function<bool(const pb::SessionChunk&)>& write);
  void ImportSession(const std::function<bool(pb::SessionChunk*)>& read,
                     pb::ImportSessionResponse* response);
  // Drains to the request's targets (each proven before anything is sent,
  // rpc/migrate.h), reached with `peers` (set_peer_options); with none, to
  // the replicas the drain hooks' finder names. The hooks' on_drain(true)
  // runs first (e.g. marks this node draining in its registry).
  void Drain(const pb::DrainRequest& request, pb::DrainResponse* response);
  // Takes new sessions again (on_drain(false) first); whether it drained.
  bool Undrain();
  void set_drain_hooks(ReplicaFinder finder, std::function<void(bool)> on_drain);
  void set_peer_options(const ClientOptions& peers) { peers_ = peers; }
  const ClientOptions& peer_options() const { return peers_; }

  node::NodeCore& core() { return core_; }
  node::NodeCounters& counters() { return core_.counters(); }
  int64_t bindings() const { return core_.bindings(); }

 private:
  // The wire request as the core's, counting a malformed one; throws.
  void Decode(const pb::StepRequest& request, node::StepRequest* r, node::ReplyFormat* format);

  node::NodeCore core_;
  ClientOptions peers_;
  mutable Mutex hooks_mu_;  // the hooks are set while the node serves
  ReplicaFinder default_finder_ GUARDED_BY(hooks_mu_);
  std::function<void(bool)> on_drain_ GUARDED_BY(hooks_mu_);
};

}  // namespace meshnet::rpc
