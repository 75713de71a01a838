// Transformer building blocks for Llama-family models: RMS norm, RoPE,
// softmax, SwiGLU, add, embedding lookup, KV row store and grouped-query causal
// attention over a paged KV layer (ops/paged_kv.h). Each has a scalar
// reference (nn_reference.cc) that the SIMD kernels are tested against.
//
// Contract: shapes are the caller's responsibility (model/ and shard/ validate
// hyper-parameters once); kernels have no error paths and never allocate.
// Unless stated, out may alias the first input (in place).
// The one exception is EmbeddingLookup, which validates token ids (they come
// from clients) and throws meshnet::Error(kInvalidArgument).
// Thread-safety: reentrant; concurrent calls need distinct outputs. Functions
// taking a ThreadPool* split work over it (null = calling thread only).
#pragma once

#include <cstdint>

#include "ops/matmul.h"
#include "ops/paged_kv.h"
#include "util/thread_pool.h"

namespace meshnet::ops {

// out (n_rows, dim) = x * weight / sqrt(mean(x^2) + eps), per row.
void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out);

struct RopeConfig {
  int rope_dims = 0;          // leading dims of each head that rotate (<= head_dim, even)
  float freq_base = 10000.f;  // theta_i = pos * freq_scale * freq_base^(-2i/rope_dims) / f_i
  float freq_scale = 1.0f;    // linear position scaling (1 = none)
  // NeoX rotation (Qwen2, GPT-NeoX): pairs (x[i], x[i + rope_dims/2]) instead
  // of adjacent (x[2i], x[2i+1]) (Llama's "normal" GGUF layout).
  bool neox = false;
  // Llama 3 frequency factors f_i (rope_freqs.weight, rope_dims/2 values) that
  // divide each angle; nullptr = all 1.
  const float* freq_factors = nullptr;
};
// RoPE in place, llama.cpp's ggml_rope_ext without YaRN, in two halves so
// that a forward pass computes its rows' angles once for every layer.
// RopeAngles writes the cos and sin of each token's angles, cs and sn
// (n_tokens, rope_dims / 2) each; token t is at position start_pos + t, and
// pair i's angle theta_i is computed in double. RopeRotate rotates x
// (n_tokens, n_heads, head_dim) by them: pair i (adjacent, or NeoX halves),
// 2i < rope_dims, by theta_i.
void RopeAngles(const RopeConfig& cfg, int64_t start_pos, int64_t n_tokens, float* cs, float* sn);
void RopeRotate(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
                const float* cs, const float* sn);

// Numerically stable softmax of x (n), in place.
void Softmax(float* x, int64_t n);
// out (n) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);
// out (n) = a + b.
void Add(const float* a, const float* b, int64_t n, float* out);
// Sum of x (n) (used for bandwidth probes and tests).
float Sum(const float* x, int64_t n);

// out (n_tokens, table.cols) = rows tokens[t] of the embedding table (any type),
// dequantized. Throws Error(kInvalidArgument) on a token id outside [0, rows).
void EmbeddingLookup(const WeightMatrix& table, const int32_t* tokens, int64_t n_tokens,
                     float* out);

// Writes row (n_kv_heads * head_dim floats) as the K (key=true) or V row of
// position pos, converted to kv.dtype (round to nearest even; q8_0 / q4_0
// quantized head by head as ops/kv_quant.h states).
void StoreKvRow(const PagedKvLayer& kv, bool key, int64_t pos, const float* row);

// ---- llama.cpp parity (ggml_parity.cc): the same ops in the arithmetic of
// llama.cpp's CPU backend (x86 AVX2 build, c392e50), for checking meshnet
// against llama.cpp's greedy text bit for bit. Slower (scalar); opt-in.
// RmsNorm: squares summed in double, scale 1.0f / sqrtf(float mean + eps).
void RmsNormGgml(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
                 float* out);
// Rope: angles pos * base^(-2i/dims) built by f32 products, cosf/sinf, fused
// rotation.
void RopeGgml(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
              int64_t start_pos);
// out (n_rows, dim) = silu(gate) * up, silu by ggml's vectorized expf on
// groups of 8 of each row and libm's expf on the rest.
void SwiGluGgml(const float* gate, const float* up, int64_t n_rows, int64_t dim, float* out);

struct AttentionConfig {
  int n_heads = 0;     // query heads; a multiple of kv.n_kv_heads
  int head_dim = 0;    // == kv.head_dim, <= kMaxHeadDim
  float scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  // llama.cpp parity for an F16 KV cache (requires kv.dtype == kF16):
  // reproduce the arithmetic of llama.cpp's default CPU attention (no flash
  // attention) exactly: Q rounded to f16, ggml's f16 dot products (lane
  // orders of ggml_vec_dot_f16, or of llamafile's sgemm for steps of >= 2
  // tokens), ggml's vectorized expf, probabilities rounded to f16 before the
  // product with V (see attention_ggml.cc), and a default scale of
  // 1.0f / sqrtf(head_dim) in float. Off: the f32-accumulating kernel.
  bool ggml_f16 = false;
};
inline constexpr int kMaxHeadDim = 512;

// Grouped-query causal attention: query t (position start_pos + t) attends to
// positions [0, start_pos + t] of kv (which must already hold them:
// kv.n_positions >= start_pos + n_tokens). Query head h uses KV head
// h / (n_heads / n_kv_heads). Over a q8_0 / q4_0 cache the kernel is fused:
// each query head is quantized once per call to int8-range codes with one
// scale per 32-block (the keys' blocks), Q.K is an exact integer dot per
// block times the two scales, softmax and the V sums (the codes times
// probability x block scale) are f32. A head's result depends only on its
// query and kv, never on the other sequences, tokens or heads of a call nor
// on the pool's threads.
// q: (n_tokens, n_heads * head_dim) -> out: (n_tokens, n_heads * head_dim); out
// must not alias q. Parallel over (token, KV head) on the pool.
void Attention(const float* q, int64_t n_tokens, int64_t start_pos, const PagedKvLayer& kv,
               const AttentionConfig& cfg, float* out, ThreadPool* pool);

// One sequence of a batched attention: Attention's arguments for one session.
struct AttentionSeq {
  const float* q = nullptr;
  int64_t n_tokens = 0;
  int64_t start_pos = 0;
  const PagedKvLayer* kv = nullptr;
  float* out = nullptr;
};
// Attention of every sequence (each against its own KV), as one parallel job
// over all their (token, KV head) items: the same results as one Attention
// call per sequence, with one pool wake-up instead of one per sequence.
void AttentionBatch(const AttentionSeq* seqs, int64_t n_seqs, const AttentionConfig& cfg,
                    ThreadPool* pool);

// ---- Scalar references (double accumulation; for tests) ----
void RmsNormReference(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
                      float* out);
void RopeReference(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
                   int64_t start_pos);
void SoftmaxReference(float* x, int64_t n);
void SwiGluReference(const float* gate, const float* up, int64_t n, float* out);
void AttentionReference(const float* q, int64_t n_tokens, int64_t start_pos, const PagedKvLayer& kv,
                        const AttentionConfig& cfg, float* out);

}  // namespace meshnet::ops
