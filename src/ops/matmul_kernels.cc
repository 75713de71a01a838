// Highway kernels for ops/matmul.h, compiled once per SIMD target and chosen
// at run time (HWY_DYNAMIC_DISPATCH).
//
// Quantized weights: a tile of R weight rows x T tokens is computed at once
// (R = T = 1 for decode). For every 32-element block, each row's codes are
// widened to int16 (one vector per block on AVX-512, else per 16 or 8
// elements) and multiplied with the int16 activations by
// ReorderWidenMulAccumulate (pmaddwd), which is exact; the int32 sums are
// converted and scaled by (weight scale * activation scale) into float
// accumulators. Q4_K's mins are applied per block with the precomputed
// d*sum(q) of the activation block; Q4_0's -8 is subtracted from the codes. Q6_K's per-16 scales
// are folded into the codes ((q-32)*sc fits int16). A 32-lane vector gets its two Q6_K scales / Q4
// nibble halves explicitly; narrower vectors never straddle them.
//
// Float weights (F32/F16/BF16): rows are widened to f32 and FMA'd against
// float activations with full-width vectors; odd tails are scalar.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matmul_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "hwy/highway.h"
#include "ops/half_inline.h"
#include "ops/matmul_formats-inl.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_kquant_x86-inl.h"
#include "ops/matmul_x86-inl.h"
#include "ops/matmul_x86_b32-inl.h"
#include "ops/quantize.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
// Highway 1.0.3 compiles AVX3_DL without avx512vnni (it names avxvnni, the VEX
// form), though its CPU check requires AVX512-VNNI: added for the kernels here.
#pragma GCC target("avx512vnni")
#endif
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------- activations

HWY_INLINE float RoundToHalf(float v) { return HalfToFloat(FloatToHalf(v)); }

// q8_0 (q8_1: with GGML's f16 s = d*sum(q)) per 32-block.
void QuantizeQ8_0Acts(const float* x, int64_t t_begin, int64_t t_end, bool q8_1,
                      const QuantActs& a) {
  const hn::CappedTag<float, 32> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int16_t, decltype(df)> dq;
  const hn::Rebind<int8_t, decltype(df)> dq8;
  const size_t n = hn::Lanes(df);
  const int64_t cols = a.cols, nb = cols / 32;
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + t * cols + b * 32;
      int16_t* qb = a.q + t * cols + b * 32;
      auto vmax = hn::Zero(df);
      for (size_t i = 0; i < 32; i += n) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + i)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float scale = amax / 127.0f;
      const auto vinv = hn::Set(df, amax != 0.0f ? 127.0f / amax : 0.0f);
      auto vsum = hn::Zero(di);
      for (size_t i = 0; i < 32; i += n) {
        const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + i), vinv));
        vsum = hn::Add(vsum, qi);
        hn::StoreU(hn::DemoteTo(dq, qi), dq, qb + i);
        hn::StoreU(hn::DemoteTo(dq8, qi), dq8, a.q8 + (qb - a.q) + i);
      }
      const auto sum = static_cast<float>(hn::GetLane(hn::SumOfLanes(di, vsum)));
      a.d[t * nb + b] = RoundToHalf(scale);
      a.dxs[t * nb + b] = q8_1 ? RoundToHalf(scale * sum) : a.d[t * nb + b] * sum;
    }
  }
}

