// Matrix multiplication against GGUF weight matrices:
//   y (n_tokens, rows) = x (n_tokens, cols) * W^T,   W (rows, cols) in any GgmlType.
//
// n_tokens == 1 is the decode matvec (memory-bandwidth bound: each weight row
// is one sequential stream); n_tokens > 1 is prefill, where each weight row is
// decoded once per tile of tokens and reused across it. Rows are split over
// the pool (small products run on the calling thread).
//
// Numerics follow GGML's CPU backend (llama.cpp's `vec_dot_type`), so that
// llama.cpp's greedy output is an exact oracle for every weight type:
// - F32/BF16 weights: float activations, float accumulation.
// - F16 weights: activations rounded to f16 (round to nearest even), float
//   accumulation (rounded once into scratch; with no scratch, per row).
// - Q8_0/Q4_0/Q5_0/IQ4_NL weights: activations as GGML's q8_0 per 32-block
//   (d = max|x|/127, q = round-half-even(x * 127/max|x|), d rounded to f16).
// - Q4_1/Q5_1 weights: q8_1, i.e. q8_0 plus s = f16(d * sum(q)) per block,
//   which stands in for d*sum(q) in the weight offset's term (as in GGML).
// - K-quants (Q2_K..Q6_K) and IQ4_XS: q8_K per 256-block (d = max/-127 for
//   the signed value max of largest magnitude: d = 1/(-127/max), q =
//   min(127, round-half-even(x * -127/max)), d kept as float).
// Each block's integer dot product is exact and scaled in float (on x86 with
// AVX2 the K-quants sum the sub-blocks' scaled integer dots exactly over the
// 256-block first, as GGML does, and Q4_0/Q5_0's code bias -8/-16 enters like
// Q4_1's offset, through the activations' d*sum(q); other targets scale each
// 32-block). Results agree with MatMulReferenceQuantized to float rounding,
// not bit for bit across SIMD targets. Within one target they are batch
// invariant: each output sums in one order fixed by its weight row (its
// address, length and type), so a token's row of y is the same bits whatever
// n_tokens, its place among them, the other tokens, the packed layout's use
// and the pool's thread count.
// QuantizeActivationsReference and MatMulReferenceQuantized define these
// semantics for tests.
//
// Contract: w.cols must be a multiple of the type's block size (gguf/ validates
// shapes); x, y must not overlap; scratch must hold MatMulScratchBytes(...)
// bytes (any alignment). No error paths, no allocation. pool may be null
// (single-threaded).
// Thread-safety: reentrant; concurrent calls need distinct y and scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ops/ggml_type.h"
#include "util/thread_pool.h"

namespace meshnet::ops {

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;  // row r starts at data + r * RowBytes(type, cols)
  int64_t rows = 0;
  int64_t cols = 0;
  // Optional: the first rows / 16 * 16 rows again in the layout of
  // PackWeights (64-byte aligned), which MatMul then reads instead of data
  // for them (the other rows, and targets without a packed kernel, read data).
  const void* packed = nullptr;
};

// Packed weights: every quantized type's rows (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) interleaved 16 at a time so
// that one AVX512-VNNI instruction multiplies 4 columns of 16 rows by a
// token's 4 activations, and each block's scales and convert serve 16 rows at
// once (the layouts are internal: matmul_kernels.h PackedGroupBytes and the
// constants it names; the 4- and 5-bit 32-element formats need rows of a
// multiple of 64 columns).
// Same results as the unpacked kernels up to float summation order (the
// integer sums are the same). 0 when this machine's best kernels have no
// packed layout for the type (other types, CPUs without AVX512-VNNI) or the
// matrix has fewer than 16 rows.
size_t PackedWeightBytes(const WeightMatrix& w);
// Writes PackedWeightBytes(w) bytes to `out` (64-byte aligned).
void PackWeights(const WeightMatrix& w, void* out);

// GGML's vec_dot_type: the format activations are converted to for a weight type.
enum class ActFormat { kF32, kF16, kQ8_0, kQ8_1, kQ8_K };
ActFormat ActFormatFor(GgmlType type);
// True for the types whose kernels quantize activations (the Q*/IQ* types).
bool MatMulQuantizesActivations(GgmlType type);
// Scratch bytes for MatMul with this weight type, token count and row length.
size_t MatMulScratchBytes(GgmlType type, int64_t n_tokens, int64_t cols);

// y: (n_tokens, w.rows) = x: (n_tokens, w.cols) * W^T.
void MatMul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, void* scratch,
            ThreadPool* pool);
// ys[i] = x * ws[i]^T for several matrices of the same input (a layer's Q, K
// and V; gate and up): when they share type, row length and packing, the
// activations are prepared once and the rows of all of them form one
// parallel job (one fork and join instead of one per matrix, and no thread
// idles at the end of a small matrix); otherwise (or more than kMaxMany)
// one MatMul each. Each ys[i] is bit for bit MatMul(*ws[i], x, ...).
// Scratch: MatMulScratchBytes of the first matrix.
inline constexpr int kMaxMany = 4;
void MatMulMany(std::span<const WeightMatrix* const> ws, const float* x, int64_t n_tokens,
                std::span<float* const> ys, void* scratch, ThreadPool* pool);

// llama.cpp parity (ggml_matmul.cc): y = x W^T in the arithmetic of ggml's
// CPU vec_dot for F16, Q8_0 and Q5_1 weights (the types of the Q5_K presets
// of the shipped model), for LlamaShard's ggml_parity mode; scalar. Other
// types: MatMulGgmlSupports is false and MatMul is already close enough.
bool MatMulGgmlSupports(GgmlType type);
void MatMulGgml(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
                ThreadPool* pool);

// --- References (scalar, slow; for tests and benchmarks) ---

// Dequantizes each weight row (bit-exact GGML values) and accumulates in double
// against the float activations.
void MatMulReference(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

// The activation quantization MatMul uses for the Q* types (ActFormatFor(type)
// in kQ8_0, kQ8_1, kQ8_K), for one row of `cols` (a multiple of the format's
// block): q (cols) int8 values as int16; d (cols/32) per-32 scales as used in
// the dot products (for q8_K, each 256-block's scale repeated 8 times); s
// (cols/32) the q8_1 block sums f16(d*sum(q)) (0 for the other formats).
void QuantizeActivationsReference(GgmlType type, const float* x, int64_t cols, int16_t* q, float* d,
                                  float* s);

// Like MatMulReference but with the activations MatMul uses: q*d for the Q*
// types (and q8_1's s in the offset term), f16-rounded for F16 weights.
void MatMulReferenceQuantized(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

}  // namespace meshnet::ops
