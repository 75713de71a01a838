// Internal: per-target SIMD kernels behind ops/matmul.h (dynamic dispatch over
// the Highway targets compiled into matmul_kernels.cc). Not a public API.
//
// Thread-safety: pure functions over disjoint outputs.
#pragma once

#include <cstdint>

#include "ops/matmul.h"

namespace meshnet::ops::internal {

// Activations quantized per 32-block (see matmul.h). Token t's values are
// q[t*cols ...], its block scales d[t*(cols/32) ...] and dxs = d * sum(q) per block.
struct QuantActs {
  const int16_t* q = nullptr;
  const float* d = nullptr;
  const float* dxs = nullptr;
  int64_t cols = 0;
};

// Quantizes tokens [t_begin, t_end) of x (n, cols) into the QuantActs arrays.
void QuantizeActs(const float* x, int64_t cols, int64_t t_begin, int64_t t_end, int16_t* q,
                  float* d, float* dxs);

// y[t * w.rows + r] for r in [row_begin, row_end), t in [0, n_tokens).
void MatMulQuantRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                     const QuantActs& acts, int64_t n_tokens, float* y);
void MatMulFloatRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t n_tokens, float* y);

}  // namespace meshnet::ops::internal