// q8_K per 256-block, with per-32 and per-16 d*sum(q).
void QuantizeQ8_KActs(const float* x, int64_t t_begin, int64_t t_end, const QuantActs& a) {
  const hn::CappedTag<float, 16> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int16_t, decltype(df)> dq;
  const hn::Rebind<int8_t, decltype(df)> dq8;
  const size_t n = hn::Lanes(df);
  const int64_t cols = a.cols, nb = cols / 32;
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int64_t s = 0; s < cols / kQK_K; ++s) {
      const float* xb = x + t * cols + s * kQK_K;
      int16_t* qb = a.q + t * cols + s * kQK_K;
      auto vmax = hn::Zero(df);
      for (size_t i = 0; i < kQK_K; i += n) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + i)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      float signed_max = 0.0f;  // the first element of largest magnitude, as GGML picks it
      for (int i = 0; i < kQK_K && amax != 0.0f; ++i) {
        if (std::fabs(xb[i]) == amax) {
          signed_max = xb[i];
          break;
        }
      }
      const float iscale = amax != 0.0f ? -127.0f / signed_max : 0.0f;
      const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
      const auto vis = hn::Set(df, iscale);
      for (int k = 0; k < 16; ++k) {
        auto vsum = hn::Zero(di);
        for (size_t i = 16 * k; i < 16 * static_cast<size_t>(k + 1); i += n) {
          const auto qi =
              hn::Min(hn::NearestInt(hn::Mul(hn::LoadU(df, xb + i), vis)), hn::Set(di, 127));
          vsum = hn::Add(vsum, qi);
          hn::StoreU(hn::DemoteTo(dq, qi), dq, qb + i);
          hn::StoreU(hn::DemoteTo(dq8, qi), dq8, a.q8 + (qb - a.q) + i);
        }
        const auto sum = static_cast<float>(hn::GetLane(hn::SumOfLanes(di, vsum)));
        a.dxs16[t * (cols / 16) + s * 16 + k] = d * sum;
      }
      for (int j = 0; j < 8; ++j) {
        const int64_t b = t * nb + s * 8 + j;
        const float* s16 = a.dxs16 + t * (cols / 16) + s * 16 + 2 * j;
        a.d[b] = d;
        a.dxs[b] = s16[0] + s16[1];
      }
    }
  }
}

void QuantizeActsImpl(ActFormat fmt, const float* x, int64_t t_begin, int64_t t_end,
                      const QuantActs& a) {
  if (fmt == ActFormat::kQ8_K) {
    QuantizeQ8_KActs(x, t_begin, t_end, a);
  } else {
    QuantizeQ8_0Acts(x, t_begin, t_end, fmt == ActFormat::kQ8_1, a);
  }
}

// ---------------------------------------------------------------- quant tiles

// The int16 activation codes of tokens [t0, t0+T) and their scales.
template <int T>
struct QuantTokenPtrs {
  const int16_t* q[T];
  const float* d[T];
  const float* s[T];
  const float* s16[T];
  QuantTokenPtrs(const QuantActs& a, int64_t t0) {
    const int64_t nb = a.cols / 32;
    for (int t = 0; t < T; ++t) {
      q[t] = a.q + (t0 + t) * a.cols;
      d[t] = a.d + (t0 + t) * nb;
      s[t] = a.dxs + (t0 + t) * nb;
      s16[t] = a.dxs16 + (t0 + t) * (a.cols / 16);
    }
  }
};

// Super-block s's per (row, token, sub-block) scales, weight scale times
// activation scale, into eff; its offset terms into corr (one sub-block) or
// corr8 (K-quants: one lane per sub-block position).
template <class Fmt, int R, int T>
HWY_INLINE void QuantSuperScales(const SubScales (&h)[R], const QuantTokenPtrs<T>& x, int64_t s,
                                 float (&eff)[R][T][Fmt::kSub], float (&corr)[R][T],
                                 hn::Vec<D8F> (&corr8)[R][T]) {
  const D8F d8;
  if constexpr (Fmt::kSub == 8) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        for (size_t j = 0; j < 8; j += hn::Lanes(d8)) {
          const int64_t b = s * 8 + static_cast<int64_t>(j);
          hn::Store(hn::Mul(hn::Load(d8, h[r].scale + j), hn::LoadU(d8, x.d[t] + b)), d8,
                    eff[r][t] + j);
          if constexpr (Fmt::kHasOff) {
            corr8[r][t] =
                hn::MulAdd(hn::Load(d8, h[r].off + j), hn::LoadU(d8, x.s[t] + b), corr8[r][t]);
          }
        }
    if constexpr (HasOff16<Fmt>()) {
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t)
          for (size_t k = 0; k < 16; k += hn::Lanes(d8)) {
            corr8[r][t] = hn::MulAdd(hn::Load(d8, h[r].off16 + k),
                                     hn::LoadU(d8, x.s16[t] + s * 16 + k), corr8[r][t]);
          }
    }
  } else {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        eff[r][t][0] = h[r].scale[0] * x.d[t][s];
        if constexpr (Fmt::kHasOff) corr[r][t] += h[r].off[0] * x.s[t][s];
      }
  }
}

