#include "mesh/in_process.h"

#include <string>

#include "node/identity.h"
#include "util/error.h"
#include "util/rank_gate.h"
#include "util/transit.h"

namespace meshnet::mesh {

std::string InProcessEndpoint::name() const {
  const auto& r = node_->role();
  return "in-process[" + std::to_string(r.start_layer) + "-" + std::to_string(r.end_layer) + "]";
}

ShardInfo InProcessEndpoint::Info() { return node_->Info(); }

StepResult InProcessEndpoint::Step(StepRequest request) {
  if (!node_->batcher().takes_turns()) return node_->Step(request);
  // Turns (InProcessMeshOptions::batch_turns): answered, this session is in
  // transit until its next step queues (the batch counted it, or it marks
  // itself); failed, it re-plans or ends.
  const util::Transit::Carrier carrier;  // this thread takes the session on
  try {
    StepResult result = node_->Step(request);
    util::Transit::Get().Mark();
    return result;
  } catch (...) {
    util::Transit::Get().Clear();
    throw;
  }
}

void InProcessEndpoint::Release(const std::string& session_id, const std::string&,
                                int64_t route_epoch) {
  if (node_->batcher().takes_turns()) util::Transit::Get().Clear();  // no next step comes
  try {
    node_->Release(session_id, route_epoch);
  } catch (const Error&) {
    // Best effort: a malformed key has nothing to release.
  }
}

int64_t InProcessEndpoint::Truncate(const std::string& session_id, const std::string&,
                                    int64_t route_epoch, int64_t length) {
  return node_->manager().Truncate(session_id, route_epoch, length);
}

void InProcessEndpoint::Park(const std::string& session_id, const std::string&,
                             int64_t route_epoch) {
  try {
    node_->manager().Park(session_id, route_epoch);
  } catch (const Error&) {
    // Best effort: a malformed key has nothing to park.
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
  std::shared_ptr<util::RankGate> turns;
  if (options.batch_turns && split.size() > 1 && options.batch.max_batch_sessions > 1) {
    turns = std::make_shared<util::RankGate>(1);
  }
  for (const auto& range : split) {
    no.layers = range;
    nodes_.push_back(std::make_unique<node::Node>(file, no, pool));
    if (turns)
      nodes_.back()->batcher().SetTurnGate(turns, range ? range->first : 0, options.transit_wait_s);
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
