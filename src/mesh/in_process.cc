#include "mesh/in_process.h"

#include <string>

#include "node/identity.h"
#include "util/error.h"

namespace meshnet::mesh {

std::string InProcessEndpoint::name() const {
  const auto& r = node_->role();
  return "in-process[" + std::to_string(r.start_layer) + "-" + std::to_string(r.end_layer) + "]";
}

ShardInfo InProcessEndpoint::Info() { return node_->Info(); }

StepResult InProcessEndpoint::Step(StepRequest request) { return node_->Step(request); }

void InProcessEndpoint::Release(const std::string& session_id, const std::string&,
                                int64_t route_epoch) {
  try {
    node_->Release(session_id, route_epoch);
  } catch (const Error&) {
    // Best effort: a malformed key has nothing to release.
  }
}

InProcessMesh::InProcessMesh(std::shared_ptr<const gguf::GgufFile> file,
                             const InProcessMeshOptions& options, ThreadPool* pool) {
  node::NodeOptions no;
  no.kv_dtype = options.kv_dtype;
  no.ggml_parity = options.ggml_parity;
  no.kv_config = options.kv_config;
  no.batch = options.batch;
  no.model_id = node::ModelIdentity(*file);  // once for every node
  std::vector<std::optional<node::LayerRange>> split(options.split.begin(), options.split.end());
  if (split.empty()) split.emplace_back();  // one node of every layer
  for (const auto& range : split) {
    no.layers = range;
    nodes_.push_back(std::make_unique<node::Node>(file, no, pool));
    endpoints_.push_back(std::make_shared<InProcessEndpoint>(nodes_.back().get()));
  }
}

InProcessMesh::~InProcessMesh() = default;

Route InProcessMesh::route() const {
  Route r;
  for (const auto& e : endpoints_) r.hops.push_back(e);
  return r;
}

}  // namespace meshnet::mesh