// Sub-block j of super-block s: the exact integer dot of each (row, token),
// converted and scaled by its eff into acc.
template <class Fmt, int R, int T>
HWY_INLINE void QuantSubBlock(const uint8_t* const (&rows)[R], const SubScales (&h)[R],
                              const QuantTokenPtrs<T>& x, int64_t s, int j,
                              const float (&eff)[R][T][Fmt::kSub], hn::Vec<DF32> (&acc)[R][T]) {
  const D16 d16;
  const D32 d32;
  const DF32 df;
  const int64_t b = s * Fmt::kSub + j;
  hn::Vec<D32> sum0[R][T], sum1[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) sum0[r][t] = sum1[r][t] = hn::Zero(d32);
  for (size_t e = 0; e < 32; e += kN16) {
    V16 code[R];
    for (int r = 0; r < R; ++r) code[r] = Fmt::Code(d16, rows[r] + s * Fmt::kBytes, h[r], j, e);
    for (int t = 0; t < T; ++t) {
      const V16 xv = hn::LoadU(d16, x.q[t] + b * 32 + static_cast<int64_t>(e));
      for (int r = 0; r < R; ++r) {
        sum0[r][t] = hn::ReorderWidenMulAccumulate(d32, code[r], xv, sum0[r][t], sum1[r][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      const auto isum = hn::RearrangeToOddPlusEven(sum0[r][t], sum1[r][t]);
      acc[r][t] = hn::MulAdd(hn::ConvertTo(df, isum), hn::Set(df, eff[r][t][j]), acc[r][t]);
    }
}

// Rows [r0, r0+R) x tokens [t0, t0+T) of y (n_tokens, rows). Every output
// has one accumulator and takes its blocks in order, whatever the tile shape:
// a row's result is the same bits alone (decode, 1 x 1) or in any batch.
template <class Fmt, int R, int T>
HWY_INLINE void QuantTile(const WeightMatrix& w, int64_t r0, int64_t t0, const QuantActs& a,
                          float* y) {
  const DF32 df;
  const D8F d8;
  const int64_t row_bytes = w.cols / Fmt::kSuper * Fmt::kBytes;
  const int64_t n_super = w.cols / Fmt::kSuper;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * row_bytes;
  const QuantTokenPtrs<T> x(a, t0);
  hn::Vec<DF32> acc[R][T];
  float corr[R][T];
  hn::Vec<D8F> corr8[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      acc[r][t] = hn::Zero(df);
      corr[r][t] = 0.0f;
      corr8[r][t] = hn::Zero(d8);
    }
  for (int64_t s = 0; s < n_super; ++s) {
    SubScales h[R];
    for (int r = 0; r < R; ++r) Fmt::Header(rows[r] + s * Fmt::kBytes, &h[r]);
    HWY_ALIGN float eff[R][T][Fmt::kSub];
    QuantSuperScales<Fmt, R, T>(h, x, s, eff, corr, corr8);
    HWY_UNROLL(8)
    for (int j = 0; j < Fmt::kSub; ++j) QuantSubBlock<Fmt, R, T>(rows, h, x, s, j, eff, acc);
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      float off = corr[r][t];
      if constexpr (Fmt::kSub == 8) off += hn::GetLane(hn::SumOfLanes(d8, corr8[r][t]));
      y[(t0 + t) * w.rows + r0 + r] = hn::GetLane(hn::SumOfLanes(df, acc[r][t])) - off;
    }
}

template <class Fmt, int R, int T>
HWY_INLINE void QuantTokens(const WeightMatrix& w, int64_t r0, const QuantActs& a, int64_t n_tokens,
                            float* y) {
  int64_t t = 0;
  for (; t + T <= n_tokens; t += T) QuantTile<Fmt, R, T>(w, r0, t, a, y);
  for (; t < n_tokens; ++t) QuantTile<Fmt, R, 1>(w, r0, t, a, y);
}

// Decode streams one row at a time: measured from DRAM, interleaving 2 or 4
// rows (to share activation loads) ran 1.3-3.5x slower than one sequential
// stream, which the hardware prefetchers follow best. Prefill tiles 2 rows x
// kTokens tokens (accumulators must fit the register file: 32 vector
// registers on AVX-512).
constexpr bool kWideRegs = HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL;
constexpr int kTokens = kWideRegs ? 4 : 2;

template <class Fmt>
void QuantRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const QuantActs& a,
               int64_t n_tokens, float* y) {
  int64_t r = r_begin;
  if (n_tokens == 1) {
    for (; r < r_end; ++r) QuantTile<Fmt, 1, 1>(w, r, 0, a, y);
  } else {
    for (; r + 2 <= r_end; r += 2) QuantTokens<Fmt, 2, kTokens>(w, r, a, n_tokens, y);
  }
  for (; r < r_end; ++r) QuantTokens<Fmt, 1, kTokens>(w, r, a, n_tokens, y);
}

void MatMulQuantRowsImpl(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const QuantActs& a,
                         int64_t n_tokens, float* y) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if (Block32MatMulRows(w, r_begin, r_end, a, n_tokens, y)) return;
  if (KQuantMatMulRows(w, r_begin, r_end, a, n_tokens, y)) return;
#endif
  switch (w.type) {
    case GgmlType::kQ8_0:
      return QuantRows<Q8_0Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ4_0:
      return QuantRows<Q4_0Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ4_K:
      return QuantRows<Q4_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ6_K:
      return QuantRows<Q6_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ4_1:
      return QuantRows<Q4_1Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ5_0:
      return QuantRows<Q5_0Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ5_1:
      return QuantRows<Q5_1Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kIQ4_NL:
      return QuantRows<IQ4_NLFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ2_K:
      return QuantRows<Q2_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ3_K:
      return QuantRows<Q3_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ5_K:
      return QuantRows<Q5_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kIQ4_XS:
      return QuantRows<IQ4_XSFmt>(w, r_begin, r_end, a, n_tokens, y);
    default:
      return;  // float types take MatMulFloatRows
  }
}

void MatMulPackedRowsImpl(const WeightMatrix& w, int64_t g_begin, int64_t g_end, const QuantActs& a,
                          int64_t n_tokens, float* y) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
  switch (w.type) {
    case GgmlType::kQ8_0:
      return Q8PackedRows(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ4_K:
      return KPackedRows<Q4KPacked>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ5_K:
      return KPackedRows<Q5KPacked>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kIQ4_XS:
      return KPackedRows<IQ4XSPacked>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ6_K:
      return KPackedRows<Q6KPacked>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ2_K:
      return KPackedRows<Q2KPacked>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ3_K:
      return KPackedRows<Q3KPacked>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ4_0:
      return B32PackedRows<GgmlType::kQ4_0>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ4_1:
      return B32PackedRows<GgmlType::kQ4_1>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ5_0:
      return B32PackedRows<GgmlType::kQ5_0>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kQ5_1:
      return B32PackedRows<GgmlType::kQ5_1>(w, g_begin, g_end, a, n_tokens, y);
    case GgmlType::kIQ4_NL:
      return B32PackedRows<GgmlType::kIQ4_NL>(w, g_begin, g_end, a, n_tokens, y);
    default:
      break;
  }
#endif
  MatMulQuantRowsImpl(w, g_begin * 16, g_end * 16, a, n_tokens, y);
}

bool PackedSupportedImpl(GgmlType type) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
  return PackedGroupBytes(type, 256) > 0;
#else
  return false;
#endif
}

// ---------------------------------------------------------------- float tiles

using DF = hn::ScalableTag<float>;

HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const hwy::float16_t* p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
}
HWY_INLINE hn::Vec<DF> LoadWeights(DF df, const hwy::bfloat16_t* p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(), p));
}
HWY_INLINE float ScalarWeight(const float* p) { return *p; }
HWY_INLINE float ScalarWeight(const hwy::float16_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return HalfToFloatFast(bits);
}
HWY_INLINE float ScalarWeight(const hwy::bfloat16_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return Bf16ToFloat(bits);
}

