// Internal: int8 matmul kernels for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K) and IQ4_XS on the x86 Highway targets with AVX2 (AVX2 and the AVX-512
// targets, which run them on 256-bit vectors). Included by matmul_kernels.cc
// once per target after matmul_x86-inl.h, whose helpers it uses; other targets
// keep the portable int16 QuantTile there. Intrinsics for the same reason as
// there: vpmaddubsw is not exposed by Debian's Highway.
//
// Per 256-element super-block and token: each 32-block's codes are one vector
// of bytes, multiplied with the int8 activations by vpmaddubsw (int16 pair
// sums), then by the 16-block scales and summed pairwise by vpmaddwd into an
// int32 sum over the super-block (exact), scaled once by d * d_x, as GGML
// does. The cost is in those two multiplies (one port on the machines we
// measured), so everything else per block is kept to a few cheap ops:
// - Codes are unsigned wherever the format allows: Q3_K's code + 4 and Q6_K's
//   code + 32 (no sign trick), the constant going into the offset term with
//   Q4_K/Q5_K's and Q2_K's mins. The offset term of a super-block is one or
//   two float FMAs of its per-sub-block offsets with the activations'
//   precomputed d * sum(q) (per 32-block, or per 16-block).
// - The scales are unpacked once per super-block into one int16 vector (lane
//   0 holds the even 16-blocks' scales, lane 1 the odd ones'), so a block's
//   scale vector is one in-lane byte shuffle.
// A tile is one weight row x T tokens: the block's codes and scales are
// decoded once and reused for the T tokens (T = 1 is the decode matvec).
//
// Per-target include guard (Highway's -inl.h convention).
#if defined(MESHNET_OPS_MATMUL_KQUANT_X86_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MESHNET_OPS_MATMUL_KQUANT_X86_INL_H_
#undef MESHNET_OPS_MATMUL_KQUANT_X86_INL_H_
#else
#define MESHNET_OPS_MATMUL_KQUANT_X86_INL_H_
#endif

#include <cstring>
#include <type_traits>
#include <utility>

#include "hwy/highway.h"
#include "ops/matmul_formats-inl.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_x86-inl.h"

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
// Highway 1.0.3 compiles AVX3_DL without avx512vnni (it names avxvnni, the VEX
// form), though its CPU check requires AVX512-VNNI: added for the kernels here.
#pragma GCC target("avx512vnni")
#endif
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// A super-block's float scale d, its 16-block scales as int16 (lane 0 word j:
// 16-block 2j's, lane 1 word j: 16-block 2j+1's, i.e. 32-block j's two halves)
// and the offsets subtracted from the dot: off[0] per 32-block (kOff == 1,
// times the activations' per-32-block d*sum(q)) or off[0..1] per 16-block
// (kOff == 2, times the per-16-block d*sum(q)).
struct KHead {
  float d;
  __m256i sc;
  __m256 off[2];
};

// 16 int8 scales of the 16-blocks, in order.
HWY_INLINE __m256i Scales16(__m128i sc) {
  const __m128i deinterleave = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, deinterleave));
}
// 8 int16 scales of the 32-blocks (both halves of a 32-block share one).
HWY_INLINE __m256i Scales32(__m128i sc16) { return _mm256_set_m128i(sc16, sc16); }

