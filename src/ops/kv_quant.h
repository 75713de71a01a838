// Block-quantized KV rows (KvDtype::kQ8_0, kQ4_0): the layout and the scalar
// quantizers, which are the reference the attention kernels are tested
// against and the only code that writes these rows.
//
// A row is n_kv_heads heads of KvHeadBytes(dtype, head_dim) bytes each. A head
// is ceil(head_dim / 32) blocks in order; block b holds values [32b, 32b + n),
// n = min(32, head_dim - 32b), as its f16 scale d (little-endian) followed by
//   q8_0: n int8 codes q; value = q * d;
//   q4_0: h = ceil(n / 2) bytes, byte j holding value j's code in its low
//         nibble and value j + h's in its high nibble (8 when j + h == n);
//         value = (code - 8) * d. A full block is ggml's block_q4_0.
// Quantization of a block, rounding to nearest even (ggml rounds half away
// from zero; ties are the only difference):
//   q8_0: d = max|x| / 127, q = round(x * (127 / max|x|));
//   q4_0: m = the value of largest magnitude (the positive one of a tie),
//         d = m / -8, code = clamp(round(x * (-8 / m)) + 8, 0, 15).
// A block of zeros gets d = 0 and codes 0 (q8_0) or 8 (q4_0).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "util/dtype.h"

namespace meshnet::ops {

// Quantizes one head (head_dim floats) into KvHeadBytes(dt, head_dim) bytes.
void QuantizeKvHead(KvDtype dt, const float* x, int head_dim, uint8_t* dst);
// Dequantizes one head: out[i] = code * d as floats (the product is exact).
void DequantizeKvHead(KvDtype dt, const uint8_t* src, int head_dim, float* out);
// A whole row: n_heads heads one after another.
void QuantizeKvRow(KvDtype dt, const float* x, int n_heads, int head_dim, uint8_t* dst);
void DequantizeKvRow(KvDtype dt, const uint8_t* src, int n_heads, int head_dim, float* out);

// The codes of block b of a head as int8 values (code, or code - 8 for q4_0)
// into out[0, n) and the block's scale; `head` points at the head's first byte.
float KvBlockCodes(KvDtype dt, const uint8_t* head, int head_dim, int b, int8_t* out);

// A query head quantized for the integer dot with q8_0 / q4_0 keys: per block
// of the key layout, codes[32b, 32b + 32) = round(x * 127 / max|x_b|) (a short
// block zero-padded to 32) and scales[b] = mul * max|x_b| / 127, so that
// mul * dot(x, k) ~ sum over b of scales[b] * d_k[b] * sum(codes * k codes).
// codes holds 32 * ceil(head_dim / 32) values, scales ceil(head_dim / 32).
void QuantizeQueryHead(const float* x, int head_dim, float mul, int16_t* codes, float* scales);

inline constexpr int KvBlocks(int head_dim) {
  return (head_dim + kKvQuantBlock - 1) / kKvQuantBlock;
}

}  // namespace meshnet::ops
