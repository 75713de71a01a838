// Matrix multiplication against GGUF weight matrices:
//   y (n_tokens, rows) = x (n_tokens, cols) * W^T,   W (rows, cols) in any GgmlType.
//
// n_tokens == 1 is the decode matvec (memory-bandwidth bound: each weight row
// is one sequential stream); n_tokens > 1 is prefill, where each weight row is
// decoded once per tile of tokens and reused across it. Rows are split over
// the pool (small products run on the calling thread).
//
// Numerics:
// - F32/F16/BF16 weights: float activations, float accumulation.
// - Q8_0/Q4_0/Q4_K/Q6_K weights: activations are first quantized per 32-element
//   block to int8 values (d = max|x|/127, q = round-half-even(x/d), d kept as
//   float, like llama.cpp's q8_0 but without rounding d to f16); each block's
//   integer dot product is exact and scaled in float. QuantizeActivationsReference
//   and MatMulReferenceQuantized define these semantics for tests.
//
// Contract: w.cols must be a multiple of the type's block size (gguf/ validates
// shapes); x, y must not overlap; scratch must hold MatMulScratchBytes(...)
// bytes (any alignment). No error paths, no allocation. pool may be null
// (single-threaded).
// Thread-safety: reentrant; concurrent calls need distinct y and scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/ggml_type.h"
#include "util/thread_pool.h"

namespace meshnet::ops {

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;  // row r starts at data + r * RowBytes(type, cols)
  int64_t rows = 0;
  int64_t cols = 0;
};

// True for the types whose kernels quantize activations (the Q* types).
bool MatMulQuantizesActivations(GgmlType type);
// Scratch bytes for MatMul with this weight type, token count and row length.
size_t MatMulScratchBytes(GgmlType type, int64_t n_tokens, int64_t cols);

// y: (n_tokens, w.rows) = x: (n_tokens, w.cols) * W^T.
void MatMul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, void* scratch,
            ThreadPool* pool);

// --- References (scalar, slow; for tests and benchmarks) ---

// Dequantizes each weight row (bit-exact GGML values) and accumulates in double
// against the float activations.
void MatMulReference(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

// The activation quantization MatMul uses for Q* types, for one row of `cols`
// (a multiple of 32): q (cols) int8 values as int16, d (cols/32) block scales.
void QuantizeActivationsReference(const float* x, int64_t cols, int16_t* q, float* d);

// Like MatMulReference but against the dequantized activations q*d that
// MatMul uses for Q* types (equals MatMulReference for float types).
void MatMulReferenceQuantized(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

}  // namespace meshnet::ops
