// The 256-element formats added after Q4_K/Q6_K: Q2_K, Q3_K, Q5_K, IQ4_XS.
// Quantizers are our own: each 16- or 32-element sub-block gets a least-
// squares (scale, min) or scale, the sub-block scales are quantized against
// an f16 super-block scale, and the elements are requantized against the
// final rounded scales. Dequantization mirrors GGML's float operations.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/quantize_internal.h"
#include "util/dtype.h"

namespace meshnet::ops::internal {

static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockIQ4_XS) == 136);

int NearestInt(float v) { return static_cast<int>(std::lround(v)); }

float FitAsymmetric(const float* x, int count, int nmax, float* scale_out, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < count; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // the offset can only lower values (min >= 0)
  *scale_out = 0.0f;
  *min_out = -lo;
  if (hi <= lo) return 0.0f;
  float best_err = INFINITY;
  for (int step = -4; step <= 6; ++step) {
    const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    int q[32];
    for (int i = 0; i < count; ++i) {
      q[i] = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sxq += static_cast<double>(x[i]) * q[i];
    }
    const double det = count * sqq - sq * sq;
    float scale = 1.0f / iscale, offset = lo;
    if (det > 0) {
      scale = static_cast<float>((count * sxq - sq * sx) / det);
      offset = static_cast<float>((sqq * sx - sq * sxq) / det);
    }
    if (offset > 0.0f) {  // min must be >= 0: refit the scale with offset 0
      offset = 0.0f;
      scale = sqq > 0 ? static_cast<float>(sxq / sqq) : 0.0f;
    }
    scale = std::max(scale, 0.0f);
    float err = 0.0f;
    for (int i = 0; i < count; ++i) {
      const float e = scale * static_cast<float>(q[i]) + offset - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      *scale_out = scale;
      *min_out = -offset;
    }
  }
  return best_err;
}

void PackQ4KScales(const uint8_t ls[8], const uint8_t lm[8], uint8_t scales[12]) {
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = ls[j];
      scales[j + 4] = lm[j];
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      scales[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

float FitSymmetric(const float* x, int count, int nmax, float step_size) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < count; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best_err = INFINITY, best_scale = 0.0f;
  for (int step = -6; step <= 6; ++step) {
    // Candidates map the extreme element near code -nmax (the asymmetric end).
    const float iscale = -(static_cast<float>(nmax) + step_size * static_cast<float>(step)) / vmax;
    double sxq = 0, sqq = 0;
    int q[32];
    for (int i = 0; i < count; ++i) {
      q[i] = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      sxq += static_cast<double>(x[i]) * q[i];
      sqq += static_cast<double>(q[i]) * q[i];
    }
    if (sqq <= 0) continue;
    const float scale = static_cast<float>(sxq / sqq);
    float err = 0.0f;
    for (int i = 0; i < count; ++i) {
      const float e = scale * static_cast<float>(q[i]) - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
    }
  }
  return best_scale;
}

namespace {

// Quantizes non-negative v[0..count) against max/qmax into [0, qmax] codes;
// returns the f16 bits of the shared scale.
uint16_t QuantizeScales(const float* v, int count, int qmax, uint8_t* codes) {
  float vmax = 0.0f;
  for (int j = 0; j < count; ++j) vmax = std::max(vmax, v[j]);
  const uint16_t bits = FloatToHalf(vmax / static_cast<float>(qmax));
  const float d = HalfToFloat(bits);
  for (int j = 0; j < count; ++j) {
    codes[j] = static_cast<uint8_t>(d > 0 ? std::clamp(NearestInt(v[j] / d), 0, qmax) : 0);
  }
  return bits;
}

// Signed scales v[0..count) against the largest-magnitude one mapped to
// -qhalf; codes in [-qhalf, qhalf - 1]. Returns the f16 bits of the scale.
uint16_t QuantizeSignedScales(const float* v, int count, int qhalf, int* codes) {
  float amax = 0.0f, vmax = 0.0f;
  for (int j = 0; j < count; ++j) {
    if (std::fabs(v[j]) > amax) {
      amax = std::fabs(v[j]);
      vmax = v[j];
    }
  }
  const uint16_t bits = FloatToHalf(vmax / static_cast<float>(-qhalf));
  const float d = HalfToFloat(bits);
  for (int j = 0; j < count; ++j) {
    codes[j] = d != 0.0f ? std::clamp(NearestInt(v[j] / d), -qhalf, qhalf - 1) : 0;
  }
  return bits;
}

// Element i of a Q2_K/Q3_K super-block: 2-bit code in byte 32*(i/128) + i%32
// at bit 2*((i%128)/32); its 16-element scale index is i/16.
void Pack2Bit(const uint8_t* codes, uint8_t* qs) {
  std::memset(qs, 0, kQK_K / 4);
  for (int i = 0; i < kQK_K; ++i) {
    qs[32 * (i / 128) + i % 32] |= static_cast<uint8_t>((codes[i] & 3) << (2 * ((i % 128) / 32)));
  }
}

}  // namespace

void QuantizeQ2_K(const float* x, int64_t n, BlockQ2_K* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scales[16], mins[16];
    for (int k = 0; k < 16; ++k) FitAsymmetric(x + 16 * k, 16, 3, &scales[k], &mins[k]);
    uint8_t ls[16], lm[16];
    y[b].d = QuantizeScales(scales, 16, 15, ls);
    y[b].dmin = QuantizeScales(mins, 16, 15, lm);
    const float d = HalfToFloat(y[b].d), dmin = HalfToFloat(y[b].dmin);
    uint8_t codes[kQK_K];
    for (int k = 0; k < 16; ++k) {
      y[b].scales[k] = static_cast<uint8_t>(ls[k] | (lm[k] << 4));
      const float ds = d * ls[k], dm = dmin * lm[k];
      for (int i = 0; i < 16; ++i) {
        const int q = ds > 0 ? NearestInt((x[16 * k + i] + dm) / ds) : 0;
        codes[16 * k + i] = static_cast<uint8_t>(std::clamp(q, 0, 3));
      }
    }
    Pack2Bit(codes, y[b].qs);
  }
}