// c times the 16 int8 values of v, as floats (off[0]: 0-7, off[1]: 8-15).
HWY_INLINE void Offsets16(__m128i v, float c, __m256* off) {
  const __m256 vc = _mm256_set1_ps(c);
  off[0] = _mm256_mul_ps(vc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
  off[1] = _mm256_mul_ps(vc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
}

// The int16 scales of 32-block J's pair sums (word J of each lane, broadcast).
template <int J>
HWY_INLINE __m256i BlockScale(const KHead& h) {
  return _mm256_shuffle_epi8(h.sc,
                             _mm256_set1_epi16(static_cast<int16_t>((2 * J + 1) << 8 | 2 * J)));
}

// Q2_K/Q3_K: 32-block J's 2-bit codes are bits 2*(J%4) of 32 bytes at qs + 32*(J/4).
template <int J>
HWY_INLINE __m256i TwoBits(const uint8_t* qs) {
  return _mm256_and_si256(ShiftBits<-2 * (J % 4)>(Load32(qs + 32 * (J / 4))), Bytes(3));
}

// Q4_K/Q5_K's 12 packed scale bytes at p: bytes 0-7 the 6-bit scales, 8-15
// the mins (the layout of Q4KPackedScales, in two 64-bit words).
HWY_INLINE __m128i Q4KScaleBytes(const uint8_t* p) {
  uint64_t u01;
  uint32_t u2;
  std::memcpy(&u01, p, 8);
  std::memcpy(&u2, p + 8, 4);
  const uint64_t u0 = u01 & 0xFFFFFFFFu, u1 = u01 >> 32;
  // Scales / mins 4-7: low nibbles from u2, top 2 bits from bits 6-7 of u0 / u1.
  const uint64_t hi_sc = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u);
  const uint64_t hi_m = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
  const uint64_t sc = (u0 & 0x3F3F3F3Fu) | hi_sc << 32;
  const uint64_t m = (u1 & 0x3F3F3F3Fu) | hi_m << 32;
  return _mm_set_epi64x(static_cast<int64_t>(m), static_cast<int64_t>(sc));
}

struct KQ4_K {  // value = d*sc*code - dmin*m per 32-block
  static constexpr int kBytes = 144, kOff = 1, kFold = 4;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    const __m128i sm = Q4KScaleBytes(p + 4);
    h->d = LoadF16(p);
    h->sc = Scales32(_mm_cvtepu8_epi16(sm));
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
    h->off[0] = _mm256_mul_ps(_mm256_set1_ps(LoadF16(p + 2)), mins);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    const __m256i v = Load32(p + 16 + 32 * (J / 2));
    return _mm256_and_si256(J % 2 == 0 ? v : _mm256_srli_epi16(v, 4), Bytes(0xF));
  }
};

struct KQ5_K {  // Q4_K with a fifth code bit: bit J of qh[e]
  static constexpr int kBytes = 176, kOff = 1, kFold = 4;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) { KQ4_K::Head(p, h); }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    const __m256i v = Load32(p + 48 + 32 * (J / 2));
    const __m256i lo = _mm256_and_si256(J % 2 == 0 ? v : _mm256_srli_epi16(v, 4), Bytes(0xF));
    return _mm256_or_si256(lo, _mm256_and_si256(ShiftBits<4 - J>(Load32(p + 16)), Bytes(0x10)));
  }
};

// Q6_K: value = d*sc*(code - 32) per 16-block; code 0..63 here, the -32 is
// the offset 32*d*sc.
struct KQ6_K {
  static constexpr int kBytes = 210, kOff = 2, kFold = 2;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p + 208);
    const __m128i sc = Load16(p + 192);
    h->sc = Scales16(sc);
    Offsets16(sc, 32.0f * h->d, h->off);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    constexpr int kHalf = J / 4, kQ = J % 4;
    const __m256i ql = Load32(p + 64 * kHalf + 32 * (kQ & 1));
    const __m256i lo = _mm256_and_si256(kQ < 2 ? ql : _mm256_srli_epi16(ql, 4), Bytes(0xF));
    const __m256i hi =
        _mm256_and_si256(ShiftBits<4 - 2 * kQ>(Load32(p + 128 + 32 * kHalf)), Bytes(0x30));
    return _mm256_or_si256(lo, hi);
  }
};

struct KQ2_K {  // value = d*sc*code - dmin*m per 16-block
  static constexpr int kBytes = 84, kOff = 2, kFold = 4;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p + 80);
    const __m128i raw = Load16(p), nib = _mm_set1_epi8(0xF);
    h->sc = Scales16(_mm_and_si128(raw, nib));
    Offsets16(_mm_and_si128(_mm_srli_epi16(raw, 4), nib), LoadF16(p + 82), h->off);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    return TwoBits<J>(p + 16);
  }
};

// Q3_K: value = d*(sc-32)*code per 16-block, code in [-4, 3]; here code + 4
// (the 2 low bits and hmask's bit 2), the -4 is the offset 4*d*(sc-32).
struct KQ3_K {
  static constexpr int kBytes = 110, kOff = 2, kFold = 4;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p + 108);
    // As Q3KScales: low nibbles of scales j < 8 and j + 8 in byte j % 8; the
    // top 2 bits of scale j at bits 2*(j/4) of byte 8 + j%4.
    const __m128i nib = _mm_set1_epi8(0xF);
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 96));
    const __m128i lo =
        _mm_unpacklo_epi64(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
    uint32_t top;
    std::memcpy(&top, p + 104, 4);
    const __m128i hi = _mm_and_si128(
        _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(top)), _mm_setr_epi32(0, 2, 4, 6)),
        _mm_set1_epi8(3));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    h->sc = Scales16(sc);
    Offsets16(sc, 4.0f * h->d, h->off);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {  // bit 2 of element e: bit J of hmask[e]
    const __m256i high = _mm256_and_si256(ShiftBits<2 - J>(Load32(p)), Bytes(4));
    return _mm256_or_si256(TwoBits<J>(p + 32), high);
  }
};