// F16 weights take f16-rounded activations (GGML converts them to its
// vec_dot_type F16): round to nearest even at 10 fraction bits for normal
// halves, to a multiple of 2^-24 (by adding and removing 0.75, whose ulp that
// is) below 2^-14. Exact for |x| < 65520, beyond which a half would be inf.
// x86 targets with F16C convert in hardware (two instructions instead of eight).
HWY_INLINE hn::Vec<DF> RoundToF16(DF df, hn::Vec<DF> v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2  // F16C: vcvtps2ph rounds to nearest even
  return hn::PromoteTo(df, hn::DemoteTo(hn::Rebind<hwy::float16_t, DF>(), v));
#else
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<13>(bits), hn::Set(du, 1));
  const auto rounded =
      hn::And(hn::Add(bits, hn::Add(hn::Set(du, 0xFFF), lsb)), hn::Set(du, 0xFFFFE000u));
  const auto c = hn::Set(df, 0.75f);
  const auto tiny = hn::Sub(hn::Add(v, c), c);
  return hn::IfThenElse(hn::Lt(hn::Abs(v), hn::Set(df, 0x1p-14f)), tiny, hn::BitCast(df, rounded));
#endif
}
// kRound: the activations still need rounding to f16 (F16 weights without
// scratch for pre-rounded activations).
template <bool kRound>
HWY_INLINE hn::Vec<DF> LoadActs(DF df, const float* p) {
  if constexpr (kRound) return RoundToF16(df, hn::LoadU(df, p));
  return hn::LoadU(df, p);
}
template <bool kRound>
HWY_INLINE float ScalarAct(float v) {
  if constexpr (kRound) return HalfToFloat(FloatToHalf(v));
  return v;
}

