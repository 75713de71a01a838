// Scalar quantizers and dequantizers for the GGML block formats.
//
// Dequantization mirrors GGML's float operations exactly (operand order and
// intermediate float rounding), which is what makes it bit-exact. The
// quantizers for Q4_K/Q6_K are our own: per sub-block a handful of candidate
// scales, each refined by a least-squares fit, keeping the lowest squared
// error; then the sub-block scales are themselves quantized (6 or 8 bits)
// against an f16 super-block scale, and the elements requantized against the
// final, rounded scales so the stored codes match what decoding will use.
#include "ops/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/quantize_internal.h"
#include "util/dtype.h"

namespace meshnet::ops {

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(alignof(BlockQ8_0) == 2 && alignof(BlockQ6_K) == 2);

namespace {

int NearestInt(float v) { return static_cast<int>(std::lround(v)); }

// ---------------------------------------------------------------- Q8_0, Q4_0

void QuantizeQ8_0(const float* x, int64_t n, BlockQ8_0* y) {
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = FloatToHalf(d);
    for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
}

void DequantizeQ8_0(const BlockQ8_0* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float d = HalfToFloat(x[b].d);
    for (int j = 0; j < kQK8_0; ++j) *y++ = static_cast<float>(x[b].qs[j]) * d;
  }
}

void QuantizeQ4_0(const float* x, int64_t n, BlockQ4_0* y) {
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < n / kQK4_0; ++b, x += kQK4_0) {
    // The element of largest magnitude maps to code 0 (value -8*d).
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < kQK4_0; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        vmax = x[j];
      }
    }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = FloatToHalf(d);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kHalf] * id + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void DequantizeQ4_0(const BlockQ4_0* x, int64_t n, float* y) {
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < n / kQK4_0; ++b, y += kQK4_0) {
    const float d = HalfToFloat(x[b].d);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = (x[b].qs[j] & 0x0F) - 8;
      const int hi = (x[b].qs[j] >> 4) - 8;
      y[j] = static_cast<float>(lo) * d;
      y[j + kHalf] = static_cast<float>(hi) * d;
    }
  }
}

// ---------------------------------------------------------------- Q4_K

// Fits x[i] ~= scale * q[i] - min with q in [0, 15], min >= 0.
// Returns the squared error; writes the best scale/min.
float FitAsymmetric(const float* x, int count, float* scale_out, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < count; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // the offset can only lower values (min >= 0)
  if (hi <= lo) {
    *scale_out = 0.0f;
    *min_out = -lo;
    float err = 0.0f;
    for (int i = 0; i < count; ++i) err += (x[i] - lo) * (x[i] - lo);
    return err;
  }
  float best_err = INFINITY, best_scale = 0.0f, best_min = -lo;
  for (int step = -4; step <= 6; ++step) {
    const float iscale = (15.0f + 0.25f * static_cast<float>(step)) / (hi - lo);
    // Codes for this candidate, then the least-squares (scale, offset) for them.
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    uint8_t q[32];
    for (int i = 0; i < count; ++i) {
      q[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - lo)), 0, 15));
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sxq += static_cast<double>(x[i]) * q[i];
    }
    const double det = count * sqq - sq * sq;
    float scale, offset;
    if (det > 0) {
      scale = static_cast<float>((count * sxq - sq * sx) / det);
      offset = static_cast<float>((sqq * sx - sq * sxq) / det);
    } else {
      scale = 1.0f / iscale;
      offset = lo;
    }
    if (offset > 0.0f) {  // min must be >= 0: refit the scale with offset 0
      offset = 0.0f;
      scale = sqq > 0 ? static_cast<float>(sxq / sqq) : 0.0f;
    }
    if (scale < 0.0f) scale = 0.0f;
    float err = 0.0f;
    for (int i = 0; i < count; ++i) {
      const float e = scale * q[i] + offset - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_min = -offset;
    }
  }
  *scale_out = best_scale;
  *min_out = best_min;
  return best_err;
}

