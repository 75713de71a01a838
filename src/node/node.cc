#include "node/node.h"

#include <span>
#include <utility>

#include "model/hparams.h"
#include "node/identity.h"
#include "util/error.h"

namespace meshnet::node {

namespace {

// The token ids a request carries, as the adapter takes them: set unless the
// request carries only a bundle.
std::optional<std::span<const int32_t>> TokensOf(const StepRequest& request) {
  if (request.token_ids.empty() && request.bundle) return std::nullopt;
  return std::span<const int32_t>(request.token_ids);
}

}  // namespace

Node::Node(std::shared_ptr<const gguf::GgufFile> file, const NodeOptions& options, ThreadPool* pool)
    : model_id_(options.model_id.empty() ? ModelIdentity(*file) : options.model_id) {
  const model::LlamaHParams hp = model::LlamaHParams::FromGguf(*file);
  const LayerRange range = options.layers.value_or(LayerRange{0, hp.n_layers - 1});
  hp.ValidateLayerRange(range.first, range.second);
  options.kv_config.Validate();
  if (options.ggml_parity && options.kv_dtype != KvDtype::kF16) {
    ThrowInvalidArgument("llama.cpp-parity arithmetic (--attention ggml) needs an F16 KV cache");
  }
  shard_ = std::make_unique<shard::LlamaShard>(std::move(file), range.first, range.second, pool,
                                               options.ggml_parity);
  manager_ = std::make_unique<kv::HotKvStateManager>(shard_->MakeRecipe(options.kv_dtype),
                                                     options.kv_config);
  adapter_ = std::make_unique<shard::KvBoundaryAdapter>(shard_.get(), manager_.get());
  batcher_ = std::make_unique<Batcher>(shard_.get(), options.batch);
}

Node::~Node() = default;

ShardInfo Node::Info() const {
  const auto& r = adapter_->role();
  const kv::HotKvStats s = manager_->Stats();
  ShardInfo info;
  info.model_id = model_id_;
  info.architecture = shard_->arch().adapter;
  info.start_layer = r.start_layer;
  info.end_layer = r.end_layer;
  info.total_layers = r.total_layers;
  info.recipe_fingerprint = adapter_->recipe().Fingerprint();
  info.kv_budget_bytes = s.bytes_budget;
  info.kv_bytes_free = s.bytes_budget - s.bytes_reserved;
  info.kv_tokens_free = info.kv_bytes_free / adapter_->recipe().BytesPerToken();
  info.live_sessions = s.live_sessions;
  info.version = MESHNET_VERSION_STRING;
  return info;
}

int64_t Node::Validate(const StepRequest& request) const {
  return adapter_->Validate(TokensOf(request), request.bundle ? &*request.bundle : nullptr,
                            request.prefill ? 0 : request.expected_seq_len, request.sampling);
}

StepResult Node::Step(StepRequest& request) {
  shard::StepInput input;
  input.token_ids = TokensOf(request);
  if (request.bundle) input.bundle = &*request.bundle;
  shard::BeginResult begun =
      request.prefill
          ? adapter_->BeginPrefill(request.session_id, request.route_epoch, input, request.sampling)
          : adapter_->BeginDecode(request.session_id, request.route_epoch, input,
                                  request.expected_seq_len, request.sampling);
  if (auto* miss = std::get_if<kv::CacheMiss>(&begun)) return std::move(*miss);
  shard::PendingStep& pending = std::get<shard::PendingStep>(begun);
  batcher_->Run(&pending, request.session_id);
  return adapter_->Finish(pending);
}

bool Node::Release(const std::string& session_id, int64_t route_epoch) {
  return manager_->Release(session_id, route_epoch);
}

}  // namespace meshnet::node
