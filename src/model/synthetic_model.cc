#include "model/synthetic_model.h"

#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "model/tokenizer.h"
#include "ops/quantize.h"

namespace meshnet::model {

namespace {

// SplitMix64: a cheap, well-mixed deterministic stream.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t NameSeed(const std::string& name, uint32_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return Mix(h);
}

// Fills one row of `n` floats: norms near 1, matrices in [-scale, scale).
void FillRow(uint64_t seed, int64_t row, bool is_norm, float scale, float* out, int64_t n) {
  uint64_t s = Mix(seed + static_cast<uint64_t>(row) * 0x632BE59BD9B4E019ull);
  for (int64_t i = 0; i < n; ++i) {
    s = Mix(s);
    const float u = static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    out[i] = is_norm ? 1.0f + 0.1f * u : scale * u;
  }
}

// The hyper-parameter keys (spelled by the registry, also for an uncertified
// architecture: negative tests), minus spec.omit_keys.
void WriteHParams(const SyntheticLlamaSpec& spec, gguf::GgufWriter& w) {
  CertifiedArchitecture arch;
  arch.gguf_arch = spec.architecture;
  auto set_u32 = [&](const std::string& key, int64_t v) {
    if (!spec.omit_keys.contains(key)) w.SetU32(key, static_cast<uint32_t>(v));
  };
  auto set_f32 = [&](const std::string& key, float v) {
    if (!spec.omit_keys.contains(key)) w.SetF32(key, v);
  };
  if (!spec.omit_keys.contains(gguf_keys::kArchitecture)) {
    w.SetString(gguf_keys::kArchitecture, spec.architecture);
  }
  w.SetString(gguf_keys::kName, "synthetic");
  set_u32(arch.Key(ArchKey::kContextLength), spec.context_length);
  set_u32(arch.Key(ArchKey::kEmbeddingLength), spec.n_embd);
  set_u32(arch.Key(ArchKey::kBlockCount), spec.n_layers);
  set_u32(arch.Key(ArchKey::kFeedForwardLength), spec.n_ff);
  set_u32(arch.Key(ArchKey::kHeadCount), spec.n_heads);
  set_u32(arch.Key(ArchKey::kHeadCountKv), spec.n_kv_heads);
  set_f32(arch.Key(ArchKey::kRmsEpsilon), spec.rms_eps);
  if (spec.n_rot != 0) set_u32(arch.Key(ArchKey::kRopeDimensionCount), spec.n_rot);
  if (spec.rope_freq_base != 0) set_f32(arch.Key(ArchKey::kRopeFreqBase), spec.rope_freq_base);
}

// A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens when
// they fit, then words; minus spec.omit_keys.
void WriteTokenizer(const SyntheticLlamaSpec& spec, gguf::GgufWriter& w) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {static_cast<int32_t>(TokenType::kUnknown),
                                static_cast<int32_t>(TokenType::kControl),
                                static_cast<int32_t>(TokenType::kControl)};
  if (spec.vocab_size >= 3 + 256) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      tokens.push_back(name);
      types.push_back(static_cast<int32_t>(TokenType::kByte));
    }
  }
  for (int i = 0; static_cast<int>(tokens.size()) < spec.vocab_size; ++i) {
    tokens.push_back("\xE2\x96\x81w" + std::to_string(i));
    types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  tokens.resize(static_cast<size_t>(std::max(spec.vocab_size, 0)));
  types.resize(tokens.size());
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  auto keep = [&](const std::string& key) { return !spec.omit_keys.contains(key); };
  if (keep(gguf_keys::kTokenizerModel)) w.SetString(gguf_keys::kTokenizerModel, "llama");
  if (keep(gguf_keys::kTokens)) {
    w.Set(gguf_keys::kTokens, gguf::WriterValue::StringArray(std::span<const std::string>(tokens)));
  }
  if (keep(gguf_keys::kScores)) w.Set(gguf_keys::kScores, gguf::WriterValue::F32Array(scores));
  if (keep(gguf_keys::kTokenType)) {
    w.Set(gguf_keys::kTokenType, gguf::WriterValue::I32Array(types));
  }
  for (auto [key, id] : {std::pair{gguf_keys::kBosId, 1}, std::pair{gguf_keys::kEosId, 2},
                         std::pair{gguf_keys::kUnknownId, 0}}) {
    if (keep(key)) w.SetU32(key, static_cast<uint32_t>(id));
  }
}