// IQ4_XS: value = d*(ls-32)*level per 32-block; the levels stay signed (their
// range is too wide for an unsigned offset), through the sign trick.
struct KIQ4_XS {
  static constexpr int kBytes = 136, kOff = 0, kFold = 1;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p);
    // ls_j = (4 bits of byte 4 + j/2 at 4*(j%2)) | (bits 2j, 2j+1 of the u16 at p + 2) << 4.
    uint32_t lo_bytes;
    std::memcpy(&lo_bytes, p + 4, 4);
    const __m128i v = _mm_cvtsi32_si128(static_cast<int>(lo_bytes)), nib = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_cvtepu8_epi16(
        _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib)));
    // Word j: the u16 shifted left by 14 - 2j puts bits 2j, 2j+1 at 14, 15.
    const __m128i up = _mm_mullo_epi16(
        _mm_set1_epi16(static_cast<int16_t>(LoadU16(p + 2))),
        _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(up, 10), _mm_set1_epi16(0x30));
    h->sc = Scales32(_mm_sub_epi16(_mm_or_si128(lo, hi), _mm_set1_epi16(32)));
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    return Iq4Levels32(Nibbles32(p + 8 + 16 * J));
  }
};

// Activations: TokenPtrs (matmul_x86-inl.h); for q8_K, d holds the
// super-block's scale repeated per 32-block.

// The int16 pair sums of 32-block J's codes (unsigned) and 32 activations.
HWY_INLINE __m256i UPairs(__m256i code, const int8_t* x) {
  return _mm256_maddubs_epi16(code, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
// Sums of a and b's words 4 apart within a 128-bit lane, interleaved: word
// 2i holds a's, 2i + 1 b's. Then the same for 32-bit pairs: a vector of
// 16-bit partial sums of 4 blocks (word i % 4 of each lane: block i % 4).
HWY_INLINE __m256i Fold16(__m256i a, __m256i b) {
  return _mm256_add_epi16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
}
HWY_INLINE __m256i Fold32(__m256i a, __m256i b) {
  return _mm256_add_epi16(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}

// Blocks 4G..4G+3 of super-block s at p into the int32 sums of T tokens.
// The pair sums of 4 blocks are folded in int16 (exact while a code times
// 8 activations fits: codes < 32) by in-lane unpacks, which run beside the
// multiplies, so a token needs 4 vpmaddubsw and one vpmaddwd per 4 blocks
// instead of 4 of each; the scales sc4 are words (s_4G .. s_4G+3) repeated.
template <class F, int T, int G>
HWY_INLINE void KFold4(const uint8_t* p, __m256i sc4, const TokenPtrs<T>& x, int64_t s,
                       __m256i* isum) {
  const __m256i c0 = F::template Codes<4 * G>(p), c1 = F::template Codes<4 * G + 1>(p);
  const __m256i c2 = F::template Codes<4 * G + 2>(p), c3 = F::template Codes<4 * G + 3>(p);
  for (int t = 0; t < T; ++t) {
    const int8_t* q = x.q[t] + s * 256 + 128 * G;
    const __m256i a01 = Fold16(UPairs(c0, q), UPairs(c1, q + 32));
    const __m256i a23 = Fold16(UPairs(c2, q + 64), UPairs(c3, q + 96));
    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(Fold32(a01, a23), sc4));
  }
}
// Blocks 2M, 2M+1 (codes < 64: a code times 4 activations fits int16).
template <class F, int T, int M>
HWY_INLINE void KFold2(const uint8_t* p, const KHead& h, const TokenPtrs<T>& x, int64_t s,
                       __m256i* isum) {
  const __m256i c0 = F::template Codes<2 * M>(p), c1 = F::template Codes<2 * M + 1>(p);
  const __m256i sc2 = _mm256_shuffle_epi32(h.sc, M * 0x55);
  for (int t = 0; t < T; ++t) {
    const int8_t* q = x.q[t] + s * 256 + 64 * M;
    const __m256i a01 = Fold16(UPairs(c0, q), UPairs(c1, q + 32));
    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(a01, sc2));
  }
}

// The 8 blocks of super-block s at p into the int32 sums of T tokens.
template <class F, int T>
HWY_INLINE void KBlocks(const uint8_t* p, const KHead& h, const TokenPtrs<T>& x, int64_t s,
                        __m256i* isum) {
  if constexpr (F::kFold == 4) {
    KFold4<F, T, 0>(p, _mm256_shuffle_epi32(h.sc, 0x44), x, s, isum);
    KFold4<F, T, 1>(p, _mm256_shuffle_epi32(h.sc, 0xEE), x, s, isum);
  } else if constexpr (F::kFold == 2) {
    KFold2<F, T, 0>(p, h, x, s, isum);
    KFold2<F, T, 1>(p, h, x, s, isum);
    KFold2<F, T, 2>(p, h, x, s, isum);
    KFold2<F, T, 3>(p, h, x, s, isum);
  } else {  // signed codes, one vpmaddwd per block
    auto block = [&]<int J>(std::integral_constant<int, J>) {
      const __m256i code = F::template Codes<J>(p);
      const __m256i code_abs = _mm256_sign_epi8(code, code);
      const __m256i sc = BlockScale<J>(h);
      for (int t = 0; t < T; ++t) {
        const __m256i pairs = PairSums<true>(code_abs, code, x.q[t] + s * 256 + 32 * J);
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs, sc));
      }
    };
    [&]<int... J>(std::integer_sequence<int, J...>) {
      (block(std::integral_constant<int, J>()), ...);
    }
    (std::make_integer_sequence<int, 8>());
  }
}

