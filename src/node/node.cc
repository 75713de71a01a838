#include "node/node.h"

#include <algorithm>
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
    // Parity reproduces llama.cpp's default (non-flash) CPU attention, which
    // has no quantized-V path (llama.cpp runs a q8_0 V only with -fa).
    ThrowInvalidArgument(
        "llama.cpp-parity arithmetic (--ggml-parity) needs an F16 KV cache "
        "(--kv-dtype f16), not " +
        std::string(KvDtypeName(options.kv_dtype)));
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

shard::BeginResult Node::Begin(StepRequest& request) {
  shard::StepInput input;
  input.token_ids = TokensOf(request);
  if (request.bundle) input.bundle = &*request.bundle;
  input.rewind = request.rewind;
  input.verify = request.verify;
  shard::BeginResult begun =
      request.prefill
          ? adapter_->BeginPrefill(request.session_id, request.route_epoch, input, request.sampling)
          : adapter_->BeginDecode(request.session_id, request.route_epoch, input,
                                  request.expected_seq_len, request.sampling);
  if (auto* p = std::get_if<shard::PendingStep>(&begun)) {
    p->route_hops = std::clamp(request.route_hops, 0, kMaxRouteHops);
  }
  return begun;
}

StepResult Node::Step(StepRequest& request) {
  shard::BeginResult begun = Begin(request);
  if (auto* miss = std::get_if<kv::CacheMiss>(&begun)) return std::move(*miss);
  shard::PendingStep& pending = std::get<shard::PendingStep>(begun);
  batcher_->Run(&pending, request.session_id);
  return adapter_->Finish(pending);
}

void Node::StepMany(std::span<StepRequest* const> requests,
                    std::span<std::optional<StepResult>> results,
                    std::span<std::exception_ptr> errors) {
  const size_t n = requests.size();
  std::vector<std::optional<shard::BeginResult>> begun(n);
  std::vector<shard::PendingStep*> pending;
  std::vector<std::string_view> ids;
  std::vector<size_t> at;  // pending[k] is step at[k]
  pending.reserve(n);
  ids.reserve(n);
  at.reserve(n);
  // Computes the steps begun so far, which releases their pins.
  auto run = [&] {
    std::vector<std::exception_ptr> ran(pending.size());
    if (!pending.empty()) batcher_->RunMany(pending, ids, ran);
    for (size_t k = 0; k < pending.size(); ++k) {
      const size_t i = at[k];
      if (ran[k]) {
        errors[i] = ran[k];
        continue;
      }
      try {
        results[i] = adapter_->Finish(*pending[k]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
    pending.clear();
    ids.clear();
    at.clear();
  };
  for (size_t i = 0; i < n; ++i) {
    try {
      StepRequest& r = *requests[i];
      try {
        // Room pinned by this call's own begun steps frees only once they
        // run: not waited for while they wait here.
        std::optional<kv::ScopedNoPinnedWait> no_wait;
        if (!pending.empty()) no_wait.emplace();
        begun[i].emplace(Begin(r));
      } catch (const kv::PinnedRoomError&) {
        run();
        begun[i].emplace(Begin(r));  // may wait for other calls' pins, as Step would
      }
      if (auto* miss = std::get_if<kv::CacheMiss>(&*begun[i])) {
        results[i] = std::move(*miss);
        continue;
      }
      pending.push_back(&std::get<shard::PendingStep>(*begun[i]));
      ids.push_back(r.session_id);
      at.push_back(i);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  run();
}

bool Node::Release(const std::string& session_id, int64_t route_epoch) {
  return manager_->Release(session_id, route_epoch);
}

}  // namespace meshnet::node
