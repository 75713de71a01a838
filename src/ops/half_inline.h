// Branch-light scalar f16 -> f32 for kernel inner loops (per-block scales).
// Exact for every finite half, including subnormals (bit-identical to
// meshnet::HalfToFloat); inf/NaN take the slow branch. Requires that the FPU
// does not flush denormals (the default).
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "util/dtype.h"

namespace meshnet::ops {

inline float HalfToFloatFast(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t rest = h & 0x7fffu;
  if (rest >= 0x7c00u) return BitsFloat(sign | 0x7f800000u | ((rest & 0x3ffu) << 13));
  // Reinterpret exponent+fraction in float position, then rebias by 2^112.
  const float mag = BitsFloat(rest << 13) * 0x1p112f;
  return BitsFloat(FloatBits(mag) | sign);
}

// Scalar f32 -> f16, round to nearest even (bit-identical to
// meshnet::FloatToHalf, which goes through double and frexp). Subnormal
// results: adding 0.5f makes the FPU round at 2^-24, the subnormal unit.
inline uint16_t FloatToHalfFast(float f) {
  const uint32_t x = FloatBits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7e00u;          // NaN (unsigned, like FloatToHalf)
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (and inf) round to inf
  if (a < 0x38800000u) {                        // below 2^-14
    const float r = BitsFloat(a) + 0.5f;
    return sign | static_cast<uint16_t>(FloatBits(r) - FloatBits(0.5f));
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);  // rebias by -112 exponents, round to 10 bits
  return sign | static_cast<uint16_t>(a >> 13);
}

}  // namespace meshnet::ops
