// Internal: per-target SIMD kernels behind ops/matmul.h (dynamic dispatch over
// the Highway targets compiled into matmul_kernels.cc). Not a public API.
//
// Thread-safety: pure functions over disjoint outputs.
#pragma once

#include <cstdint>

#include "ops/matmul.h"

namespace meshnet::ops::internal {

// Activations quantized per 32-block (see matmul.h). Token t's values are
// q[t*cols ...], its per-32-block scales d[t*(cols/32) ...] (q8_K: the
// 256-block's scale repeated), dxs[t*(cols/32) ...] the per-32-block
// d*sum(q) (q8_1: GGML's f16 s) and dxs16[t*(cols/16) ...] the per-16-block
// d*sum(q) (q8_K only; Q2_K's mins). q8 holds the same values as q in int8
// (the x86 int8 kernels read it).
struct QuantActs {
  int16_t* q = nullptr;
  int8_t* q8 = nullptr;
  uint8_t* u8 = nullptr;  // q8 + 128 as bytes (for packed weights; else null)
  float* d = nullptr;
  float* dxs = nullptr;
  float* dxs16 = nullptr;
  int64_t cols = 0;
};

// Quantizes tokens [t_begin, t_end) of x (n, a.cols) into a's arrays in `fmt`
// (kQ8_0, kQ8_1 or kQ8_K).
void QuantizeActs(ActFormat fmt, const float* x, int64_t t_begin, int64_t t_end,
                  const QuantActs& a);

// y[t * w.rows + r] for r in [row_begin, row_end), t in [0, n_tokens).
void MatMulQuantRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                     const QuantActs& acts, int64_t n_tokens, float* y);
// round_acts: F16 weights whose activations x are not yet rounded to f16.
void MatMulFloatRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t n_tokens, float* y, bool round_acts);
// Packed weights (matmul.h): the row groups [g_begin, g_end) of 16 rows of
// w.packed (acts.u8 set); targets without a packed kernel take w.data's rows.
void MatMulPackedRows(const WeightMatrix& w, int64_t g_begin, int64_t g_end, const QuantActs& acts,
                      int64_t n_tokens, float* y);
// True when the best target here has a packed kernel for `type`.
bool PackedSupported(GgmlType type);
// The bytes of one packed 32-column block of 16 Q8_0 rows: 8 chunks of 64
// code bytes (lane i: row i's codes 4c..4c+3), the 16 f16 scales, the 16
// int16 code sums.
inline constexpr int64_t kPackedQ8Block = 8 * 64 + 32 + 32;
// The bytes of one packed 256-column super-block of 16 Q4_K rows: per 32-block
// j, 4 vectors of 64 bytes (lane i: row i's codes of columns 8c..8c+3 in the
// low nibbles, 8c+4..8c+7 in the high ones); then the 16 rows' 6-bit scales of
// the 8 blocks (16 bytes per block), their mins the same, the 16 f16 d, the
// 16 f16 dmin.
inline constexpr int64_t kPackedQ4KBlock = 8 * 256 + 128 + 128 + 32 + 32;
// Q5_K: Q4_K's layout with, after each 32-block's 4 code vectors, a vector
// of its fifth bits (lane i, byte m, bit k: row i's column 4k + m): 2,880
// bytes per 16 rows (2,816 in GGUF).
inline constexpr int64_t kPackedQ5KBlock = 8 * 320 + 128 + 128 + 32 + 32;
// IQ4_XS: the nibbles as Q4_K's, then the 16 rows' int8 scales ls - 32 of the
// 8 blocks (16 bytes per block), the 16 f16 d, and 32 bytes of padding for
// 64-byte alignment (2,240 bytes per 16 rows; 2,176 in GGUF).
inline constexpr int64_t kPackedIQ4XSBlock = 8 * 256 + 128 + 32 + 32;
// Q2_K and Q3_K: per 16-column sub-block k a vector of the codes' low 2 bits
// (lane i, byte m, bits 2c..2c+1: row i's column 4c + m of the sub-block);
// Q3_K: then per 32-block a vector of the third bits (as Q5_K's fifth); then
// the 16 rows' scale bytes per sub-block (Q2_K: GGUF's, scale | min << 4;
// Q3_K: int8 scale - 32), the 16 f16 d, and Q2_K's 16 f16 dmin or Q3_K's 32
// bytes of padding: 1,344 bytes per 16 rows x 256 columns for Q2_K (as in
// GGUF), 1,856 for Q3_K (1,760 in GGUF).
inline constexpr int64_t kPackedQ2KBlock = 1024 + 256 + 32 + 32;
inline constexpr int64_t kPackedQ3KBlock = 1024 + 512 + 256 + 32 + 32;
// The bytes of one packed 256-column super-block of 16 Q6_K rows: per 32-block
// j, 4 vectors of 64 bytes of the codes' low nibbles (as Q4_K's) and 2 of
// their top 2 bits (lane i: row i; vector u holds chunks 4u..4u+3, chunk
// 4u+k's bits at bit 2k of each byte); then the 16 rows' int8 scales of the
// 16 sub-blocks (16 bytes per sub-block), the 16 f16 d, and 32 bytes of
// padding that keep every block 64-byte aligned (3,392 bytes; 3,360 in GGUF).
inline constexpr int64_t kPackedQ6KBlock = 8 * 384 + 256 + 32 + 32;
// The bytes of one packed 64-column unit (two 32-blocks) of 16 rows of Q4_0,
// Q4_1, Q5_0, Q5_1 or IQ4_NL (0 for other types): the same bytes as the GGUF
// blocks, rearranged so that every unit starts 64-byte aligned:
//  * 8 vectors of 64 code bytes, vector 4k + c for block k (lane i: row i's
//    codes of columns 8c..8c+3 in the low nibbles, 8c+4..8c+7 in the high);
//  * Q5_0/Q5_1: per block a vector of the fifth bits (lane i, byte m, bit j:
//    row i's column 4j + m);
//  * per block the 16 rows' f16 d; Q4_1/Q5_1: then per block their f16 m.
constexpr int64_t PackedB32UnitBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kIQ4_NL:
      return 512 + 64;
    case GgmlType::kQ5_0:
      return 512 + 128 + 64;
    case GgmlType::kQ4_1:
      return 512 + 64 + 64;
    case GgmlType::kQ5_1:
      return 512 + 128 + 64 + 64;
    default:
      return 0;
  }
}
// The bytes of one packed group of 16 rows of `cols` columns (0: no layout).
inline int64_t PackedGroupBytes(GgmlType type, int64_t cols) {
  if (PackedB32UnitBytes(type) > 0)
    return cols % 64 == 0 ? cols / 64 * PackedB32UnitBytes(type) : 0;
  if (type == GgmlType::kQ8_0) return cols / 32 * kPackedQ8Block;
  if (type == GgmlType::kQ4_K) return cols / 256 * kPackedQ4KBlock;
  if (type == GgmlType::kQ6_K) return cols / 256 * kPackedQ6KBlock;
  if (type == GgmlType::kQ5_K) return cols / 256 * kPackedQ5KBlock;
  if (type == GgmlType::kQ2_K) return cols / 256 * kPackedQ2KBlock;
  if (type == GgmlType::kQ3_K) return cols / 256 * kPackedQ3KBlock;
  if (type == GgmlType::kIQ4_XS) return cols / 256 * kPackedIQ4XSBlock;
  return 0;
}

// out[i] = x[i] rounded to f16 (nearest even), as float.
void RoundToF16(const float* x, int64_t n, float* out);

}  // namespace meshnet::ops::internal