#if HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
// AVX-512 with VNNI: two 32-blocks per 512-bit vector. Per pair and token
// one vpmaddubsw (int16 pair sums, exact as above) and one vpdpwssd (times
// the 16-block scales, summed into int32 and accumulated in one instruction);
// the pair's codes and scales are decoded once for the T tokens.
#define MESHNET_KQUANT_PAIRS 1

// The scales of blocks 2P, 2P+1 as int16 words: 128-bit lane L holds
// 16-block 4P + L's (h.sc word (i % 2) * 8 + i / 2 for 16-block i).
template <int P>
HWY_INLINE __m512i PairScales(const KHead& h) {
  constexpr auto kW = [](int lane) {
    return static_cast<short>((4 * P + lane) % 2 * 8 + (4 * P + lane) / 2);
  };
  const __m512i idx =
      _mm512_set_epi16(kW(3), kW(3), kW(3), kW(3), kW(3), kW(3), kW(3), kW(3), kW(2), kW(2), kW(2),
                       kW(2), kW(2), kW(2), kW(2), kW(2), kW(1), kW(1), kW(1), kW(1), kW(1), kW(1),
                       kW(1), kW(1), kW(0), kW(0), kW(0), kW(0), kW(0), kW(0), kW(0), kW(0));
  return _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(h.sc));
}

// The 8 blocks of super-block s at p into the int32 sums of T tokens.
template <class F, int T>
HWY_INLINE void KPairBlocks(const uint8_t* p, const KHead& h, const TokenPtrs<T>& x, int64_t s,
                            __m512i* isum) {
  auto pair = [&]<int P>(std::integral_constant<int, P>) {
    __m512i code = _mm512_inserti64x4(_mm512_castsi256_si512(F::template Codes<2 * P>(p)),
                                      F::template Codes<2 * P + 1>(p), 1);
    __mmask64 neg = 0;
    if constexpr (F::kOff == 0) {  // IQ4_XS: signed levels, the sign trick by mask
      neg = _mm512_movepi8_mask(code);
      code = _mm512_abs_epi8(code);
    }
    const __m512i sc = PairScales<P>(h);
    for (int t = 0; t < T; ++t) {
      __m512i xv = _mm512_loadu_si512(x.q[t] + s * 256 + 64 * P);
      if constexpr (F::kOff == 0) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
      isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(code, xv), sc);
    }
  };
  [&]<int... P>(std::integer_sequence<int, P...>) { (pair(std::integral_constant<int, P>()), ...); }
  (std::make_integer_sequence<int, 4>());
}

// Q4_K, Q5_K and IQ4_XS packed 16 rows at a time (kPackedQ4KBlock,
// kPackedQ5KBlock, kPackedIQ4XSBlock per super-block): per 32-block, one
// vpdpbusd per 4 columns and token for all 16 rows (the codes unsigned, the
// token's 4 activation bytes broadcast), the 16 rows' sums times their scales
// (vpmulld) summed exactly over the super-block, then one convert and FMA by
// d * d_x, and the offsets' term by FMA, as the unpacked tile does: Q4_K and
// Q5_K's dmin * m_j, IQ4_XS's 128 * d * (ls_j - 32) (its levels are taken +
// 128, unsigned), times the tokens' d*sum(q) of 32-block j.
struct Q4KPacked {
  static constexpr int64_t kBlock = kPackedQ4KBlock, kJ = 256;
  static constexpr bool kFifth = false, kTable = false;
};
struct Q5KPacked {  // Q4_K's, with a vector of fifth bits after each 32-block's codes
  static constexpr int64_t kBlock = kPackedQ5KBlock, kJ = 320;
  static constexpr bool kFifth = true, kTable = false;
};
struct IQ4XSPacked {  // int8 scales ls - 32, then d
  static constexpr int64_t kBlock = kPackedIQ4XSBlock, kJ = 256;
  static constexpr bool kFifth = false, kTable = true;
};