void DequantizeQ2_K(const BlockQ2_K* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = HalfToFloat(x[b].d), dmin = HalfToFloat(x[b].dmin);
    for (int i = 0; i < kQK_K; ++i) {
      const uint8_t sc = x[b].scales[i / 16];
      const float dl = d * static_cast<float>(sc & 0xF);
      const float ml = dmin * static_cast<float>(sc >> 4);
      const int q = (x[b].qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
      y[i] = dl * static_cast<float>(q) - ml;
    }
  }
}

void QuantizeQ3_K(const float* x, int64_t n, BlockQ3_K* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scales[16];
    for (int k = 0; k < 16; ++k) scales[k] = FitSymmetric(x + 16 * k, 16, 4, 0.1f);
    int sc[16];
    y[b].d = QuantizeSignedScales(scales, 16, 32, sc);
    const float d = HalfToFloat(y[b].d);
    std::memset(y[b].scales, 0, sizeof(y[b].scales));
    std::memset(y[b].hmask, 0, sizeof(y[b].hmask));
    uint8_t codes[kQK_K];
    for (int k = 0; k < 16; ++k) {
      const int s = sc[k] + 32;  // 6 bits: low nibble in byte k%8, top 2 bits in byte 8+k%4
      y[b].scales[k % 8] |= static_cast<uint8_t>((s & 0xF) << (4 * (k / 8)));
      y[b].scales[8 + k % 4] |= static_cast<uint8_t>((s >> 4) << (2 * (k / 4)));
      const float ds = d * static_cast<float>(sc[k]);
      for (int i = 0; i < 16; ++i) {
        const int q = ds != 0.0f ? std::clamp(NearestInt(x[16 * k + i] / ds), -4, 3) : 0;
        codes[16 * k + i] = static_cast<uint8_t>(q + 4);
      }
    }
    Pack2Bit(codes, y[b].qs);
    for (int i = 0; i < kQK_K; ++i) {  // bit 2 of element i: hmask[i%32] bit i/32
      y[b].hmask[i % 32] |= static_cast<uint8_t>((codes[i] >> 2) << (i / 32));
    }
  }
}