// The weight stream of a long row is read in loads aligned to their size
// (split loads cost ~30% of the bandwidth; GGUF aligns tensors to 32 bytes
// only): its first `head` elements, up to the first aligned boundary, form
// one masked vector. Rows of fewer than kAlignFrom vectors (cache-resident,
// where the extra vector would cost more than the split loads) and rows too
// short for it have none (0).
constexpr int64_t kAlignFrom = 16;
template <class WT>
HWY_INLINE int64_t AlignedHead(const WT* row, int64_t cols) {
  constexpr size_t kLoadBytes = hn::MaxLanes(DF()) * sizeof(WT);
  const auto n = static_cast<int64_t>(hn::Lanes(DF()));
  const auto addr = reinterpret_cast<uintptr_t>(row);
  const auto head =
      static_cast<int64_t>((kLoadBytes - addr % kLoadBytes) % kLoadBytes / sizeof(WT));
  return addr % sizeof(WT) == 0 && cols >= kAlignFrom * n ? head : 0;
}

// Whether every row of w has the same head (rows of one tile then share it).
template <class WT>
HWY_INLINE bool RowsShareAlignment(const WeightMatrix& w) {
  const auto n = static_cast<int64_t>(hn::Lanes(DF()));
  const auto load_bytes = static_cast<int64_t>(hn::MaxLanes(DF()) * sizeof(WT));
  return w.cols < kAlignFrom * n || w.cols * static_cast<int64_t>(sizeof(WT)) % load_bytes == 0;
}

// Whether a float row sums in two chains: a property of the row's length and
// the target only, never of the batch. AVX-512 targets keep one: their
// batches use 4 x 4 tiles (16 accumulators), measured 1.5x faster at 16
// tokens than 2 x 4 tiles of two chains, and their decode is as fast with one
// chain. With 16 vector registers (AVX2 and below), long rows (kAlignFrom
// vectors or more) take two, which keep their decode as fast as before and
// their 2 x 2 tiles as fast as one chain's 2 x 4; short (cache-resident)
// rows keep one chain and 2 x 4 tiles, whose decode rows overlap anyway.
template <class WT>
HWY_INLINE bool TwoChains(const WeightMatrix& w) {
  return !kWideRegs && w.cols >= kAlignFrom * static_cast<int64_t>(hn::Lanes(DF()));
}

// The vector at element `at` of R rows x T tokens into acc (kMasked: the
// lanes outside m read as zero).
template <class WT, bool kRound, int R, int T, bool kMasked>
HWY_INLINE void FloatVecInto(const WT* const (&rows)[R], const float* const (&xs)[T], int64_t at,
                             hn::Mask<DF> m, hn::Vec<DF> (&acc)[R][T]) {
  const DF df;
  hn::Vec<DF> wv[R];
  for (int r = 0; r < R; ++r) {
    wv[r] = LoadWeights(df, rows[r] + at);
    if constexpr (kMasked) wv[r] = hn::IfThenElseZero(m, wv[r]);
  }
  for (int t = 0; t < T; ++t) {
    auto xv = LoadActs<kRound>(df, xs[t] + at);
    if constexpr (kMasked) xv = hn::IfThenElseZero(m, xv);
    for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(wv[r], xv, acc[r][t]);
  }
}