template <class P, int T>
HWY_INLINE void K4PackedOffsets(const uint8_t* blk, const float* const* xs, int64_t s,
                                __m512* acc) {
  constexpr int64_t kSc = 8 * P::kJ;
  __m512 scale;  // times the offset bytes: dmin, or 128 * d
  if constexpr (P::kTable) {
    scale = _mm512_mul_ps(
        _mm512_set1_ps(128.0f),
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + kSc + 128))));
  } else {
    scale = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + kSc + 288)));
  }
  for (int j = 0; j < 8; ++j) {
    __m512i bytes;
    if constexpr (P::kTable) {
      bytes = _mm512_cvtepi8_epi32(
          _mm_load_si128(reinterpret_cast<const __m128i*>(blk + kSc + 16 * j)));
    } else {
      bytes = _mm512_cvtepu8_epi32(
          _mm_load_si128(reinterpret_cast<const __m128i*>(blk + kSc + 128 + 16 * j)));
    }
    const __m512 off = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(bytes));
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fnmadd_ps(off, _mm512_set1_ps(xs[t][s * 8 + j]), acc[t]);
    }
  }
}

template <class P, int T>
HWY_INLINE void K4PackedTile(const uint8_t* group, int64_t ns, const QuantActs& a, int64_t t0,
                             float* y, int64_t y_stride) {
  constexpr int64_t kSc = 8 * P::kJ;
  const TokenPtrs<T> x(a, t0);
  const __m512i table = P::kTable ? Iq4UnsignedTable() : _mm512_setzero_si512();
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    const uint8_t* blk = group + s * P::kBlock;
    PrefetchAhead(blk, P::kBlock);
    __m512i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* bj = blk + P::kJ * j;
      __m512i fifth = _mm512_setzero_si512();
      if constexpr (P::kFifth) fifth = _mm512_load_si512(bj + 256);
      __m512i dot[T];
      const int8_t* xj[T];
      for (int t = 0; t < T; ++t) {
        dot[t] = _mm512_setzero_si512();
        xj[t] = x.q[t] + s * 256 + 32 * j;
      }
      auto chunk = [&]<int C>(std::integral_constant<int, C>) {
        PackedChunkDots<P::kFifth, P::kTable, C, T>(_mm512_load_si512(bj + 64 * C), fifth, table,
                                                    xj, dot);
      };
      chunk(std::integral_constant<int, 0>());
      chunk(std::integral_constant<int, 1>());
      chunk(std::integral_constant<int, 2>());
      chunk(std::integral_constant<int, 3>());
      const __m128i sc8 = _mm_load_si128(reinterpret_cast<const __m128i*>(blk + kSc + 16 * j));
      const __m512i sc = P::kTable ? _mm512_cvtepi8_epi32(sc8) : _mm512_cvtepu8_epi32(sc8);
      for (int t = 0; t < T; ++t)
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
    }
    const __m512 d = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + kSc + (P::kTable ? 128 : 256))));
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]),
                               _mm512_mul_ps(d, _mm512_set1_ps(x.d[t][s * 8])), acc[t]);
    }
    K4PackedOffsets<P, T>(blk, x.dxs, s, acc);
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

// Q6_K's 64 code bytes of chunks c0 = 2m and 2m + 1 of a 32-block from the
// nibble vector nv and the top-bits vector hv (chunk k of hv at bits 2k):
// *c0 and *c1, codes 0..63.
template <int kM>
HWY_INLINE void Q6KCodes(__m512i nv, __m512i hv, __m512i* c0, __m512i* c1) {
  const __m512i nib = _mm512_set1_epi8(0xF), top = _mm512_set1_epi8(0x30);
  auto bits = [&](auto k) {  // chunk k's two bits moved to bits 4-5
    if constexpr (decltype(k)::value < 2) return _mm512_slli_epi16(hv, 4 - 2 * decltype(k)::value);
    if constexpr (decltype(k)::value == 2) return hv;
    if constexpr (decltype(k)::value == 3) return _mm512_srli_epi16(hv, 2);
  };
  *c0 = _mm512_or_si512(_mm512_and_si512(nv, nib),
                        _mm512_and_si512(bits(std::integral_constant<int, 2 * (kM % 2)>()), top));
  *c1 =
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(nv, 4), nib),
                      _mm512_and_si512(bits(std::integral_constant<int, 2 * (kM % 2) + 1>()), top));
}

