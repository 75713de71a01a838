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
#include <cstring>

#include "hwy/highway.h"
#include "ops/half_inline.h"
#include "ops/matmul_kernels.h"
#include "ops/quantize.h"

HWY_BEFORE_NAMESPACE();
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One int16 vector holds up to a whole 32-block (AVX-512); narrower targets
// take 32 / kN16 chunks per block, each inside one Q6_K scale / Q4 nibble half.
using D16 = hn::CappedTag<int16_t, 32>;
using D32 = hn::Repartition<int32_t, D16>;
using DF32 = hn::Repartition<float, D16>;  // float lanes matching D32
using V16 = hn::Vec<D16>;
constexpr size_t kN16 = hn::MaxLanes(D16());

HWY_INLINE uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// f16 scale at p. AVX2 and later have F16C (one instruction, exact).
HWY_INLINE float LoadF16(const uint8_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(LoadU16(p));
#else
  return HalfToFloatFast(LoadU16(p));
#endif
}

// ---------------------------------------------------------------- activations

void QuantizeActsImpl(const float* x, int64_t cols, int64_t t_begin, int64_t t_end, int16_t* q,
                      float* d, float* dxs) {
  const hn::CappedTag<float, 32> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int16_t, decltype(df)> dq;
  const size_t n = hn::Lanes(df);
  const int64_t nb = cols / 32;
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + t * cols + b * 32;
      int16_t* qb = q + t * cols + b * 32;
      auto vmax = hn::Zero(df);
      for (size_t i = 0; i < 32; i += n) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + i)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float scale = amax / 127.0f;
      const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
      const auto vinv = hn::Set(df, inv);
      auto vsum = hn::Zero(di);
      for (size_t i = 0; i < 32; i += n) {
        const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + i), vinv));
        vsum = hn::Add(vsum, qi);
        hn::StoreU(hn::DemoteTo(dq, qi), dq, qb + i);
      }
      const int32_t sum = hn::GetLane(hn::SumOfLanes(di, vsum));
      d[t * nb + b] = scale;
      dxs[t * nb + b] = scale * static_cast<float>(sum);
    }
  }
}

// ---------------------------------------------------------------- formats
// Each format: kSuper elements per super-block of kBytes, kSub 32-blocks in it;
// Header(p) reads per-32-block float scale and offset; Code(p, h, j, e) returns
// the int16 codes of elements [e, e + Lanes(D16)) of 32-block j.

struct SubScales {
  HWY_ALIGN float scale[8];
  HWY_ALIGN float off[8];
};
using D8F = hn::CappedTag<float, 8>;  // one lane per 32-block of a K super-block

struct Q8_0Fmt {
  static constexpr int kSuper = 32, kBytes = 34, kSub = 1;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) { h->scale[0] = LoadF16(p); }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int, size_t e) {
    return hn::PromoteTo(
        d, hn::LoadU(hn::Rebind<int8_t, D>(), reinterpret_cast<const int8_t*>(p + 2) + e));
  }
};

struct Q4_0Fmt {  // codes are nibble - 8, so no offset term
  static constexpr int kSuper = 32, kBytes = 18, kSub = 1;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) { h->scale[0] = LoadF16(p); }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int, size_t e) {
#if HWY_TARGET != HWY_SCALAR  // (no Combine there; kN16 is 1)
    if constexpr (kN16 == 32) {
      const hn::Half<D> dh;
      const auto bytes = hn::PromoteTo(dh, hn::LoadU(hn::Rebind<uint8_t, hn::Half<D>>(), p + 2));
      const auto codes = hn::Combine(d, hn::ShiftRight<4>(bytes), hn::And(bytes, hn::Set(dh, 0xF)));
      return hn::Sub(codes, hn::Set(d, 8));
    }
#endif
    {
      const auto bytes =
          hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + 2 + (e < 16 ? e : e - 16)));
      const auto codes = e < 16 ? hn::And(bytes, hn::Set(d, 0xF)) : hn::ShiftRight<4>(bytes);
      return hn::Sub(codes, hn::Set(d, 8));
    }
  }
};