void DequantizeQ3_K(const BlockQ3_K* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = HalfToFloat(x[b].d);
    int8_t sc[16];
    Q3KScales(x[b].scales, sc);
    for (int i = 0; i < kQK_K; ++i) {
      const float dl = d * static_cast<float>(sc[i / 16]);
      const int lo = (x[b].qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
      const int q = lo - ((x[b].hmask[i % 32] >> (i / 32)) & 1 ? 0 : 4);
      y[i] = dl * static_cast<float>(q);
    }
  }
}

void QuantizeQ5_K(const float* x, int64_t n, BlockQ5_K* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ5_K& blk = y[b];
    float scales[8], mins[8];
    for (int j = 0; j < 8; ++j) FitAsymmetric(x + 32 * j, 32, 31, &scales[j], &mins[j]);
    uint8_t ls[8], lm[8];
    blk.d = QuantizeScales(scales, 8, 63, ls);
    blk.dmin = QuantizeScales(mins, 8, 63, lm);
    const float d = HalfToFloat(blk.d), dmin = HalfToFloat(blk.dmin);
    PackQ4KScales(ls, lm, blk.scales);
    std::memset(blk.qh, 0, sizeof(blk.qh));
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      Q4KScaleMin(j, blk.scales, &sc, &m);
      const float ds = d * sc, dm = dmin * m;
      for (int l = 0; l < 32; ++l) {
        const int q = std::clamp(ds > 0 ? NearestInt((x[32 * j + l] + dm) / ds) : 0, 0, 31);
        // Sub-blocks 2k, 2k+1 share qs[32k ...] (low, high nibble); bit 4 of
        // sub-block j's element l is bit j of qh[l].
        uint8_t& byte = blk.qs[32 * (j / 2) + l];
        byte =
            static_cast<uint8_t>(j % 2 == 0 ? (byte & 0xF0) | (q & 0xF) : (byte & 0x0F) | (q << 4));
        blk.qh[l] |= static_cast<uint8_t>((q >> 4) << j);
      }
    }
  }
}

void DequantizeQ5_K(const BlockQ5_K* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = HalfToFloat(x[b].d), dmin = HalfToFloat(x[b].dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      Q4KScaleMin(j, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      const uint8_t* ql = x[b].qs + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        const int lo = j % 2 == 0 ? (ql[l] & 0xF) : (ql[l] >> 4);
        const int q = lo + ((x[b].qh[l] >> j) & 1 ? 16 : 0);
        *y++ = d1 * static_cast<float>(q) - m1;
      }
    }
  }
}

void QuantizeIQ4_XS(const float* x, int64_t n, BlockIQ4_XS* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scales[8];
    for (int j = 0; j < 8; ++j) scales[j] = FitIq4(x + 32 * j, 32);
    int ls[8];
    y[b].d = QuantizeSignedScales(scales, 8, 32, ls);
    const float d = HalfToFloat(y[b].d);
    y[b].scales_h = 0;
    std::memset(y[b].scales_l, 0, sizeof(y[b].scales_l));
    for (int j = 0; j < 8; ++j) {
      const int s = ls[j] + 32;
      y[b].scales_l[j / 2] |= static_cast<uint8_t>((s & 0xF) << (4 * (j % 2)));
      y[b].scales_h = static_cast<uint16_t>(y[b].scales_h | ((s >> 4) << (2 * j)));
      const float ds = d * static_cast<float>(ls[j]);
      const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
      uint8_t* qs = y[b].qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        const int q0 = NearestIq4(x[32 * j + l] * id);
        const int q1 = NearestIq4(x[32 * j + l + 16] * id);
        qs[l] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
  }
}

void DequantizeIQ4_XS(const BlockIQ4_XS* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = HalfToFloat(x[b].d);
    for (int j = 0; j < 8; ++j, y += 32) {
      const float dl = d * static_cast<float>(IQ4XSScale(x[b], j));
      const uint8_t* qs = x[b].qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * static_cast<float>(kIq4NlValues[qs[l] & 0xF]);
        y[l + 16] = dl * static_cast<float>(kIq4NlValues[qs[l] >> 4]);
      }
    }
  }
}

}  // namespace meshnet::ops::internal