// 16 columns of 16 packed rows (c[k]: columns 4k..4k+3, unsigned codes)
// times a token's 16 activations at x: the rows' int32 sums.
HWY_INLINE __m512i PackedDot16(const __m512i* c, const int8_t* x) {
  __m512i dot = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    int32_t x4;
    std::memcpy(&x4, x + 4 * k, 4);
    dot = _mm512_dpbusd_epi32(dot, c[k], _mm512_set1_epi32(x4));
  }
  return dot;
}

// The 32 * d * scale offsets of super-block s's 16 sub-blocks times the
// tokens' per-16-block d*sum(q), off the accumulators (as KQ6_K's offset term).
template <int T>
HWY_INLINE void Q6KPackedOffsets(const uint8_t* blk, __m512 d, const float* const* xs16, int64_t s,
                                 __m512* acc) {
  const __m512 d32 = _mm512_mul_ps(d, _mm512_set1_ps(32.0f));
  for (int k = 0; k < 16; ++k) {
    const __m512 off = _mm512_mul_ps(
        d32, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                 _mm_load_si128(reinterpret_cast<const __m128i*>(blk + 3072 + 16 * k)))));
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fnmadd_ps(off, _mm512_set1_ps(xs16[t][s * 16 + k]), acc[t]);
    }
  }
}

// Q6_K packed 16 rows at a time (kPackedQ6KBlock per super-block): per
// 16-column sub-block, 4 vpdpbusd per token for all 16 rows, the sums times
// the rows' int8 scales summed exactly over the super-block, then d * d_x,
// and the code offset 32 through the activations' sums.
template <int T>
HWY_INLINE void Q6KPackedTile(const uint8_t* group, int64_t ns, const QuantActs& a, int64_t t0,
                              float* y, int64_t y_stride) {
  const TokenPtrs<T> x(a, t0);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    const uint8_t* blk = group + s * kPackedQ6KBlock;
    PrefetchAhead(blk, kPackedQ6KBlock);
    __m512i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* sub = blk + 384 * j;
      auto half = [&]<int kH>(std::integral_constant<int, kH>) {  // chunks 4kH..4kH+3
        const __m512i hv = _mm512_load_si512(sub + 256 + 64 * kH);
        __m512i c[4];
        Q6KCodes<0>(_mm512_load_si512(sub + 64 * (2 * kH)), hv, &c[0], &c[1]);
        Q6KCodes<1>(_mm512_load_si512(sub + 64 * (2 * kH + 1)), hv, &c[2], &c[3]);
        const __m512i sc = _mm512_cvtepi8_epi32(
            _mm_load_si128(reinterpret_cast<const __m128i*>(blk + 3072 + 16 * (2 * j + kH))));
        for (int t = 0; t < T; ++t) {
          const __m512i dot = PackedDot16(c, x.q[t] + s * 256 + 32 * j + 16 * kH);
          isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, sc));
        }
      };
      half(std::integral_constant<int, 0>());
      half(std::integral_constant<int, 1>());
    }
    const __m512 d =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 3328)));
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]),
                               _mm512_mul_ps(d, _mm512_set1_ps(x.d[t][s * 8])), acc[t]);
    }
    Q6KPackedOffsets<T>(blk, d, x.dxs16, s, acc);
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

// Q2_K and Q3_K packed 16 rows at a time (kPackedQ2KBlock, kPackedQ3KBlock
// per super-block): per 16-column sub-block, 4 vpdpbusd per token for all 16
// rows (codes 0..3, Q3_K's 0..7 with the third bit), the sums times the rows'
// scales summed exactly over the super-block, then d * d_x; the offsets
// (Q2_K: dmin * m; Q3_K: the code offset 4 * d * scale) through the tokens'
// per-16-block d*sum(q), as the unpacked tiles.
struct Q2KPacked {
  static constexpr int64_t kBlock = kPackedQ2KBlock, kScAt = 1024;
  static constexpr bool kThird = false;
};
struct Q3KPacked {
  static constexpr int64_t kBlock = kPackedQ3KBlock, kScAt = 1536;
  static constexpr bool kThird = true;
};