void QuantizeQ4_K(const float* x, int64_t n, BlockQ4_K* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ4_K& blk = y[b];
    float scales[8], mins[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
      FitAsymmetric(x + 32 * j, 32, &scales[j], &mins[j]);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    blk.d = FloatToHalf(max_scale / 63.0f);
    blk.dmin = FloatToHalf(max_min / 63.0f);
    const float d = HalfToFloat(blk.d);
    const float dmin = HalfToFloat(blk.dmin);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(d > 0 ? std::clamp(NearestInt(scales[j] / d), 0, 63) : 0);
      lm[j] = static_cast<uint8_t>(dmin > 0 ? std::clamp(NearestInt(mins[j] / dmin), 0, 63) : 0);
    }
    internal::PackQ4KScales(ls, lm, blk.scales);
    uint8_t codes[kQK_K];
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      Q4KScaleMin(j, blk.scales, &sc, &m);
      const float ds = d * sc;
      const float dm = dmin * m;
      for (int i = 0; i < 32; ++i) {
        const int q = ds > 0 ? NearestInt((x[32 * j + i] + dm) / ds) : 0;
        codes[32 * j + i] = static_cast<uint8_t>(std::clamp(q, 0, 15));
      }
    }
    // Sub-blocks 2k and 2k+1 share 32 bytes: low nibbles, then high nibbles.
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        blk.qs[32 * k + l] =
            static_cast<uint8_t>(codes[64 * k + l] | (codes[64 * k + 32 + l] << 4));
      }
    }
  }
}

