// Element types of KV caches and activations, and scalar conversions.
//
// The scalar conversions round to nearest, ties to even, and are the reference
// the SIMD paths in ops/ are tested against.
//
// q8_0 and q4_0 are block-quantized KV caches (ggml's Q8_0 and Q4_0 blocks:
// 32 values, one f16 scale; a head_dim that is not a multiple of 32 ends each
// head in a short block of the rest). They hold KV rows only, never
// activations; their per-head layout is in ops/kv_quant.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace meshnet {

enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kQ4_0 = 4 };

inline constexpr bool IsQuantizedKv(KvDtype t) {
  return t == KvDtype::kQ8_0 || t == KvDtype::kQ4_0;
}
// The element size of an unquantized dtype (4 or 2); 0 for q8_0 and q4_0,
// whose rows are sized by KvHeadBytes.
inline constexpr int KvDtypeSize(KvDtype t) {
  return t == KvDtype::kF32 ? 4 : IsQuantizedKv(t) ? 0 : 2;
}
inline constexpr int kKvQuantBlock = 32;  // values per q8_0 / q4_0 block
// Bytes of one head's head_dim values in `t`: head_dim * element size, or per
// block of n <= 32 values an f16 scale and n int8 codes (q8_0) or ceil(n / 2)
// bytes of 4-bit codes (q4_0).
inline constexpr int64_t KvHeadBytes(KvDtype t, int64_t head_dim) {
  if (!IsQuantizedKv(t)) return head_dim * KvDtypeSize(t);
  const int64_t blocks = (head_dim + kKvQuantBlock - 1) / kKvQuantBlock;
  if (t == KvDtype::kQ8_0) return 2 * blocks + head_dim;
  const int64_t tail = head_dim % kKvQuantBlock;
  return 2 * blocks + (head_dim - tail) / 2 + (tail + 1) / 2;
}
// Bytes of one K (or V) row: n_kv_heads heads.
inline constexpr int64_t KvRowBytes(KvDtype t, int64_t n_kv_heads, int64_t head_dim) {
  return n_kv_heads * KvHeadBytes(t, head_dim);
}
// "float32", "float16", "bfloat16" (numpy's names), "q8_0", "q4_0" (ggml's).
std::string_view KvDtypeName(KvDtype t);
// Accepts exactly the names above; throws Error(kInvalidArgument) otherwise.
KvDtype ParseKvDtype(std::string_view name);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 <-> binary32.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
// Correctly rounded double -> binary16 (no intermediate float rounding).
uint16_t DoubleToHalf(double d);

// bfloat16 <-> binary32 (round to nearest even; NaN stays NaN).
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// Store/load one element of `t` at `p` (unquantized dtypes only; q8_0 and
// q4_0 rows go through ops/kv_quant.h).
inline void StoreAs(KvDtype t, void* p, float v) {
  switch (t) {
    case KvDtype::kF32:
      std::memcpy(p, &v, 4);
      break;
    case KvDtype::kF16: {
      uint16_t h = FloatToHalf(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case KvDtype::kBF16: {
      uint16_t h = FloatToBf16(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case KvDtype::kQ8_0:
    case KvDtype::kQ4_0:
      break;
  }
}
inline float LoadAs(KvDtype t, const void* p) {
  switch (t) {
    case KvDtype::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case KvDtype::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case KvDtype::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return Bf16ToFloat(h);
    }
    case KvDtype::kQ8_0:
    case KvDtype::kQ4_0:
      break;
  }
  return 0;
}

}  // namespace meshnet