// Sub-block k of a Q2_K/Q3_K packed super-block: its codes c[kC] (columns
// 4kC..4kC+3), its scales *sc (int32 per row) and offset factors *ob.
template <class P>
HWY_INLINE void KSmallSubBlock(const uint8_t* blk, int k, __m512i* c, __m512i* sc, __m512* ob) {
  const __m512i v = _mm512_load_si512(blk + 64 * k);
  __m512i third = _mm512_setzero_si512();
  if constexpr (P::kThird) third = _mm512_load_si512(blk + 1024 + 64 * (k / 2));
  auto code = [&](auto c_const) {
    constexpr int kC = decltype(c_const)::value;
    c[kC] = _mm512_and_si512(kC == 0 ? v : _mm512_srli_epi16(v, 2 * kC), _mm512_set1_epi8(3));
    if constexpr (P::kThird) {
      // sub-block k's chunk kC is chunk 4 * (k % 2) + kC of its 32-block
      c[kC] = _mm512_or_si512(
          c[kC], k % 2 == 0 ? PackedFifth<kC, 2>(third) : PackedFifth<4 + kC, 2>(third));
    }
  };
  code(std::integral_constant<int, 0>());
  code(std::integral_constant<int, 1>());
  code(std::integral_constant<int, 2>());
  code(std::integral_constant<int, 3>());
  const __m512i bytes = _mm512_cvtepu8_epi32(
      _mm_load_si128(reinterpret_cast<const __m128i*>(blk + P::kScAt + 16 * k)));
  if constexpr (P::kThird) {
    *sc = _mm512_srai_epi32(_mm512_slli_epi32(bytes, 24), 24);  // int8
    *ob = _mm512_cvtepi32_ps(*sc);
  } else {
    *sc = _mm512_and_si512(bytes, _mm512_set1_epi32(0xF));
    *ob = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
  }
}

template <class P, int T>
HWY_INLINE void KSmallPackedTile(const uint8_t* group, int64_t ns, const QuantActs& a, int64_t t0,
                                 float* y, int64_t y_stride) {
  const TokenPtrs<T> x(a, t0);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    const uint8_t* blk = group + s * P::kBlock;
    PrefetchAhead(blk, P::kBlock);
    __m512i isum[T];
    __m512 off[T];  // sum over sub-blocks of the offset bytes x d*sum(q)
    for (int t = 0; t < T; ++t) {
      isum[t] = _mm512_setzero_si512();
      off[t] = _mm512_setzero_ps();
    }
    for (int k = 0; k < 16; ++k) {
      __m512i c[4], sc;
      __m512 ob;  // the offset's per-row factor, before d or dmin
      KSmallSubBlock<P>(blk, k, c, &sc, &ob);
      for (int t = 0; t < T; ++t) {
        const __m512i dot = PackedDot16(c, x.q[t] + s * 256 + 16 * k);
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, sc));
        off[t] = _mm512_fmadd_ps(ob, _mm512_set1_ps(x.dxs16[t][s * 16 + k]), off[t]);
      }
    }
    const __m512 d =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + P::kScAt + 256)));
    __m512 od;  // dmin, or 4 * d
    if constexpr (P::kThird) {
      od = _mm512_mul_ps(d, _mm512_set1_ps(4.0f));
    } else {
      od = _mm512_cvtph_ps(
          _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + P::kScAt + 256 + 32)));
    }
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]),
                               _mm512_mul_ps(d, _mm512_set1_ps(x.d[t][s * 8])), acc[t]);
      acc[t] = _mm512_fnmadd_ps(od, off[t], acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

struct Q6KPacked {
  static constexpr int64_t kBlock = kPackedQ6KBlock;
};

// Tokens per tile: Q4_K, Q5_K and IQ4_XS unpack each chunk's nibbles once for
// all of a tile's tokens, so they take 8; the others 4.
template <class P>
inline constexpr int kPackedTokenTile =
    std::is_same_v<P, Q4KPacked> || std::is_same_v<P, Q5KPacked> || std::is_same_v<P, IQ4XSPacked>
        ? 8
        : 4;

// Row groups [g_begin, g_end) x all tokens: tiles of kPackedTokenTile tokens, then one of the
// rest.
template <class P>
HWY_INLINE void KPackedRows(const WeightMatrix& w, int64_t g_begin, int64_t g_end,
                            const QuantActs& a, int64_t n_tokens, float* y) {
  const int64_t ns = w.cols / 256;
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint8_t* group = static_cast<const uint8_t*>(w.packed) + g * ns * P::kBlock;
    TokenTiles<kPackedTokenTile<P>>(n_tokens, [&](auto tile, int64_t t) {
      if constexpr (std::is_same_v<P, Q6KPacked>) {
        Q6KPackedTile<decltype(tile)::value>(group, ns, a, t, y + g * 16, w.rows);
      } else if constexpr (std::is_same_v<P, Q2KPacked> || std::is_same_v<P, Q3KPacked>) {
        KSmallPackedTile<P, decltype(tile)::value>(group, ns, a, t, y + g * 16, w.rows);
      } else {
        K4PackedTile<P, decltype(tile)::value>(group, ns, a, t, y + g * 16, w.rows);
      }
    });
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

// The super-block sums and the tile's accumulators: 512-bit with block
// pairs, else 256-bit.
#ifdef MESHNET_KQUANT_PAIRS
struct KVec {
  using Sum = __m512i;
  using Acc = __m512;
  static HWY_INLINE Sum ZeroSum() { return _mm512_setzero_si512(); }
  static HWY_INLINE Acc ZeroAcc() { return _mm512_setzero_ps(); }
  static HWY_INLINE Acc ScaleAdd(Sum s, float d, Acc acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d), acc);
  }
  static HWY_INLINE __m256 Narrow(Acc acc) { return Halves(acc); }
  template <class F, int T>
  static HWY_INLINE void Blocks(const uint8_t* p, const KHead& h, const TokenPtrs<T>& x, int64_t s,
                                Sum* isum) {
    KPairBlocks<F, T>(p, h, x, s, isum);
  }
};
#else
struct KVec {
  using Sum = __m256i;
  using Acc = __m256;
  static HWY_INLINE Sum ZeroSum() { return _mm256_setzero_si256(); }
  static HWY_INLINE Acc ZeroAcc() { return _mm256_setzero_ps(); }
  static HWY_INLINE Acc ScaleAdd(Sum s, float d, Acc acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
  }
  static HWY_INLINE __m256 Narrow(Acc acc) { return acc; }
  template <class F, int T>
  static HWY_INLINE void Blocks(const uint8_t* p, const KHead& h, const TokenPtrs<T>& x, int64_t s,
                                Sum* isum) {
    KBlocks<F, T>(p, h, x, s, isum);
  }
};
#endif