void DequantizeQ4_K(const BlockQ4_K* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = HalfToFloat(x[b].d);
    const float dmin = HalfToFloat(x[b].dmin);
    const uint8_t* q = x[b].qs;
    for (int k = 0; k < 4; ++k, q += 32) {
      uint8_t sc, m;
      Q4KScaleMin(2 * k, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      Q4KScaleMin(2 * k + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

// ---------------------------------------------------------------- Q6_K

void QuantizeQ6_K(const float* x, int64_t n, BlockQ6_K* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    BlockQ6_K& blk = y[b];
    float scales[16];
    float amax = 0.0f, vmax = 0.0f;
    for (int k = 0; k < 16; ++k) {
      scales[k] = internal::FitSymmetric(x + 16 * k, 16, 32, 0.25f);
      if (std::fabs(scales[k]) > amax) {
        amax = std::fabs(scales[k]);
        vmax = scales[k];
      }
    }
    // The largest sub-block scale maps to -128 (int8's asymmetric end).
    blk.d = FloatToHalf(vmax / -128.0f);
    const float d = HalfToFloat(blk.d);
    uint8_t codes[kQK_K];
    for (int k = 0; k < 16; ++k) {
      const int sc = d != 0.0f ? std::clamp(NearestInt(scales[k] / d), -128, 127) : 0;
      blk.scales[k] = static_cast<int8_t>(sc);
      const float ds = d * static_cast<float>(sc);
      for (int i = 0; i < 16; ++i) {
        const int q = ds != 0.0f ? std::clamp(NearestInt(x[16 * k + i] / ds), -32, 31) : 0;
        codes[16 * k + i] = static_cast<uint8_t>(q + 32);
      }
    }
    // Each 128-element half: ql holds low nibbles of elements (l, l+64) and
    // (l+32, l+96); qh holds the 2 high bits of l, l+32, l+64, l+96.
    for (int h = 0; h < 2; ++h) {
      const uint8_t* c = codes + 128 * h;
      uint8_t* ql = blk.ql + 64 * h;
      uint8_t* qh = blk.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((c[l] & 0xF) | ((c[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((c[l + 32] & 0xF) | ((c[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) |
                                     ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
      }
    }
  }
}

void DequantizeQ6_K(const BlockQ6_K* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = HalfToFloat(x[b].d);
    const uint8_t* ql = x[b].ql;
    const uint8_t* qh = x[b].qh;
    const int8_t* sc = x[b].scales;
    for (int h = 0; h < 2; ++h, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

void QuantizeRow(GgmlType type, const float* src, int64_t n, void* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(src[i]);
      return;
    }
    case GgmlType::kBF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(src[i]);
      return;
    }
    case GgmlType::kQ8_0:
      QuantizeQ8_0(src, n, static_cast<BlockQ8_0*>(dst));
      return;
    case GgmlType::kQ4_0:
      QuantizeQ4_0(src, n, static_cast<BlockQ4_0*>(dst));
      return;
    case GgmlType::kQ4_K:
      QuantizeQ4_K(src, n, static_cast<BlockQ4_K*>(dst));
      return;
    case GgmlType::kQ6_K:
      QuantizeQ6_K(src, n, static_cast<BlockQ6_K*>(dst));
      return;
    case GgmlType::kQ4_1:
      return internal::QuantizeQ4_1(src, n, static_cast<BlockQ4_1*>(dst));
    case GgmlType::kQ5_0:
      return internal::QuantizeQ5_0(src, n, static_cast<BlockQ5_0*>(dst));
    case GgmlType::kQ5_1:
      return internal::QuantizeQ5_1(src, n, static_cast<BlockQ5_1*>(dst));
    case GgmlType::kIQ4_NL:
      return internal::QuantizeIQ4_NL(src, n, static_cast<BlockIQ4_NL*>(dst));
    case GgmlType::kQ2_K:
      return internal::QuantizeQ2_K(src, n, static_cast<BlockQ2_K*>(dst));
    case GgmlType::kQ3_K:
      return internal::QuantizeQ3_K(src, n, static_cast<BlockQ3_K*>(dst));
    case GgmlType::kQ5_K:
      return internal::QuantizeQ5_K(src, n, static_cast<BlockQ5_K*>(dst));
    case GgmlType::kIQ4_XS:
      return internal::QuantizeIQ4_XS(src, n, static_cast<BlockIQ4_XS*>(dst));
  }
}

void DequantizeRow(GgmlType type, const void* src, int64_t n, float* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(in[i]);
      return;
    }
    case GgmlType::kBF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(in[i]);
      return;
    }
    case GgmlType::kQ8_0:
      DequantizeQ8_0(static_cast<const BlockQ8_0*>(src), n, dst);
      return;
    case GgmlType::kQ4_0:
      DequantizeQ4_0(static_cast<const BlockQ4_0*>(src), n, dst);
      return;
    case GgmlType::kQ4_K:
      DequantizeQ4_K(static_cast<const BlockQ4_K*>(src), n, dst);
      return;
    case GgmlType::kQ6_K:
      DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), n, dst);
      return;
    case GgmlType::kQ4_1:
      return internal::DequantizeQ4_1(static_cast<const BlockQ4_1*>(src), n, dst);
    case GgmlType::kQ5_0:
      return internal::DequantizeQ5_0(static_cast<const BlockQ5_0*>(src), n, dst);
    case GgmlType::kQ5_1:
      return internal::DequantizeQ5_1(static_cast<const BlockQ5_1*>(src), n, dst);
    case GgmlType::kIQ4_NL:
      return internal::DequantizeIQ4_NL(static_cast<const BlockIQ4_NL*>(src), n, dst);
    case GgmlType::kQ2_K:
      return internal::DequantizeQ2_K(static_cast<const BlockQ2_K*>(src), n, dst);
    case GgmlType::kQ3_K:
      return internal::DequantizeQ3_K(static_cast<const BlockQ3_K*>(src), n, dst);
    case GgmlType::kQ5_K:
      return internal::DequantizeQ5_K(static_cast<const BlockQ5_K*>(src), n, dst);
    case GgmlType::kIQ4_XS:
      return internal::DequantizeIQ4_XS(static_cast<const BlockIQ4_XS*>(src), n, dst);
  }
}

}  // namespace meshnet::ops
