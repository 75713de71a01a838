// Element types of KV caches and activations, and scalar conversions.
//
// The scalar conversions round to nearest, ties to even, and are the reference
// the SIMD paths in ops/ are tested against.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace meshnet {

enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline constexpr int KvDtypeSize(KvDtype t) { return t == KvDtype::kF32 ? 4 : 2; }
// "float32", "float16", "bfloat16" (numpy's names).
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

// Store/load one element of `t` at `p`.
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
  }
  return 0;
}

}  // namespace meshnet
