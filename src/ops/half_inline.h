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

}  // namespace meshnet::ops