// Rows [r0, r0+R) x tokens [t0, t0+T) of y, each weight vector loaded once
// for the T tokens and each activation vector once for the R rows. Every
// output sums in one order, whatever the tile shape: the row's vectors (its
// masked head, AlignedHead; its whole vectors; its masked last one) go into
// one accumulator, or by turns into two (kTwo; the first vector into
// the first), which are then added and their lanes summed. So a row's result
// is the same bits alone (decode) or in any batch. The rows of a tile must
// share their head (RowsShareAlignment, or R == 1).
template <class WT, bool kRound, int R, int T, bool kTwo>
HWY_INLINE void FloatTile(const WeightMatrix& w, int64_t r0, int64_t t0, const float* x, float* y) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = w.cols;
  const WT* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const WT*>(w.data) + (r0 + r) * cols;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = x + (t0 + t) * cols;
  constexpr int kC = kTwo ? 2 : 1, kSecond = kC - 1;  // acc[kSecond]: the second chain
  hn::Vec<DF> acc[kC][R][T];
  for (int c = 0; c < kC; ++c)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[c][r][t] = hn::Zero(df);
  const auto none = hn::FirstN(df, 0);  // the mask of the unmasked vectors (unread)
  const int64_t head = AlignedHead(rows[0], cols);
  int64_t i = 0;
  bool odd = false;  // the next vector goes into the second chain
  if (head > 0) {
    FloatVecInto<WT, kRound, R, T, true>(rows, xs, 0, hn::FirstN(df, static_cast<size_t>(head)),
                                         acc[0]);
    i = head;
    odd = true;
    if (i + n <= cols) {
      FloatVecInto<WT, kRound, R, T, false>(rows, xs, i, none, acc[kSecond]);
      i += n;
      odd = false;
    }
  }
  for (; kTwo && i + 2 * n <= cols; i += 2 * n) {
    FloatVecInto<WT, kRound, R, T, false>(rows, xs, i, none, acc[0]);
    FloatVecInto<WT, kRound, R, T, false>(rows, xs, i + n, none, acc[kSecond]);
  }
  for (; i + n <= cols; i += n) {  // one chain: all; two: the odd one left
    FloatVecInto<WT, kRound, R, T, false>(rows, xs, i, none, acc[0]);
    odd = true;
  }
  if (i < cols && cols >= n) {  // the last vector of the row, masked to the rest
    const auto m = hn::Not(hn::FirstN(df, static_cast<size_t>(i - (cols - n))));
    if (odd) {
      FloatVecInto<WT, kRound, R, T, true>(rows, xs, cols - n, m, acc[kSecond]);
    } else {
      FloatVecInto<WT, kRound, R, T, true>(rows, xs, cols - n, m, acc[0]);
    }
    i = cols;
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      auto total = acc[0][r][t];
      if constexpr (kTwo) total = hn::Add(total, acc[kSecond][r][t]);
      float sum = hn::GetLane(hn::SumOfLanes(df, total));
      for (int64_t k = i; k < cols; ++k)
        sum += ScalarWeight(rows[r] + k) * ScalarAct<kRound>(xs[t][k]);
      y[(t0 + t) * w.rows + r0 + r] = sum;
    }
  }
}

template <class WT, bool kRound, int R, int T, bool kTwo>
HWY_INLINE void FloatTokens(const WeightMatrix& w, int64_t r0, const float* x, int64_t n_tokens,
                            float* y) {
  int64_t t = 0;
  for (; t + T <= n_tokens; t += T) FloatTile<WT, kRound, R, T, kTwo>(w, r0, t, x, y);
  for (; t < n_tokens; ++t) FloatTile<WT, kRound, R, 1, kTwo>(w, r0, t, x, y);
}