struct Q4_KFmt {
  static constexpr int kSuper = 256, kBytes = 144, kSub = 8;
  static constexpr bool kHasOff = true;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    const float d = LoadF16(p);
    const float dmin = LoadF16(p + 2);
    // The 12 packed bytes as three words: bytes 0-3 hold scales 0-3 (low 6
    // bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for mins;
    // bytes 8-11 the low nibbles of scales 4-7 and mins 4-7 (cf. Q4KScaleMin).
    uint32_t u[3];
    std::memcpy(u, p + 4, 12);
    const uint32_t packed[4] = {
        u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4),
        u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)};
    const auto* sc_m = reinterpret_cast<const uint8_t*>(packed);  // 8 scales, then 8 mins
    const D8F d8;
    const hn::Rebind<int32_t, D8F> di;
    const hn::Rebind<uint8_t, D8F> du8;
    for (size_t j = 0; j < 8; j += hn::Lanes(d8)) {
      const auto sc = hn::ConvertTo(d8, hn::PromoteTo(di, hn::LoadU(du8, sc_m + j)));
      const auto m = hn::ConvertTo(d8, hn::PromoteTo(di, hn::LoadU(du8, sc_m + 8 + j)));
      hn::Store(hn::Mul(hn::Set(d8, d), sc), d8, h->scale + j);
      hn::Store(hn::Mul(hn::Set(d8, dmin), m), d8, h->off + j);
    }
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int j, size_t e) {
    const auto bytes =
        hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + 16 + 32 * (j / 2) + e));
    return (j % 2 == 0) ? hn::And(bytes, hn::Set(d, 0xF)) : hn::ShiftRight<4>(bytes);
  }
};

struct Q6_KFmt {
  static constexpr int kSuper = 256, kBytes = 210, kSub = 8;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    const float d = LoadF16(p + 208);
    for (int j = 0; j < 8; ++j) h->scale[j] = d;
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int j, size_t e) {
    const int half = j / 4, quarter = j % 4;
    const auto ql = hn::PromoteTo(
        d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + 64 * half + 32 * (quarter & 1) + e));
    const auto qh = hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + 128 + 32 * half + e));
    const auto lo = quarter < 2 ? hn::And(ql, hn::Set(d, 0xF)) : hn::ShiftRight<4>(ql);
    const auto hi = hn::And(hn::ShiftRightSame(qh, 2 * quarter), hn::Set(d, 3));
    const auto code = hn::Sub(hn::Or(lo, hn::ShiftLeft<4>(hi)), hn::Set(d, 32));
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192 + 8 * half + 2 * quarter);
#if HWY_TARGET != HWY_SCALAR
    if constexpr (kN16 == 32) {  // lanes [0, 16) and [16, 32) have their own scale
      const hn::Half<D> dh;
      return hn::Mul(code, hn::Combine(d, hn::Set(dh, sc[1]), hn::Set(dh, sc[0])));
    }
#endif
    { return hn::Mul(code, hn::Set(d, sc[e / 16])); }
  }
};

// ---------------------------------------------------------------- quant tiles

