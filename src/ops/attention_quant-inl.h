// Internal: the q8_0 / q4_0 pieces of the attention kernels
// (attention_kernels.cc), compiled once per Highway target. Block layout and
// quantizers: ops/kv_quant.h.
//
// Q.K: the query head is quantized once per kernel call (QuantizeQueryHead:
// int16 codes, one float scale per 32-block with the attention scale folded
// in). Per key and block, the key's int8 codes (q4_0: nibble - 8) are widened
// to int16 and multiplied with the query's pairwise into int32 lanes
// (ReorderWidenMulAccumulate, pmaddwd: exact for every code, -128 included),
// converted once per block and accumulated times (query scale x key scale) in
// float lanes, summed once per key.
// V: per position and block the codes are widened to float and accumulated
// into the float output times (probability x block scale): softmax and every
// sum stay in f32.
// A head_dim that is not a multiple of 32 ends in a short block, decoded by
// the scalar KvBlockCodes into a zero-padded buffer (loads never run past a
// head).
//
// Per-target include guard (Highway's -inl.h convention).
#if defined(MESHNET_OPS_ATTENTION_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MESHNET_OPS_ATTENTION_QUANT_INL_H_
#undef MESHNET_OPS_ATTENTION_QUANT_INL_H_
#else
#define MESHNET_OPS_ATTENTION_QUANT_INL_H_
#endif

#include <cstring>

#include "hwy/highway.h"
#include "ops/half_inline.h"
#include "ops/kv_quant.h"
#include "util/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// int16 lanes per step of a block's dot: a whole q8_0 block per 512-bit
// vector; q4_0's 16 bytes of nibbles per 256-bit vector.
template <KvDtype kDt>
using QTag = hn::CappedTag<int16_t, kDt == KvDtype::kQ8_0 ? 32 : 16>;
template <KvDtype kDt>
using QFloat = hn::Repartition<float, QTag<kDt>>;
// Bytes of a full block (an f16 scale and the codes).
template <KvDtype kDt>
inline constexpr int kBlockBytes = kDt == KvDtype::kQ8_0 ? 34 : 18;

// A block's f16 scale (one F16C conversion where the target has it).
HWY_INLINE float BlockScale(const uint8_t* blk) {
  uint16_t d;
  std::memcpy(&d, blk, 2);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(d);
#else
  return HalfToFloatFast(d);
#endif
}

// int32 lanes summing to the dot of qc[0, 32) with 32 int8 codes.
template <class D16>
HWY_INLINE hn::Vec<hn::Repartition<int32_t, D16>> DotCodes(D16 d16, const int16_t* qc,
                                                           const int8_t* codes) {
  const hn::Repartition<int32_t, D16> d32;
  const hn::Rebind<int8_t, D16> d8;
  auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
  for (size_t i = 0; i < kKvQuantBlock; i += hn::Lanes(d16)) {
    const auto k = hn::PromoteTo(d16, hn::LoadU(d8, codes + i));
    s0 = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, qc + i), k, s0, s1);
  }
  return hn::Add(s0, s1);
}

// The same for q4_0's 16 bytes of nibbles (value i < 16 in byte i's low
// nibble, value 16 + i in its high one; code - 8).
template <class D16>
HWY_INLINE hn::Vec<hn::Repartition<int32_t, D16>> DotNibbles(D16 d16, const int16_t* qc,
                                                             const uint8_t* bytes) {
  const hn::Repartition<int32_t, D16> d32;
  const hn::RebindToUnsigned<D16> du16;
  const hn::Rebind<uint8_t, D16> du8;
  const auto mask = hn::Set(d16, 15), eight = hn::Set(d16, 8);
  auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
  for (size_t i = 0; i < kKvQuantBlock / 2; i += hn::Lanes(d16)) {
    const auto b = hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(du8, bytes + i)));
    s0 = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, qc + i),
                                       hn::Sub(hn::And(b, mask), eight), s0, s1);
    s0 = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, qc + 16 + i),
                                       hn::Sub(hn::ShiftRight<4>(b), eight), s0, s1);
  }
  return hn::Add(s0, s1);
}

