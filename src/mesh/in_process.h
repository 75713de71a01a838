// The in-process route: one model file split into node::Nodes that live in
// this process (each a shard with its own HotKvStateManager), joined into a
// route of InProcessEndpoints. `meshnet generate` without --nodes runs this,
// and the tests compare networked routes against it.
//
// Thread-safety: endpoints are safe for concurrent sessions (the nodes are);
// construction and destruction are single-threaded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kv/hot_kv_state.h"
#include "mesh/endpoint.h"
#include "mesh/generator.h"
#include "node/layer_range.h"
#include "node/node.h"
#include "shard/kv_boundary_adapter.h"
#include "shard/llama_shard.h"

namespace meshnet {
class ThreadPool;
}

namespace meshnet::mesh {

// A hop backed by a node::Node in this process.
class InProcessEndpoint final : public ShardEndpoint {
 public:
  // `node` must outlive the endpoint.
  explicit InProcessEndpoint(node::Node* node) : node_(node) {}
  std::string name() const override;
  ShardInfo Info() override;
  StepResult Step(StepRequest request) override;
  void Release(const std::string& session_id, const std::string& session_secret,
               int64_t route_epoch) override;
  int64_t Truncate(const std::string& session_id, const std::string& session_secret,
                   int64_t route_epoch, int64_t length) override;
  void Park(const std::string& session_id, const std::string& session_secret,
            int64_t route_epoch) override;

 private:
  node::Node* node_;
};

struct InProcessMeshOptions {
  std::vector<node::LayerRange> split;  // empty: one shard
  KvDtype kv_dtype = KvDtype::kF16;
  bool ggml_parity = false;  // node::NodeOptions::ggml_parity
  kv::HotKvStateConfig kv_config;
  node::BatchOptions batch;  // each node's batching of concurrent steps
  // With several shards (they share the mesh's pool), their batches take
  // turns, the earliest layers first, each waiting up to transit_wait_s for
  // the sessions between two steps (node::Batcher::SetTurnGate): at 16
  // sessions on 3 shards, one cohort per round rather than several.
  bool batch_turns = true;
  double transit_wait_s = 0.002;  // as rpc::ClientOptions::transit_wait_s
};

class InProcessMesh {
 public:
  // `file` and `pool` must outlive the mesh.
  InProcessMesh(std::shared_ptr<const gguf::GgufFile> file, const InProcessMeshOptions& options,
                ThreadPool* pool);
  ~InProcessMesh();

  Route route() const;
  int num_shards() const { return static_cast<int>(nodes_.size()); }
  node::Node& node(int i) { return *nodes_[i]; }
  shard::LlamaShard& shard(int i) { return nodes_[i]->shard(); }
  kv::HotKvStateManager& manager(int i) { return nodes_[i]->manager(); }
  shard::KvBoundaryAdapter& adapter(int i) { return nodes_[i]->adapter(); }
  const std::shared_ptr<InProcessEndpoint>& endpoint(int i) { return endpoints_[i]; }

 private:
  std::vector<std::unique_ptr<node::Node>> nodes_;
  std::vector<std::shared_ptr<InProcessEndpoint>> endpoints_;
};

}  // namespace meshnet::mesh
