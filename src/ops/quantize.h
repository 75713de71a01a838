// Row conversion between float32 and the GGML tensor types meshnet supports
// (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K, IQ4_XS), with GGML's exact block layouts.
//
// Contract:
// - `n` must be a multiple of the type's block size (GgmlTypeInfoOf(t).block_elems:
//   1 for F32/F16/BF16, 32 for Q8_0/Q4_*/Q5_*/IQ4_NL, 256 for the K-quants and
//   IQ4_XS). Callers validate
//   (RowLengthValid / RowBytes); these functions have no error paths.
// - DequantizeRow reproduces GGML's dequantization bit for bit (same float
//   operations in the same order), so GGUF files written by llama.cpp decode to
//   the values llama.cpp computes.
// - QuantizeRow rounds to nearest; Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 use GGML's
//   reference formulas, the others a small least-squares scale search (not
//   byte-identical to llama.cpp's quantizer, which is allowed: any valid block
//   decodes correctly).
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
struct BlockQ4_1 {
  uint16_t d;              // f16 scale
  uint16_t m;              // f16 offset; value = d*q + m
  uint8_t qs[kQK4_1 / 2];  // nibbles as in Q4_0
};
struct BlockQ5_0 {
  uint16_t d;              // f16 scale; value = d*(q-16)
  uint8_t qh[4];           // bit j (little-endian u32) = bit 4 of element j's code
  uint8_t qs[kQK5_0 / 2];  // low nibbles as in Q4_0
};
struct BlockQ5_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 offset; value = d*q + m
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
struct BlockIQ4_NL {
  uint16_t d;               // f16 scale; value = d*kIq4NlValues[nibble]
  uint8_t qs[kQK4_NL / 2];  // nibbles as in Q4_0
};
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per 16 elements: scale (low nibble), min (high nibble)
  uint8_t qs[kQK_K / 4];       // 2-bit codes; value = d*sc*q - dmin*m
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // bit 2 of each code (set: code in [0, 3], clear: minus 4)
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // 16 x 6-bit scales, stored +32
  uint16_t d;                // value = d*(sc-32)*q, q in [-4, 3]
};
struct BlockQ4_K {
  uint16_t d;                   // f16 super-block scale for the 6-bit scales
  uint16_t dmin;                // f16 super-block scale for the 6-bit mins
  uint8_t scales[kKScaleSize];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[kQK_K / 2];        // nibbles; value = d*sc*q - dmin*m
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];  // as Q4_K
  uint8_t qh[kQK_K / 8];        // bit 4 of the codes
  uint8_t qs[kQK_K / 2];        // low nibbles as Q4_K; value = d*sc*q - dmin*m, q in [0, 31]
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;      // bits 2j, 2j+1: the top 2 bits of sub-block j's scale
  uint8_t scales_l[4];    // nibble j: low 4 bits of sub-block j's scale (stored +32)
  uint8_t qs[kQK_K / 2];  // per 32-block: nibbles as in IQ4_NL
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

// Q3_K's 16 6-bit scales (stored +32) unpacked from the 12 packed bytes: byte
// k < 8 holds the low nibbles of scales k and k+8; bytes 8..11 the top 2 bits
// (scale j's at bits 2*(j/4) of byte 8 + j%4).
inline void Q3KScales(const uint8_t* packed, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

// IQ4_XS sub-block j's signed scale (ls - 32).
inline int IQ4XSScale(const BlockIQ4_XS& b, int j) {
  const int lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
  const int hi = (b.scales_h >> (2 * j)) & 3;
  return (lo | (hi << 4)) - 32;
}

}  // namespace meshnet::ops