// Rows [r0, r0+R) x tokens [t0, t0+T) of y (n_tokens, rows). A single-row,
// single-token tile (decode) alternates two accumulators so consecutive
// blocks' FMAs do not wait on each other's latency.
template <class Fmt, int R, int T>
HWY_INLINE void QuantTile(const WeightMatrix& w, int64_t r0, int64_t t0, const QuantActs& a,
                          float* y) {
  constexpr int kAcc = (R * T == 1) ? 2 : 1;
  const D16 d16;
  const D32 d32;
  const DF32 df;
  const D8F d8;
  const int64_t row_bytes = w.cols / Fmt::kSuper * Fmt::kBytes;
  const int64_t nb = w.cols / 32;
  const int64_t n_super = w.cols / Fmt::kSuper;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * row_bytes;
  const int16_t* xq[T];
  const float* xd[T];
  const float* xs[T];
  for (int t = 0; t < T; ++t) {
    xq[t] = a.q + (t0 + t) * a.cols;
    xd[t] = a.d + (t0 + t) * nb;
    xs[t] = a.dxs + (t0 + t) * nb;
  }
  hn::Vec<DF32> acc[kAcc][R][T];
  float corr[R][T];
  hn::Vec<D8F> corr8[R][T];  // K-quants: one lane per sub-block position
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < kAcc; ++k) acc[k][r][t] = hn::Zero(df);
      corr[r][t] = 0.0f;
      corr8[r][t] = hn::Zero(d8);
    }
  // Blocks alternate between accumulators by a compile-time index: with one
  // 32-block per super-block, kStep consecutive super-blocks form one iteration.
  constexpr int kStep = Fmt::kSub == 1 ? kAcc : 1;
  for (int64_t s0 = 0; s0 < n_super; s0 += kStep) {
    for (int u = 0; u < kStep; ++u) {
      const int64_t s = s0 + u;
      if (kStep > 1 && s >= n_super) break;
      SubScales h[R];
      for (int r = 0; r < R; ++r) Fmt::Header(rows[r] + s * Fmt::kBytes, &h[r]);
      // Per (row, token, sub-block): weight scale * activation scale.
      HWY_ALIGN float eff[R][T][Fmt::kSub];
      if constexpr (Fmt::kSub == 8) {
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < T; ++t)
            for (size_t j = 0; j < 8; j += hn::Lanes(d8)) {
              const int64_t b = s * 8 + static_cast<int64_t>(j);
              hn::Store(hn::Mul(hn::Load(d8, h[r].scale + j), hn::LoadU(d8, xd[t] + b)), d8,
                        eff[r][t] + j);
              if constexpr (Fmt::kHasOff) {
                corr8[r][t] =
                    hn::MulAdd(hn::Load(d8, h[r].off + j), hn::LoadU(d8, xs[t] + b), corr8[r][t]);
              }
            }
      } else {
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < T; ++t) {
            eff[r][t][0] = h[r].scale[0] * xd[t][s];
            if constexpr (Fmt::kHasOff) corr[r][t] += h[r].off[0] * xs[t][s];
          }
      }
      HWY_UNROLL(8)
      for (int j = 0; j < Fmt::kSub; ++j) {
        const int64_t b = s * Fmt::kSub + j;
        hn::Vec<D32> sum0[R][T], sum1[R][T];
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < T; ++t) sum0[r][t] = sum1[r][t] = hn::Zero(d32);
        for (size_t e = 0; e < 32; e += kN16) {
          V16 code[R];
          for (int r = 0; r < R; ++r)
            code[r] = Fmt::Code(d16, rows[r] + s * Fmt::kBytes, h[r], j, e);
          for (int t = 0; t < T; ++t) {
            const V16 xv = hn::LoadU(d16, xq[t] + b * 32 + static_cast<int64_t>(e));
            for (int r = 0; r < R; ++r) {
              sum0[r][t] = hn::ReorderWidenMulAccumulate(d32, code[r], xv, sum0[r][t], sum1[r][t]);
            }
          }
        }
        const int k = (u * Fmt::kSub + j) % kAcc;
        for (int t = 0; t < T; ++t)
          for (int r = 0; r < R; ++r) {
            const auto isum = hn::RearrangeToOddPlusEven(sum0[r][t], sum1[r][t]);
            acc[k][r][t] =
                hn::MulAdd(hn::ConvertTo(df, isum), hn::Set(df, eff[r][t][j]), acc[k][r][t]);
          }
      }
    }
  }

  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      auto total = acc[0][r][t];
      for (int k = 1; k < kAcc; ++k) total = hn::Add(total, acc[k][r][t]);
      float off = corr[r][t];
      if constexpr (Fmt::kSub == 8) off += hn::GetLane(hn::SumOfLanes(d8, corr8[r][t]));
      y[(t0 + t) * w.rows + r0 + r] = hn::GetLane(hn::SumOfLanes(df, total)) - off;
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
  switch (w.type) {
    case GgmlType::kQ8_0:
      return QuantRows<Q8_0Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ4_0:
      return QuantRows<Q4_0Fmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ4_K:
      return QuantRows<Q4_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    case GgmlType::kQ6_K:
      return QuantRows<Q6_KFmt>(w, r_begin, r_end, a, n_tokens, y);
    default:
      return;  // float types take MatMulFloatRows
  }
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

