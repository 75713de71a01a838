#include "util/dtype.h"

#include <cmath>
#include <string>

#include "util/error.h"

namespace meshnet {

std::string_view KvDtypeName(KvDtype t) {
  switch (t) {
    case KvDtype::kF32:
      return "float32";
    case KvDtype::kF16:
      return "float16";
    case KvDtype::kBF16:
      return "bfloat16";
    case KvDtype::kQ8_0:
      return "q8_0";
    case KvDtype::kQ4_0:
      return "q4_0";
  }
  return "?";
}

KvDtype ParseKvDtype(std::string_view name) {
  if (name == "float32") return KvDtype::kF32;
  if (name == "float16") return KvDtype::kF16;
  if (name == "bfloat16") return KvDtype::kBF16;
  if (name == "q8_0") return KvDtype::kQ8_0;
  if (name == "q4_0") return KvDtype::kQ4_0;
  ThrowInvalidArgument("invalid kv dtype '" + std::string(name) +
                       "' (expected float32, float16, bfloat16, q8_0 or q4_0)");
}

namespace {

// Rounds a finite, non-NaN double to binary16 bits, nearest-even.
uint16_t RoundToHalf(double d) {
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  double a = std::fabs(d);
  if (std::isnan(d)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {
    // Subnormal: units of 2^-24.
    double q = std::nearbyint(a * std::ldexp(1.0, 24));  // default mode: nearest-even
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  // binary16 normal: a = 1.f * 2^(e-1); 10 fraction bits.
  double q = std::nearbyint(m * 2048.0);  // in [1024, 2048]
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  int exp = e - 1 + 15;
  if (exp >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>((exp << 10) | (static_cast<int>(q) - 1024));
}

}  // namespace

uint16_t DoubleToHalf(double d) { return RoundToHalf(d); }
uint16_t FloatToHalf(float f) { return RoundToHalf(static_cast<double>(f)); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t frac = h & 0x3ff;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(frac), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (frac << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (frac << 13));
}

}  // namespace meshnet
