// Node: one shard of a model with its KV state, built in one place: the owned
// layers (shard::LlamaShard), a HotKvStateManager for them and the
// KvBoundaryAdapter that runs cached steps through both. `meshnet serve`
// serves one (through node::NodeCore and rpc/), the in-process route of
// mesh/ chains several, tests and benches build them directly.
//
//   auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path));
//   node::Node node(file, {.layers = {{0, 3}}}, &pool);
//   node::StepResult r = node.Step(request);
//
// Thread-safety: Info, Validate, Step and Release may be called concurrently
// (for one session the manager refuses a second concurrent step with
// kSessionBusy); construction and destruction are single-threaded.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "gguf/gguf_reader.h"
#include "kv/hot_kv_state.h"
#include "node/batcher.h"
#include "node/layer_range.h"
#include "node/step.h"
#include "shard/kv_boundary_adapter.h"
#include "shard/llama_shard.h"
#include "util/dtype.h"

namespace meshnet {
class ThreadPool;
}

namespace meshnet::node {

struct NodeOptions {
  std::optional<LayerRange> layers;  // empty: every layer of the model
  KvDtype kv_dtype = KvDtype::kF16;
  // llama.cpp's arithmetic (shard::LlamaShard's ggml_parity); needs kF16.
  bool ggml_parity = false;
  kv::HotKvStateConfig kv_config;
  std::string model_id;  // empty: ModelIdentity(file)
  BatchOptions batch;    // how concurrent steps are batched (node/batcher.h)
};

class Node {
 public:
  // Loads the owned layers of `file`. Throws kInvalidArgument for a layer range
  // the model does not have or an invalid KV configuration. `pool` (may be null:
  // single-threaded) must outlive the node.
  Node(std::shared_ptr<const gguf::GgufFile> file, const NodeOptions& options, ThreadPool* pool);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& model_id() const { return model_id_; }
  const shard::ShardRole& role() const { return adapter_->role(); }
  shard::LlamaShard& shard() { return *shard_; }
  const shard::LlamaShard& shard() const { return *shard_; }
  kv::HotKvStateManager& manager() const { return *manager_; }
  shard::KvBoundaryAdapter& adapter() { return *adapter_; }
  Batcher& batcher() { return *batcher_; }
  const shard::KvBoundaryAdapter& adapter() const { return *adapter_; }

  ShardInfo Info() const;
  // Checks a request against this shard (role, vocabulary, boundary contract,
  // sampling) without touching any state; throws what Step would throw for it.
  // Returns the number of positions the step adds.
  int64_t Validate(const StepRequest& request) const;
  // Runs one step (prefill opens a fresh context first), batched with other
  // sessions' concurrent steps (node/batcher.h); checks, reservation, commit
  // and sampling stay on the calling thread. A CacheMiss is a value. Takes
  // the bundle's residual buffer over.
  StepResult Step(StepRequest& request);
  // Step for several sessions' steps at once (distinct sessions), their rows
  // queued in the batcher together from this thread (Batcher::RunMany):
  // results[i], or errors[i] when step i threw. A step whose KV room is held
  // by the call's own begun steps (pinned) waits for them to run first: they
  // run as one batch, and the rest after them.
  void StepMany(std::span<StepRequest* const> requests,
                std::span<std::optional<StepResult>> results, std::span<std::exception_ptr> errors);
  // Drops the session's state at this epoch; whether it was held. Throws
  // kInvalidArgument for a malformed key.
  bool Release(const std::string& session_id, int64_t route_epoch);

 private:
  // Opens the step's context (prefill) or checks it (decode) and reserves
  // its rows: the step to compute, or a miss.
  shard::BeginResult Begin(StepRequest& request);
  std::string model_id_;
  std::unique_ptr<shard::LlamaShard> shard_;
  std::unique_ptr<kv::HotKvStateManager> manager_;
  std::unique_ptr<shard::KvBoundaryAdapter> adapter_;
  std::unique_ptr<Batcher> batcher_;
};

}  // namespace meshnet::node