template <class WT, int R, int T>
HWY_INLINE void FloatTile(const WeightMatrix& w, int64_t r0, int64_t t0, const float* x, float* y) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = w.cols;
  const WT* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const WT*>(w.data) + (r0 + r) * cols;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = x + (t0 + t) * cols;
  hn::Vec<DF> acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
  int64_t i = 0;
  if constexpr (R * T == 1) {  // decode: 4 independent FMA chains hide the latency
    // Align the weight stream to the load size: split loads cost ~30% of the
    // bandwidth (GGUF aligns tensors to 32 bytes only). The first vector is
    // loaded unaligned and masked to the `head` elements before the boundary.
    constexpr size_t kLoadBytes = hn::MaxLanes(DF()) * sizeof(WT);
    const auto addr = reinterpret_cast<uintptr_t>(rows[0]);
    const auto head =
        static_cast<int64_t>((kLoadBytes - addr % kLoadBytes) % kLoadBytes / sizeof(WT));
    if (addr % sizeof(WT) == 0 && head > 0 && head + n <= cols) {
      const auto m = hn::FirstN(df, static_cast<size_t>(head));
      acc[0][0] = hn::MulAdd(hn::IfThenElseZero(m, LoadWeights(df, rows[0])),
                             hn::IfThenElseZero(m, hn::LoadU(df, xs[0])), acc[0][0]);
      i = head;
    }
    auto a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (; i + 4 * n <= cols; i += 4 * n) {
      acc[0][0] = hn::MulAdd(LoadWeights(df, rows[0] + i), hn::LoadU(df, xs[0] + i), acc[0][0]);
      a1 = hn::MulAdd(LoadWeights(df, rows[0] + i + n), hn::LoadU(df, xs[0] + i + n), a1);
      a2 = hn::MulAdd(LoadWeights(df, rows[0] + i + 2 * n), hn::LoadU(df, xs[0] + i + 2 * n), a2);
      a3 = hn::MulAdd(LoadWeights(df, rows[0] + i + 3 * n), hn::LoadU(df, xs[0] + i + 3 * n), a3);
    }
    for (; i + n <= cols; i += n) {
      a1 = hn::MulAdd(LoadWeights(df, rows[0] + i), hn::LoadU(df, xs[0] + i), a1);
    }
    if (i < cols && cols >= n) {  // the last vector of the row, masked to the rest
      const int64_t last = cols - n;
      const auto m = hn::Not(hn::FirstN(df, static_cast<size_t>(i - last)));
      a2 = hn::MulAdd(hn::IfThenElseZero(m, LoadWeights(df, rows[0] + last)),
                      hn::IfThenElseZero(m, hn::LoadU(df, xs[0] + last)), a2);
      i = cols;
    }
    acc[0][0] = hn::Add(hn::Add(acc[0][0], a1), hn::Add(a2, a3));
  }
  for (; i + n <= cols; i += n) {
    hn::Vec<DF> wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadWeights(df, rows[r] + i);
    for (int t = 0; t < T; ++t) {
      const auto xv = hn::LoadU(df, xs[t] + i);
      for (int r = 0; r < R; ++r) acc[r][t] = hn::MulAdd(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
      for (int64_t k = i; k < cols; ++k) sum += ScalarWeight(rows[r] + k) * xs[t][k];
      y[(t0 + t) * w.rows + r0 + r] = sum;
    }
  }
}

template <class WT, int R, int T>
HWY_INLINE void FloatTokens(const WeightMatrix& w, int64_t r0, const float* x, int64_t n_tokens,
                            float* y) {
  int64_t t = 0;
  for (; t + T <= n_tokens; t += T) FloatTile<WT, R, T>(w, r0, t, x, y);
  for (; t < n_tokens; ++t) FloatTile<WT, R, 1>(w, r0, t, x, y);
}

template <class WT>
void FloatRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x,
               int64_t n_tokens, float* y) {
  int64_t r = r_begin;
  if (n_tokens == 1) {
    for (; r < r_end; ++r) FloatTile<WT, 1, 1>(w, r, 0, x, y);
  } else {
    if constexpr (kWideRegs) {
      for (; r + 4 <= r_end; r += 4) FloatTokens<WT, 4, 4>(w, r, x, n_tokens, y);
    }
    for (; r + 2 <= r_end; r += 2) FloatTokens<WT, 2, 4>(w, r, x, n_tokens, y);
  }
  for (; r < r_end; ++r) FloatTokens<WT, 1, 4>(w, r, x, n_tokens, y);
}

void MatMulFloatRowsImpl(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x,
                         int64_t n_tokens, float* y) {
  switch (w.type) {
    case GgmlType::kF32:
      return FloatRows<float>(w, r_begin, r_end, x, n_tokens, y);
    case GgmlType::kF16:
      return FloatRows<hwy::float16_t>(w, r_begin, r_end, x, n_tokens, y);
    case GgmlType::kBF16:
      return FloatRows<hwy::bfloat16_t>(w, r_begin, r_end, x, n_tokens, y);
    default:
      return;  // quantized types take MatMulQuantRows
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace meshnet::ops::internal {

HWY_EXPORT(QuantizeActsImpl);
HWY_EXPORT(MatMulQuantRowsImpl);
HWY_EXPORT(MatMulFloatRowsImpl);

void QuantizeActs(const float* x, int64_t cols, int64_t t_begin, int64_t t_end, int16_t* q,
                  float* d, float* dxs) {
  HWY_DYNAMIC_DISPATCH(QuantizeActsImpl)(x, cols, t_begin, t_end, q, d, dxs);
}
void MatMulQuantRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                     const QuantActs& acts, int64_t n_tokens, float* y) {
  HWY_DYNAMIC_DISPATCH(MatMulQuantRowsImpl)(w, row_begin, row_end, acts, n_tokens, y);
}
void MatMulFloatRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, const float* x,
                     int64_t n_tokens, float* y) {
  HWY_DYNAMIC_DISPATCH(MatMulFloatRowsImpl)(w, row_begin, row_end, x, n_tokens, y);
}

}  // namespace meshnet::ops::internal
#endif  // HWY_ONCE