// Float lanes of one key head's score: qs[b] * d_k[b] * (block b's integer
// dot), over its blocks.
template <KvDtype kDt>
HWY_INLINE hn::Vec<QFloat<kDt>> KeyLanes(const int16_t* qc, const float* qs, const uint8_t* k,
                                         int hd) {
  const QTag<kDt> d16;
  const QFloat<kDt> df;
  auto acc = hn::Zero(df);
  const int full = hd / kKvQuantBlock;
  for (int b = 0; b < full; ++b) {
    const uint8_t* blk = k + b * kBlockBytes<kDt>;
    const int16_t* qb = qc + kKvQuantBlock * b;
    hn::Vec<hn::Repartition<int32_t, QTag<kDt>>> isum;
    if constexpr (kDt == KvDtype::kQ8_0) {
      isum = DotCodes(d16, qb, reinterpret_cast<const int8_t*>(blk + 2));
    } else {
      isum = DotNibbles(d16, qb, blk + 2);
    }
    acc = hn::MulAdd(hn::Set(df, qs[b] * BlockScale(blk)), hn::ConvertTo(df, isum), acc);
  }
  if (full * kKvQuantBlock < hd) {  // the short last block
    HWY_ALIGN int8_t codes[kKvQuantBlock] = {};
    const float d = KvBlockCodes(kDt, k, hd, full, codes);
    const auto isum = DotCodes(d16, qc + kKvQuantBlock * full, codes);
    acc = hn::MulAdd(hn::Set(df, qs[full] * d), hn::ConvertTo(df, isum), acc);
  }
  return acc;
}

// out[r] = the sum of a_r's lanes, four vectors at once (horizontal adds on
// x86: a third of four separate reductions' shuffles). Each sum's order
// depends only on its own vector, not on the other three.
template <class DF>
HWY_INLINE void SumOfFour(DF df, hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2, hn::Vec<DF> a3,
                          float* out) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  constexpr size_t kLanes = hn::MaxLanes(DF());
  if constexpr (kLanes == 4) {
    const __m128 t0 = _mm_hadd_ps(a0.raw, a1.raw), t1 = _mm_hadd_ps(a2.raw, a3.raw);
    _mm_storeu_ps(out, _mm_hadd_ps(t0, t1));
    return;
  }
#if HWY_TARGET <= HWY_AVX2
  if constexpr (kLanes == 8 || kLanes == 16) {
    __m256 h[4];
    const hn::Vec<DF> a[4] = {a0, a1, a2, a3};
    for (int r = 0; r < 4; ++r) {
      if constexpr (kLanes == 16) {
#if HWY_TARGET <= HWY_AVX3
        h[r] = _mm256_add_ps(_mm512_castps512_ps256(a[r].raw), _mm512_extractf32x8_ps(a[r].raw, 1));
#endif
      } else {
        h[r] = a[r].raw;
      }
    }
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
    return;
  }
#endif
#endif
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
}

// s[j] = score of key head krows[j] (j < np), four keys' chains interleaved;
// the last np % 4 keys padded with zeros, so that every key is summed alike.
template <KvDtype kDt>
HWY_INLINE void QuantScores(const int16_t* qc, const float* qs, const uint8_t* const* krows, int np,
                            int hd, float* s) {
  const QFloat<kDt> df;
  int j = 0;
  for (; j + 4 <= np; j += 4) {
    SumOfFour(df, KeyLanes<kDt>(qc, qs, krows[j], hd), KeyLanes<kDt>(qc, qs, krows[j + 1], hd),
              KeyLanes<kDt>(qc, qs, krows[j + 2], hd), KeyLanes<kDt>(qc, qs, krows[j + 3], hd),
              s + j);
  }
  if (j == np) return;
  hn::Vec<QFloat<kDt>> a[3] = {hn::Zero(df), hn::Zero(df), hn::Zero(df)};
  for (int r = 0; j + r < np; ++r) a[r] = KeyLanes<kDt>(qc, qs, krows[j + r], hd);
  float r4[4];
  SumOfFour(df, a[0], a[1], a[2], hn::Zero(df), r4);
  for (int r = 0; j + r < np; ++r) s[j + r] = r4[r];
}

