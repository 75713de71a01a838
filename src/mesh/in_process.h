// The in-process mesh: one model file split into shards that live in this
// process, each with its own HotKvStateManager, joined into a route of
// InProcessEndpoints. `meshnet generate` without --nodes runs this, and the
// tests compare networked routes against it.
//
// Thread-safety: endpoints are safe for concurrent sessions (the adapter and
// manager are); construction and destruction are single-threaded.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kv/hot_kv_state.h"
#include "mesh/endpoint.h"
#include "mesh/generator.h"
#include "shard/kv_boundary_adapter.h"
#include "shard/llama_shard.h"

namespace meshnet {
class ThreadPool;
}

namespace meshnet::mesh {

using LayerRange = std::pair<int, int>;  // inclusive

// "0-1,2-3,4-4" -> {{0,1},{2,3},{4,4}}; the ranges must be contiguous, start
// at 0 and end at total_layers-1. Throws kInvalidArgument naming the problem.
std::vector<LayerRange> ParseSplit(const std::string& text, int total_layers);
// n_shards nearly equal contiguous ranges (earlier shards get the extra layer).
std::vector<LayerRange> EvenSplit(int n_shards, int total_layers);
// "A-B" -> {A, B}.
LayerRange ParseLayerRange(const std::string& text);

// A hop backed by a KvBoundaryAdapter in this process.
class InProcessEndpoint final : public ShardEndpoint {
 public:
  InProcessEndpoint(shard::KvBoundaryAdapter* adapter, std::string model_id);
  std::string name() const override;
  ShardInfo Info() override;
  StepResult Step(StepRequest request) override;
  void Release(const std::string& session_id, const std::string& session_secret,
               int64_t route_epoch) override;

 private:
  shard::KvBoundaryAdapter* adapter_;
  std::string model_id_;
};

struct InProcessMeshOptions {
  std::vector<LayerRange> split;  // empty: one shard
  KvDtype kv_dtype = KvDtype::kF32;
  kv::HotKvStateConfig kv_config;
};

class InProcessMesh {
 public:
  // `file` and `pool` must outlive the mesh.
  InProcessMesh(std::shared_ptr<const gguf::GgufFile> file, const InProcessMeshOptions& options,
                ThreadPool* pool);
  ~InProcessMesh();

  Route route() const;
  int num_shards() const { return static_cast<int>(shards_.size()); }
  shard::LlamaShard& shard(int i) { return *shards_[i]; }
  kv::HotKvStateManager& manager(int i) { return *managers_[i]; }
  shard::KvBoundaryAdapter& adapter(int i) { return *adapters_[i]; }
  const std::shared_ptr<InProcessEndpoint>& endpoint(int i) { return endpoints_[i]; }

 private:
  std::vector<std::unique_ptr<shard::LlamaShard>> shards_;
  std::vector<std::unique_ptr<kv::HotKvStateManager>> managers_;
  std::vector<std::unique_ptr<shard::KvBoundaryAdapter>> adapters_;
  std::vector<std::shared_ptr<InProcessEndpoint>> endpoints_;
};

// A stable identity of the model file: sha256 over its bytes (hex).
std::string ModelIdentity(const gguf::GgufFile& file);

}  // namespace meshnet::mesh
