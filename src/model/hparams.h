// LlamaHParams: the hyper-parameters of a Llama-family model, read from a GGUF
// file through the architecture registry (src/arch/architecture.h), which
// names every key.
//
// Contract: FromGguf refuses an architecture the registry does not certify
// (fail closed, Error(kBoundaryContract) from the registry, prefixed with the
// file name), a missing required key and any value that fails validation
// (Error(kMalformedFile) naming the key and the value). Defaults follow
// llama.cpp: n_kv_heads = n_heads, n_rot = head_dim, rope freq base 10000, rms
// epsilon 1e-5, vocab size = the length of tokenizer.ggml.tokens when the
// architecture's vocab_size key is absent.
//
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <string>

#include "arch/architecture.h"
#include "util/error.h"

namespace meshnet::gguf {
class GgufFile;
}

namespace meshnet::model {

struct LlamaHParams {
  const CertifiedArchitecture* arch = nullptr;  // from the registry; never null once valid
  int n_embd = 0;                               // residual width
  int n_layers = 0;                             // transformer blocks
  int n_heads = 0;                              // query heads
  int n_kv_heads = 0;                           // key/value heads (grouped-query attention)
  int n_ff = 0;                                 // feed-forward hidden width
  int head_dim = 0;                             // n_embd / n_heads
  int n_rot = 0;                                // rotary dimensions per head (even, <= head_dim)
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  int64_t context_length = 0;  // trained maximum positions
  int vocab_size = 0;

  int q_dim() const { return n_heads * head_dim; }      // == n_embd
  int kv_dim() const { return n_kv_heads * head_dim; }  // width of K and V rows
  int n_gqa() const { return n_heads / n_kv_heads; }    // query heads per KV head

  // Reads and validates. See the contract above.
  static LlamaHParams FromGguf(const gguf::GgufFile& file);

  // Checks every invariant (all sizes positive, n_embd % n_heads == 0,
  // head_dim == n_embd / n_heads, n_heads % n_kv_heads == 0, n_rot even and
  // in (0, head_dim], finite positive rope base and epsilon, arch set). Throws
  // Error(kind) with a message naming the field.
  void Validate(ErrorKind kind = ErrorKind::kInvalidArgument) const;

  // Throws Error(kInvalidArgument) unless 0 <= start <= end < n_layers
  // (end inclusive, as in the KV recipe).
  void ValidateLayerRange(int start_layer, int end_layer) const;

  // "llama: n_embd=64 n_layers=5 n_heads=8 n_kv_heads=4 ..." for logs.
  std::string ToString() const;
};

}  // namespace meshnet::model