// One tensor of deterministic values (spec.seed and its name), with the
// spec's omissions and dims/type overrides applied.
void AddTensor(const SyntheticLlamaSpec& spec, gguf::GgufWriter& w, const std::string& name,
               std::vector<int64_t> dims, bool is_norm) {
  if (spec.omit_tensors.contains(name)) return;
  if (auto it = spec.dims_override.find(name); it != spec.dims_override.end()) dims = it->second;
  GgmlType type = is_norm ? GgmlType::kF32 : spec.weight_type;
  if (auto it = spec.type_override.find(name); it != spec.type_override.end()) type = it->second;
  const uint64_t seed = NameSeed(name, spec.seed);
  const int64_t row_len = dims[0];
  const float scale = 1.0f / static_cast<float>(row_len);
  w.AddTensor(name, type, dims, [=](std::span<uint8_t> dst) {
    const int64_t row_bytes = ops::RowBytes(type, row_len);
    const int64_t rows = static_cast<int64_t>(dst.size()) / row_bytes;
    std::vector<float> row(static_cast<size_t>(row_len));
    for (int64_t r = 0; r < rows; ++r) {
      FillRow(seed, r, is_norm, scale, row.data(), row_len);
      ops::QuantizeRow(type, row.data(), row_len, dst.data() + r * row_bytes);
    }
  });
}

}  // namespace

gguf::GgufWriter SyntheticLlamaWriter(const SyntheticLlamaSpec& spec) {
  gguf::GgufWriter w;
  WriteHParams(spec, w);
  if (spec.with_tokenizer) WriteTokenizer(spec, w);
  auto add = [&](const std::string& name, std::vector<int64_t> dims, bool is_norm) {
    AddTensor(spec, w, name, std::move(dims), is_norm);
  };
  const int64_t n_embd = spec.n_embd;
  const int64_t head_dim = spec.n_heads > 0 ? spec.n_embd / spec.n_heads : 0;
  const int64_t kv_dim = head_dim * spec.n_kv_heads;
  add(CertifiedArchitecture::kTokenEmbedding, {n_embd, spec.vocab_size}, false);
  add(CertifiedArchitecture::kOutputNorm, {n_embd}, true);
  if (!spec.tie_output) add(CertifiedArchitecture::kOutput, {n_embd, spec.vocab_size}, false);
  for (int l = 0; l < spec.n_layers; ++l) {
    auto name = [l](LayerTensor t) { return CertifiedArchitecture::LayerTensorName(l, t); };
    add(name(LayerTensor::kAttnNorm), {n_embd}, true);
    add(name(LayerTensor::kAttnQ), {n_embd, n_embd}, false);
    add(name(LayerTensor::kAttnK), {n_embd, kv_dim}, false);
    add(name(LayerTensor::kAttnV), {n_embd, kv_dim}, false);
    add(name(LayerTensor::kAttnOutput), {n_embd, n_embd}, false);
    add(name(LayerTensor::kFfnNorm), {n_embd}, true);
    add(name(LayerTensor::kFfnGate), {n_embd, spec.n_ff}, false);
    add(name(LayerTensor::kFfnUp), {n_embd, spec.n_ff}, false);
    add(name(LayerTensor::kFfnDown), {spec.n_ff, n_embd}, false);
  }
  return w;
}

}  // namespace meshnet::model
