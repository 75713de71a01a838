// Internal: dispatched SIMD kernels behind ops/nn.h. Not a public API.
//
// Thread-safety: pure functions over disjoint outputs.
#pragma once

#include <cstdint>

#include "ops/paged_kv.h"
#include "util/dtype.h"

namespace meshnet::ops::internal {

float SumKernel(const float* x, int64_t n);
void AddKernel(const float* a, const float* b, int64_t n, float* out);
void RmsNormKernel(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps,
                   float* out);
void SoftmaxKernel(float* x, int64_t n);
void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out);
void StoreKvRowKernel(uint8_t* dst, KvDtype dtype, const float* row, int64_t n);

struct AttentionArgs {
  const float* q = nullptr;  // (n_tokens, n_heads * head_dim)
  int64_t n_tokens = 0;      // rows of q (ggml_f16 follows llama.cpp's batched path for >= 2)
  int64_t start_pos = 0;
  const PagedKvLayer* kv = nullptr;
  int n_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  float* out = nullptr;  // (n_tokens, n_heads * head_dim)
};
// Items [begin, end) of (token, KV head): item = t * kv->n_kv_heads + g.
void AttentionItems(const AttentionArgs& a, int64_t begin, int64_t end);
// The same items with llama.cpp's default (non-flash) CPU attention
// arithmetic over an F16 cache (attention_ggml.cc); requires kv->dtype == kF16.
void AttentionItemsGgmlF16(const AttentionArgs& a, int64_t begin, int64_t end);
// Pieces of it, exposed for tests: ggml_vec_dot_f16's x86 AVX2 arithmetic on
// n halves, llamafile tinyBLAS's (n % 8 == 0), and ggml_v_expf on one lane.
float GgmlDotF16(const uint16_t* x, const uint16_t* y, int n);
float TinyBlasDotF16(const uint16_t* x, const uint16_t* y, int n);
float GgmlExpf(float x);

}  // namespace meshnet::ops::internal