// One row x T tokens.
template <class F, int T>
HWY_INLINE void KQuantTile(const WeightMatrix& w, int64_t r, int64_t t0, const QuantActs& a,
                           float* y) {
  const int64_t n_super = w.cols / 256;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * n_super * F::kBytes;
  const TokenPtrs<T> x(a, t0);
  typename KVec::Acc acc[T];
  __m256 corr[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = KVec::ZeroAcc();
    corr[t] = _mm256_setzero_ps();
  }
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* p = row + s * F::kBytes;
    KHead h;
    F::Head(p, &h);
    typename KVec::Sum isum[T];
    for (int t = 0; t < T; ++t) isum[t] = KVec::ZeroSum();
    KVec::template Blocks<F, T>(p, h, x, s, isum);
    for (int t = 0; t < T; ++t) {
      acc[t] = KVec::ScaleAdd(isum[t], h.d * x.d[t][s * 8], acc[t]);
      if constexpr (F::kOff == 1) {
        corr[t] = _mm256_fmadd_ps(h.off[0], _mm256_loadu_ps(x.dxs[t] + s * 8), corr[t]);
      } else if constexpr (F::kOff == 2) {
        corr[t] = _mm256_fmadd_ps(h.off[0], _mm256_loadu_ps(x.dxs16[t] + s * 16), corr[t]);
        corr[t] = _mm256_fmadd_ps(h.off[1], _mm256_loadu_ps(x.dxs16[t] + s * 16 + 8), corr[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    y[(t0 + t) * w.rows + r] = HSum(_mm256_sub_ps(KVec::Narrow(acc[t]), corr[t]));
  }
}

// Rows [r_begin, r_end) x all tokens, one row at a time (decode: one
// sequential stream), tokens in tiles of 4.
template <class F>
void KQuantRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const QuantActs& a,
                int64_t n_tokens, float* y) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    TokenTiles<4>(n_tokens, [&](auto tile, int64_t t) {
      KQuantTile<F, decltype(tile)::value>(w, r, t, a, y);
    });
  }
}

// False for the types that are not K-quants or IQ4_XS.
HWY_INLINE bool KQuantMatMulRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end,
                                 const QuantActs& a, int64_t n_tokens, float* y) {
  switch (w.type) {
    case GgmlType::kQ2_K:
      return KQuantRows<KQ2_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ3_K:
      return KQuantRows<KQ3_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ4_K:
      return KQuantRows<KQ4_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ5_K:
      return KQuantRows<KQ5_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ6_K:
      return KQuantRows<KQ6_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kIQ4_XS:
      return KQuantRows<KIQ4_XS>(w, r_begin, r_end, a, n_tokens, y), true;
    default:
      return false;
  }
}

#undef MESHNET_KQUANT_PAIRS
#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_MATMUL_KQUANT_X86_INL_H_
