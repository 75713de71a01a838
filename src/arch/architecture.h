// The architecture registry: the single source of truth for every certified
// model architecture, its boundary contract fields and its GGUF keys and
// tensor names (the shape of llama.cpp's llama-arch tables).
//
// It sits below kv/ because a KV recipe canonicalizes its architecture name
// here (`llama` and `LlamaForCausalLM` are one recipe), and below model/ and
// gguf/ users because they read tensor names from it. Unknown architectures
// are refused: fail closed.
//
// Thread-safety: immutable static data; safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshnet {

inline constexpr int kBoundarySchemaVersion = 1;

// Per-layer tensors of a Llama-family block, in the order they are listed in
// the registry's tensor table.
enum class LayerTensor {
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnNorm,
  kFfnGate,
  kFfnUp,
  kFfnDown,
};
inline constexpr int kNumLayerTensors = 9;

// Hyper-parameter keys, relative to the "<gguf_arch>." prefix.
enum class ArchKey {
  kContextLength,
  kEmbeddingLength,
  kBlockCount,
  kFeedForwardLength,
  kHeadCount,
  kHeadCountKv,
  kRmsEpsilon,
  kRopeFreqBase,
  kRopeDimensionCount,
  kVocabSize,
};

// How RoPE pairs the rotated dimensions (llama.cpp's LLAMA_ROPE_TYPE_NORM /
// LLAMA_ROPE_TYPE_NEOX, fixed per architecture).
enum class RopeStyle {
  kNormal,  // adjacent pairs (x[2i], x[2i+1]): llama, mistral
  kNeox,    // halves (x[i], x[i + n_rot/2]): qwen2
};

struct CertifiedArchitecture {
  std::string adapter;               // canonical name, e.g. "llama"
  std::vector<std::string> aliases;  // e.g. "LlamaForCausalLM"
  std::string gguf_arch;             // general.architecture value / key prefix
  int boundary_schema_version;
  std::string boundary_tensor_name;  // "residual"
  bool prunes_rows_at_tail;
  bool normalizes_before_head;
  RopeStyle rope_style = RopeStyle::kNormal;
  // Q/K/V projections carry biases (blk.N.attn_{q,k,v}.bias): required when
  // true; when false they are loaded if present (llama.cpp treats them as
  // optional for llama).
  bool qkv_bias = false;

  // "<gguf_arch>.<key>", e.g. "llama.attention.head_count_kv".
  std::string Key(ArchKey key) const;
  // "blk.<layer>.attn_q.weight" etc.
  static std::string LayerTensorName(int layer, LayerTensor t);
  // "blk.<layer>.attn_q.bias" etc.
  static std::string LayerBiasName(int layer, LayerTensor t);
  static constexpr const char* kTokenEmbedding = "token_embd.weight";
  static constexpr const char* kOutputNorm = "output_norm.weight";
  static constexpr const char* kOutput = "output.weight";  // absent when tied to token_embd
  // Llama 3 RoPE frequency factors, (n_rot / 2) F32; optional.
  static constexpr const char* kRopeFreqs = "rope_freqs.weight";
};

// Resolves an adapter name or alias. Throws Error(kBoundaryContract) naming the
// certified set when `name` is unknown. The returned reference is stable, so
// two names of one architecture compare equal by address.
const CertifiedArchitecture& CertifiedArchitectureFor(std::string_view name);

// nullptr instead of throwing.
const CertifiedArchitecture* FindCertifiedArchitecture(std::string_view name);

// Every certified architecture, for --help and error messages.
const std::vector<CertifiedArchitecture>& CertifiedArchitectures();

// The GGUF tokenizer keys (architecture independent).
namespace gguf_keys {
inline constexpr const char* kArchitecture = "general.architecture";
inline constexpr const char* kName = "general.name";
inline constexpr const char* kAlignment = "general.alignment";
inline constexpr const char* kFileType = "general.file_type";
inline constexpr const char* kTokenizerModel = "tokenizer.ggml.model";
inline constexpr const char* kTokens = "tokenizer.ggml.tokens";
inline constexpr const char* kScores = "tokenizer.ggml.scores";
inline constexpr const char* kTokenType = "tokenizer.ggml.token_type";
inline constexpr const char* kBosId = "tokenizer.ggml.bos_token_id";
inline constexpr const char* kEosId = "tokenizer.ggml.eos_token_id";
inline constexpr const char* kUnknownId = "tokenizer.ggml.unknown_token_id";
inline constexpr const char* kPaddingId = "tokenizer.ggml.padding_token_id";
inline constexpr const char* kAddBos = "tokenizer.ggml.add_bos_token";
inline constexpr const char* kAddEos = "tokenizer.ggml.add_eos_token";
inline constexpr const char* kAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
inline constexpr const char* kMerges = "tokenizer.ggml.merges";
inline constexpr const char* kPre = "tokenizer.ggml.pre";
inline constexpr const char* kEotId = "tokenizer.ggml.eot_token_id";
inline constexpr const char* kEomId = "tokenizer.ggml.eom_token_id";
inline constexpr const char* kChatTemplate = "tokenizer.chat_template";
}  // namespace gguf_keys

}  // namespace meshnet
