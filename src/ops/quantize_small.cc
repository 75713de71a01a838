// The 32-element GGML formats added after Q8_0/Q4_0: Q4_1, Q5_0, Q5_1 (GGML's
// reference quantization formulas) and IQ4_NL (our own scale search over the
// fixed non-uniform levels). Dequantization mirrors GGML's float operations.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/quantize_internal.h"
#include "util/dtype.h"

namespace meshnet::ops::internal {

static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);

namespace {

constexpr int kHalf = 16;

// min/max of 32 values (min starts at +inf as in GGML).
void MinMax(const float* x, float* lo, float* hi) {
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int j = 0; j < 32; ++j) {
    *lo = std::min(*lo, x[j]);
    *hi = std::max(*hi, x[j]);
  }
}

// The signed value of largest magnitude (the first one on ties).
float SignedMax(const float* x, int count) {
  float amax = 0.0f, vmax = 0.0f;
  for (int j = 0; j < count; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      vmax = x[j];
    }
  }
  return vmax;
}

uint32_t LoadQh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

// Q5_0/Q5_1 code layout: element i's low nibble in qs[i % 16] (i < 16: low
// half of the byte), its fifth bit at bit i of the 32-bit qh.
template <class CodeFn>
void PackQ5(CodeFn code, uint8_t* qs, uint8_t* qh_out) {
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    const int q0 = code(j);
    const int q1 = code(j + kHalf);
    qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j;
    qh |= static_cast<uint32_t>(q1 >> 4) << (j + kHalf);
  }
  std::memcpy(qh_out, &qh, 4);
}

// The 5-bit code of element i (0 <= i < 32).
int UnpackQ5(const uint8_t* qs, uint32_t qh, int i) {
  const int nibble = i < kHalf ? qs[i] & 0xF : qs[i - kHalf] >> 4;
  return nibble | static_cast<int>(((qh >> i) & 1) << 4);
}

}  // namespace

void QuantizeQ4_1(const float* x, int64_t n, BlockQ4_1* y) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float lo, hi;
    MinMax(x, &lo, &hi);
    const float d = (hi - lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = FloatToHalf(d);
    y[b].m = FloatToHalf(lo);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[j + kHalf] - lo) * id + 0.5f));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void DequantizeQ4_1(const BlockQ4_1* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / 32; ++b, y += 32) {
    const float d = HalfToFloat(x[b].d);
    const float m = HalfToFloat(x[b].m);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = static_cast<float>(x[b].qs[j] & 0xF) * d + m;
      y[j + kHalf] = static_cast<float>(x[b].qs[j] >> 4) * d + m;
    }
  }
}

void QuantizeQ5_0(const float* x, int64_t n, BlockQ5_0* y) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    // The element of largest magnitude maps to code 0 (value -16*d).
    const float d = SignedMax(x, 32) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = FloatToHalf(d);
    PackQ5(
        [&](int i) {
          return std::min(31, static_cast<int>(static_cast<int8_t>(x[i] * id + 16.5f)));
        },
        y[b].qs, y[b].qh);
  }
}

void DequantizeQ5_0(const BlockQ5_0* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / 32; ++b, y += 32) {
    const float d = HalfToFloat(x[b].d);
    const uint32_t qh = LoadQh(x[b].qh);
    for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(UnpackQ5(x[b].qs, qh, i) - 16) * d;
  }
}

void QuantizeQ5_1(const float* x, int64_t n, BlockQ5_1* y) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float lo, hi;
    MinMax(x, &lo, &hi);
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = FloatToHalf(d);
    y[b].m = FloatToHalf(lo);
    PackQ5([&](int i) { return std::min(31, static_cast<int>((x[i] - lo) * id + 0.5f)); }, y[b].qs,
           y[b].qh);
  }
}

void DequantizeQ5_1(const BlockQ5_1* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / 32; ++b, y += 32) {
    const float d = HalfToFloat(x[b].d);
    const float m = HalfToFloat(x[b].m);
    const uint32_t qh = LoadQh(x[b].qh);
    for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(UnpackQ5(x[b].qs, qh, i)) * d + m;
  }
}

int NearestIq4(float v) {
  int best = 0;
  float best_err = INFINITY;
  for (int k = 0; k < 16; ++k) {
    const float e = std::fabs(v - static_cast<float>(kIq4NlValues[k]));
    if (e < best_err) {
      best_err = e;
      best = k;
    }
  }
  return best;
}

float FitIq4(const float* x, int count) {
  const float vmax = SignedMax(x, count);
  if (vmax == 0.0f) return 0.0f;
  float best_err = INFINITY, best_scale = 0.0f;
  for (int step = -6; step <= 6; ++step) {
    // Candidates map the extreme element near the -127 level; each is refined
    // by a least-squares fit over the levels it picks.
    const float scale0 = vmax / (-127.0f + 4.0f * static_cast<float>(step));
    double sxv = 0, svv = 0;
    for (int i = 0; i < count; ++i) {
      const float v = kIq4NlValues[NearestIq4(x[i] / scale0)];
      sxv += static_cast<double>(x[i]) * v;
      svv += static_cast<double>(v) * v;
    }
    const float scale = svv > 0 ? static_cast<float>(sxv / svv) : scale0;
    float err = 0.0f;
    for (int i = 0; i < count; ++i) {
      const float e = scale * kIq4NlValues[NearestIq4(x[i] / scale)] - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
    }
  }
  return best_scale;
}

void QuantizeIQ4_NL(const float* x, int64_t n, BlockIQ4_NL* y) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    y[b].d = FloatToHalf(FitIq4(x, 32));
    const float d = HalfToFloat(y[b].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = NearestIq4(x[j] * id);
      const int q1 = NearestIq4(x[j + kHalf] * id);
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void DequantizeIQ4_NL(const BlockIQ4_NL* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / 32; ++b, y += 32) {
    const float d = HalfToFloat(x[b].d);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = d * static_cast<float>(kIq4NlValues[x[b].qs[j] & 0xF]);
      y[j + kHalf] = d * static_cast<float>(kIq4NlValues[x[b].qs[j] >> 4]);
    }
  }
}

}  // namespace meshnet::ops::internal
