#include "mesh/in_process.h"

#include <charconv>
#include <string>

#include "util/error.h"
#include "util/hash.h"

namespace meshnet::mesh {

namespace {

int ParseLayer(std::string_view s, const std::string& whole) {
  int v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty() || v < 0) {
    ThrowInvalidArgument("invalid layer range '" + whole + "': expected A-B with 0 <= A <= B");
  }
  return v;
}

}  // namespace

LayerRange ParseLayerRange(const std::string& text) {
  const size_t dash = text.find('-');
  if (dash == std::string::npos) {
    ThrowInvalidArgument("invalid layer range '" + text + "': expected A-B, e.g. 0-3");
  }
  const int a = ParseLayer(std::string_view(text).substr(0, dash), text);
  const int b = ParseLayer(std::string_view(text).substr(dash + 1), text);
  if (a > b) ThrowInvalidArgument("invalid layer range '" + text + "': start after end");
  return {a, b};
}

std::vector<LayerRange> ParseSplit(const std::string& text, int total_layers) {
  std::vector<LayerRange> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string part =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    out.push_back(ParseLayerRange(part));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  int next = 0;
  for (const auto& [a, b] : out) {
    if (a != next) {
      ThrowInvalidArgument("invalid split '" + text +
                           "': ranges must be contiguous from layer 0; " +
                           "expected a range starting at " + std::to_string(next) + ", got " +
                           std::to_string(a) + "-" + std::to_string(b));
    }
    next = b + 1;
  }
  if (next != total_layers) {
    ThrowInvalidArgument("invalid split '" + text + "': the model has " +
                         std::to_string(total_layers) + " layers (0-" +
                         std::to_string(total_layers - 1) + "), the split ends at " +
                         std::to_string(next - 1));
  }
  return out;
}

std::vector<LayerRange> EvenSplit(int n_shards, int total_layers) {
  if (n_shards < 1 || n_shards > total_layers) {
    ThrowInvalidArgument("cannot split " + std::to_string(total_layers) + " layers into " +
                         std::to_string(n_shards) + " shards (1.." + std::to_string(total_layers) +
                         ")");
  }
  std::vector<LayerRange> out;
  int start = 0;
  for (int i = 0; i < n_shards; ++i) {
    const int len = total_layers / n_shards + (i < total_layers % n_shards ? 1 : 0);
    out.emplace_back(start, start + len - 1);
    start += len;
  }
  return out;
}

std::string ModelIdentity(const gguf::GgufFile& file) {
  // The header, metadata and tensor table (everything before the tensor data)
  // plus the file size: hashing the weights would page in every layer, which a
  // shard must not do. make-model records its seed in the metadata, so random
  // models of equal shape still differ.
  Sha256 h;
  const auto& t = file.tensors();
  const uint64_t size = file.file_size();
  h.Update(&size, sizeof size);
  for (const auto& e : file.metadata()) {
    h.Update(e.key.data(), e.key.size());
    const std::string v = e.value.ToString(1u << 20);
    h.Update(v.data(), v.size());
  }
  for (const auto& ti : t) {
    h.Update(ti.name.data(), ti.name.size());
    h.Update(&ti.type, sizeof ti.type);
    h.Update(ti.ne.data(), sizeof(int64_t) * ti.ne.size());
    h.Update(&ti.offset, sizeof ti.offset);
  }
  return h.HexDigest();
}

InProcessEndpoint::InProcessEndpoint(shard::KvBoundaryAdapter* adapter, std::string model_id)
    : adapter_(adapter), model_id_(std::move(model_id)) {}

std::string InProcessEndpoint::name() const {
  const auto& r = adapter_->role();
  return "in-process[" + std::to_string(r.start_layer) + "-" + std::to_string(r.end_layer) + "]";
}

ShardInfo InProcessEndpoint::Info() {
  const auto& r = adapter_->role();
  const kv::HotKvStats s = adapter_->manager().Stats();
  ShardInfo info;
  info.model_id = model_id_;
  info.architecture = adapter_->shard().arch().adapter;
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

StepResult InProcessEndpoint::Step(StepRequest request) {
  shard::StepInput input;
  if (!request.token_ids.empty() || !request.bundle) {
    input.token_ids = std::span<const int32_t>(request.token_ids);
  }
  if (request.bundle) input.bundle = &*request.bundle;
  if (request.prefill) {
    return adapter_->Prefill(request.session_id, request.route_epoch, input, request.sampling);
  }
  return adapter_->Decode(request.session_id, request.route_epoch, input, request.expected_seq_len,
                          request.sampling);
}

void InProcessEndpoint::Release(const std::string& session_id, const std::string&,
                                int64_t route_epoch) {
  try {
    adapter_->manager().Release(session_id, route_epoch);
  } catch (const Error&) {
    // Best effort: a malformed key has nothing to release.
  }
}

InProcessMesh::InProcessMesh(std::shared_ptr<const gguf::GgufFile> file,
                             const InProcessMeshOptions& options, ThreadPool* pool) {
  const std::string model_id = ModelIdentity(*file);
  std::vector<LayerRange> split = options.split;
  if (split.empty()) {
    const int total = model::LlamaHParams::FromGguf(*file).n_layers;
    split = {{0, total - 1}};
  }
  for (const auto& [a, b] : split) {
    shards_.push_back(std::make_unique<shard::LlamaShard>(file, a, b, pool));
    managers_.push_back(std::make_unique<kv::HotKvStateManager>(
        shards_.back()->MakeRecipe(options.kv_dtype), options.kv_config));
    adapters_.push_back(
        std::make_unique<shard::KvBoundaryAdapter>(shards_.back().get(), managers_.back().get()));
    endpoints_.push_back(std::make_shared<InProcessEndpoint>(adapters_.back().get(), model_id));
  }
}

InProcessMesh::~InProcessMesh() = default;

Route InProcessMesh::route() const {
  Route r;
  for (const auto& e : endpoints_) r.hops.push_back(e);
  return r;
}

}  // namespace meshnet::mesh
