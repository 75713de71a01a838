// Row conversion between float32 and the GGML tensor types meshnet supports
// (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K), with GGML's exact block layouts.
//
// Contract:
// - `n` must be a multiple of the type's block size (GgmlTypeInfoOf(t).block_elems:
//   1 for F32/F16/BF16, 32 for Q8_0/Q4_0, 256 for Q4_K/Q6_K). Callers validate
//   (RowLengthValid / RowBytes); these functions have no error paths.
// - DequantizeRow reproduces GGML's dequantization bit for bit (same float
//   operations in the same order), so GGUF files written by llama.cpp decode to
//   the values llama.cpp computes.
// - QuantizeRow rounds to nearest; Q8_0 and Q4_0 use GGML's reference formulas,
//   Q4_K and Q6_K a small least-squares scale search (not byte-identical to
//   llama.cpp's quantizer, which is allowed: any valid block decodes correctly).
// - Nothing allocates. dst must hold RowBytes(type, n) bytes (QuantizeRow) or
//   n floats (DequantizeRow); src and dst must not overlap.
//
// Thread-safety: pure functions, safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/ggml_type.h"

namespace meshnet::ops {

// Bytes of one row of `n` elements of type `t` (n a multiple of the block size).
inline int64_t RowBytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo info = GgmlTypeInfoOf(t);
  return n / info.block_elems * info.block_bytes;
}
// True when n >= 0 and n is a multiple of the type's block size.
inline bool RowLengthValid(GgmlType t, int64_t n) {
  return n >= 0 && n % GgmlTypeInfoOf(t).block_elems == 0;
}

// src: (n) floats -> dst: RowBytes(type, n) bytes.
void QuantizeRow(GgmlType type, const float* src, int64_t n, void* dst);
// src: RowBytes(type, n) bytes -> dst: (n) floats.
void DequantizeRow(GgmlType type, const void* src, int64_t n, float* dst);

// GGML block structs (layout-exact; static_asserted in quantize.cc).
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK8_0];
};
struct BlockQ4_0 {
  uint16_t d;              // f16 scale
  uint8_t qs[kQK4_0 / 2];  // element j in low nibble of qs[j], j+16 in the high nibble
};
struct BlockQ4_K {
  uint16_t d;                   // f16 super-block scale for the 6-bit scales
  uint16_t dmin;                // f16 super-block scale for the 6-bit mins
  uint8_t scales[kKScaleSize];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[kQK_K / 2];        // nibbles; value = d*sc*q - dmin*m
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 16 sub-block scales
  uint16_t d;                 // f16 super-block scale; value = d*sc*(q-32)
};

// Q4_K packed 6-bit (scale, min) of sub-block j in [0, 8), as GGML unpacks them.
inline void Q4KScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace meshnet::ops