using DV = hn::CappedTag<float, 16>;

// Codes [i, i + lanes) of a full block's code bytes as int32 (q4_0: - 8).
template <KvDtype kDt>
HWY_INLINE hn::Vec<hn::Rebind<int32_t, DV>> BlockCodes(const uint8_t* codes, size_t i) {
  const hn::Rebind<int32_t, DV> di;
  if constexpr (kDt == KvDtype::kQ8_0) {
    return hn::PromoteTo(
        di, hn::LoadU(hn::Rebind<int8_t, DV>(), reinterpret_cast<const int8_t*>(codes) + i));
  } else {
    const hn::Rebind<uint8_t, DV> du8;
    const auto eight = hn::Set(di, 8);
    if (i < kKvQuantBlock / 2) {
      return hn::Sub(hn::And(hn::PromoteTo(di, hn::LoadU(du8, codes + i)), hn::Set(di, 15)), eight);
    }
    return hn::Sub(hn::ShiftRight<4>(hn::PromoteTo(di, hn::LoadU(du8, codes + i - 16))), eight);
  }
}

// o[0, hd) += sum over j < np of p[j] * V head vrows[j], block by block: a
// block's 32 outputs stay in registers over the positions.
template <KvDtype kDt>
HWY_INLINE void QuantAccumulateV(const float* p, const uint8_t* const* vrows, int np, int hd,
                                 float* o) {
  const DV df;
  constexpr size_t kL = hn::MaxLanes(DV());
  constexpr int kVecs = static_cast<int>(kKvQuantBlock / kL);
  const int full = hd / kKvQuantBlock;
  for (int b = 0; b < full; ++b) {
    float* ob = o + kKvQuantBlock * b;
    hn::Vec<DV> acc[kVecs];
    for (int v = 0; v < kVecs; ++v) acc[v] = hn::LoadU(df, ob + v * kL);
    for (int j = 0; j < np; ++j) {
      const uint8_t* blk = vrows[j] + b * kBlockBytes<kDt>;
      const auto w = hn::Set(df, p[j] * BlockScale(blk));
      for (int v = 0; v < kVecs; ++v) {
        acc[v] = hn::MulAdd(w, hn::ConvertTo(df, BlockCodes<kDt>(blk + 2, v * kL)), acc[v]);
      }
    }
    for (int v = 0; v < kVecs; ++v) hn::StoreU(acc[v], df, ob + v * kL);
  }
  const int n = hd - full * kKvQuantBlock;
  if (n == 0) return;
  float* ob = o + kKvQuantBlock * full;  // the short last block
  for (int j = 0; j < np; ++j) {
    HWY_ALIGN int8_t codes[kKvQuantBlock] = {};
    const float w = p[j] * KvBlockCodes(kDt, vrows[j], hd, full, codes);
    const hn::Rebind<int32_t, DV> di;
    const hn::Rebind<int8_t, DV> d8;
    int i = 0;
    for (; i + static_cast<int>(kL) <= n; i += static_cast<int>(kL)) {
      const auto c = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, codes + i)));
      hn::StoreU(hn::MulAdd(hn::Set(df, w), c, hn::LoadU(df, ob + i)), df, ob + i);
    }
    for (; i < n; ++i) ob[i] += w * static_cast<float>(codes[i]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_ATTENTION_QUANT_INL_H_