// Batches: tiles of 4 rows x 4 tokens (16 accumulators) where 32 vector
// registers hold them, else 2 x 4 of one chain or 2 x 2 of two (8).
template <class WT, bool kRound, bool kTwo>
void FloatRowsOf(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x,
                 int64_t n_tokens, float* y) {
  constexpr int kT = kTwo ? 2 : 4;
  int64_t r = r_begin;
  if (n_tokens == 1) {
    for (; r < r_end; ++r) FloatTile<WT, kRound, 1, 1, kTwo>(w, r, 0, x, y);
  } else if (RowsShareAlignment<WT>(w)) {
    if constexpr (kWideRegs) {
      for (; r + 4 <= r_end; r += 4) FloatTokens<WT, kRound, 4, kT, kTwo>(w, r, x, n_tokens, y);
    }
    for (; r + 2 <= r_end; r += 2) FloatTokens<WT, kRound, 2, kT, kTwo>(w, r, x, n_tokens, y);
  }
  for (; r < r_end; ++r) FloatTokens<WT, kRound, 1, kT, kTwo>(w, r, x, n_tokens, y);
}

template <class WT, bool kRound>
void FloatRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x,
               int64_t n_tokens, float* y) {
  if (TwoChains<WT>(w)) return FloatRowsOf<WT, kRound, true>(w, r_begin, r_end, x, n_tokens, y);
  FloatRowsOf<WT, kRound, false>(w, r_begin, r_end, x, n_tokens, y);
}

void MatMulFloatRowsImpl(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x,
                         int64_t n_tokens, float* y, bool round_acts) {
  switch (w.type) {
    case GgmlType::kF32:
      return FloatRows<float, false>(w, r_begin, r_end, x, n_tokens, y);
    case GgmlType::kF16:
      if (round_acts) return FloatRows<hwy::float16_t, true>(w, r_begin, r_end, x, n_tokens, y);
      return FloatRows<hwy::float16_t, false>(w, r_begin, r_end, x, n_tokens, y);
    case GgmlType::kBF16:
      return FloatRows<hwy::bfloat16_t, false>(w, r_begin, r_end, x, n_tokens, y);
    default:
      return;  // quantized types take MatMulQuantRows
  }
}

void RoundToF16Impl(const float* x, int64_t n, float* out) {
  const DF df;
  const auto l = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + l <= n; i += l) hn::StoreU(RoundToF16(df, hn::LoadU(df, x + i)), df, out + i);
  for (; i < n; ++i) out[i] = HalfToFloat(FloatToHalf(x[i]));
}

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace meshnet::ops::internal {

HWY_EXPORT(QuantizeActsImpl);
HWY_EXPORT(MatMulQuantRowsImpl);
HWY_EXPORT(MatMulFloatRowsImpl);
HWY_EXPORT(RoundToF16Impl);
HWY_EXPORT(MatMulPackedRowsImpl);
HWY_EXPORT(PackedSupportedImpl);

void QuantizeActs(ActFormat fmt, const float* x, int64_t t_begin, int64_t t_end,
                  const QuantActs& a) {
  HWY_DYNAMIC_DISPATCH(QuantizeActsImpl)(fmt, x, t_begin, t_end, a);
}
void MatMulQuantRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                     const QuantActs& acts, int64_t n_tokens, float* y) {
  HWY_DYNAMIC_DISPATCH(MatMulQuantRowsImpl)(w, row_begin, row_end, acts, n_tokens, y);
}
void MatMulFloatRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t n_tokens, float* y, bool round_acts) {
  HWY_DYNAMIC_DISPATCH(MatMulFloatRowsImpl)(w, row_begin, row_end, x, n_tokens, y, round_acts);
}
void RoundToF16(const float* x, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(RoundToF16Impl)(x, n, out);
}
void MatMulPackedRows(const WeightMatrix& w, int64_t g_begin, int64_t g_end, const QuantActs& acts,
                      int64_t n_tokens, float* y) {
  HWY_DYNAMIC_DISPATCH(MatMulPackedRowsImpl)(w, g_begin, g_end, acts, n_tokens, y);
}
bool PackedSupported(GgmlType type) { return HWY_DYNAMIC_DISPATCH(PackedSupportedImpl)(type); }

}  // namespace meshnet::ops::internal
#endif  // HWY_ONCE
