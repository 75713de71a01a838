// Random-weight Llama-family GGUF generator (the library behind
// `meshnet make-model`): given dimensions, a weight type and a tokenizer GGUF,
// writes a model whose tensor names, shapes and hyper-parameter keys come from
// the architecture registry (arch/architecture.h), with every tokenizer.* key
// copied from the tokenizer file.
//
// Architectures with Q/K/V biases (qwen2) get bias vectors N(0, 0.5^2).
//
// Weights: the 2-D matrices (attention, FFN, output and - unless
// embedding_type says otherwise - token_embd) are normal with std
// 1/sqrt(fan_in) (ne0), the residual projections (attn_output, ffn_down)
// further scaled by 1/sqrt(2 * n_layers) so activations stay bounded; norms
// are F32 ones. Generation is deterministic in `seed` (own PRNG, independent
// of the standard library) and streamed one tensor at a time.
//
// Validation throws Error(kInvalidArgument) with a message naming the flag.
// Thread-safety: free functions with no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "ops/ggml_type.h"

namespace meshnet::gguf {

struct MakeModelOptions {
  std::string architecture = "llama";   // any certified architecture name or alias
  std::string name = "meshnet-random";  // general.name
  int64_t n_embd = 768;
  int64_t n_layers = 12;
  int64_t n_heads = 12;
  int64_t n_kv_heads = 12;
  int64_t n_ff = 2048;
  GgmlType type = GgmlType::kQ8_0;  // 2-D weight matrices
  // When non-empty: the 2-D matrices (token_embd included unless
  // embedding_type is set) cycle through these types in file order, so one
  // model mixes them (`--type q4_k,q5_0,...`); `type` is then mix_types[0].
  std::vector<GgmlType> mix_types;
  std::optional<GgmlType> embedding_type;  // token_embd; default: `type`
  uint64_t seed = 1;
  int64_t context = 512;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  // rope_freqs.weight with Llama 3.1's factors (factor 8, low/high frequency
  // factors 1/4, original context 8192), as convert_hf_to_gguf computes them.
  bool rope_freqs = false;
  bool tie_output = false;  // no output.weight: the LM head is token_embd
};

// Llama 3.1's RoPE frequency factors for `n_rot` rotated dims and `base`
// (n_rot / 2 values, each in [1, 8]).
std::vector<float> Llama3RopeFactors(int64_t n_rot, float base);

struct MakeModelSummary {
  int64_t vocab_size = 0;
  int64_t n_params = 0;  // elements over all tensors
  int64_t n_tensors = 0;
  uint64_t file_bytes = 0;  // only set by MakeModel (0 for BuildModel)
};

// Throws Error(kInvalidArgument) for inconsistent options: non-positive or
// absurd sizes, n_embd % n_heads, n_heads % n_kv_heads, odd head_dim, n_embd
// or n_ff not a multiple of a weight type's block size (each of mix_types), bad rope/eps/context.
void ValidateMakeModelOptions(const MakeModelOptions& o);

// Adds every key and tensor of the model to `w` (the tensor data is produced
// when `w` writes). `tokenizer` must hold tokenizer.ggml.tokens; it need only
// outlive this call.
MakeModelSummary BuildModel(const MakeModelOptions& o, const GgufFile& tokenizer, GgufWriter* w);

// Opens `tokenizer_path`, builds the model and writes it to `out_path`.
MakeModelSummary MakeModel(const MakeModelOptions& o, const std::string& tokenizer_path,
                           const std::string& out_path);

}  // namespace meshnet::gguf
