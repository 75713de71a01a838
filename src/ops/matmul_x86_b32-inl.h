// Internal: the int8 x86 (AVX2 and the AVX-512 targets) kernels of the
// 32-element block formats Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL. Included
// by matmul_kernels.cc once per target (after matmul_x86-inl.h, whose vector
// helpers they use).
//
// A tile is R weight rows x T tokens (decode: 1 x 1; batches: 2 x 4), its
// R*T float accumulators held in registers (one per output, blocks in order,
// so that a row's result does not depend on the tile it is computed in): each
// weight block is decoded once per tile and reused for the T tokens, each
// activation block loaded once and reused for the R rows. Per block, the
// integer dot (exact: vpmaddubsw, then vpmaddwd into int32) is converted and
// scaled by d_w * d_x into float lanes, as in GGML. The blocks are taken in
// groups of 8: the group's weight scales (and Q4_1/Q5_1 offsets) are gathered
// and converted by one vcvtph2ps per row, multiplied by the T tokens' 8
// activation scales in one vector product each, and the offset terms
// (m * d_x*sum(q), see matmul_x86-inl.h) go into the accumulators with one FMA
// per row, token and group. So the per-block work is the decode (per row), the
// activation load (per token) and four or five integer/float operations per
// row and token.
//
// Per-target include guard (Highway's -inl.h convention).
#if defined(MESHNET_OPS_MATMUL_X86_B32_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MESHNET_OPS_MATMUL_X86_B32_INL_H_
#undef MESHNET_OPS_MATMUL_X86_B32_INL_H_
#else
#define MESHNET_OPS_MATMUL_X86_B32_INL_H_
#endif

#include <algorithm>
#include <cstdint>

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

// Each format: kBytes per block, the f16 scale d at byte 0; Codes(p) the
// block's 32 codes as bytes (kSigned: int8, else uint8); the value of code c
// is d*c + m with m the f16 at byte kMinAt (kMinAt > 0), kBias*d (kBias != 0)
// or 0. Unsigned codes skip the sign trick (Q4_0/Q5_0 take their -8/-16 as an
// offset): measured 1.2x faster than signed ones on the decode matvec.
struct XQ8_0 {
  static constexpr int kBytes = 34, kMinAt = 0;
  static constexpr float kBias = 0.0f;
  static constexpr bool kSigned = true;
  static HWY_INLINE __m256i Codes(const uint8_t* p) { return Load32(p + 2); }
};
struct XQ4_0 {
  static constexpr int kBytes = 18, kMinAt = 0;
  static constexpr float kBias = -8.0f;
  static constexpr bool kSigned = false;
  static HWY_INLINE __m256i Codes(const uint8_t* p) { return Nibbles32(p + 2); }
};
struct XQ5_0 {
  static constexpr int kBytes = 22, kMinAt = 0;
  static constexpr float kBias = -16.0f;
  static constexpr bool kSigned = false;
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    return _mm256_or_si256(Nibbles32(p + 6), FifthBits(p + 2));
  }
};
// Q4_1 (kFifth false) and Q5_1: d, m, then Q5_1's fifth bits, then the nibbles.
template <bool kFifth>
struct XQx_1 {
  static constexpr int kBytes = kFifth ? 24 : 20, kMinAt = 2;
  static constexpr float kBias = 0.0f;
  static constexpr bool kSigned = false;
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    if constexpr (kFifth) return _mm256_or_si256(Nibbles32(p + 8), FifthBits(p + 4));
    return Nibbles32(p + 4);
  }
};
using XQ4_1 = XQx_1<false>;
using XQ5_1 = XQx_1<true>;
struct XIQ4_NL {
  static constexpr int kBytes = 18, kMinAt = 0;
  static constexpr float kBias = 0.0f;
  static constexpr bool kSigned = true;
  static HWY_INLINE __m256i Codes(const uint8_t* p) { return Iq4Levels32(Nibbles32(p + 2)); }
};

template <class F>
constexpr bool kB32HasOff = F::kMinAt != 0 || F::kBias != 0.0f;

#if HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
// AVX-512 with VNNI: two blocks per 512-bit vector (block a in bytes 0-31,
// block b in 32-63) and one vpdpbusd for their 64 products (u8 x s8 summed by
// fours into int32, exact: no int16 stage to saturate), instead of
// vpmaddubsw + vpmaddwd per block. Signed codes take the sign trick with a
// mask (AVX-512 has no vpsignb): |w| x (x negated where w < 0).
#define MESHNET_B32_PAIRS 1

// The 32 nibble codes of the 16 bytes at a, then those at b (Nibbles32's
// order per block: low nibbles, then high nibbles).
HWY_INLINE __m512i Nibbles64(const uint8_t* a, const uint8_t* b) {
  const __m512i v =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(Load16(a))),
                         _mm256_broadcastsi128_si256(Load16(b)), 1);
  // 16-bit words of the odd 128-bit lanes (the high nibbles) shift by 4.
  const __m512i by = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                       0x0004000400040004, 0x0004000400040004);
  return _mm512_and_si512(_mm512_srlv_epi16(v, by), _mm512_set1_epi8(0xF));
}

// The fifth bits of two blocks (the u32 at a, then at b) as bytes 0x10 or 0.
HWY_INLINE __m512i FifthBits64(const uint8_t* a, const uint8_t* b) {
  uint32_t qa, qb;
  std::memcpy(&qa, a, 4);
  std::memcpy(&qb, b, 4);
  return _mm512_maskz_mov_epi8(_cvtu64_mask64(qa | uint64_t{qb} << 32), _mm512_set1_epi8(0x10));
}

template <class F>
HWY_INLINE __m512i Codes64(const uint8_t* p);  // the blocks at p and p + F::kBytes
template <>
HWY_INLINE __m512i Codes64<XQ8_0>(const uint8_t* p) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(Load32(p + 2)), Load32(p + 34 + 2), 1);
}
template <>
HWY_INLINE __m512i Codes64<XQ4_0>(const uint8_t* p) {
  return Nibbles64(p + 2, p + 18 + 2);
}
template <>
HWY_INLINE __m512i Codes64<XQ5_0>(const uint8_t* p) {
  return _mm512_or_si512(Nibbles64(p + 6, p + 22 + 6), FifthBits64(p + 2, p + 22 + 2));
}
template <>
HWY_INLINE __m512i Codes64<XQ4_1>(const uint8_t* p) {
  return Nibbles64(p + 4, p + 20 + 4);
}
template <>
HWY_INLINE __m512i Codes64<XQ5_1>(const uint8_t* p) {
  return _mm512_or_si512(Nibbles64(p + 8, p + 24 + 8), FifthBits64(p + 4, p + 24 + 4));
}
template <>
HWY_INLINE __m512i Codes64<XIQ4_NL>(const uint8_t* p) {
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Table)));
  return _mm512_shuffle_epi8(table, Nibbles64(p + 2, p + 18 + 2));
}
#endif  // HWY_TARGET == HWY_AVX3_DL

// 8 floats at p, lanes >= g (< 8 at the end of a row) read as 0.
HWY_INLINE __m256 LoadGroup(const float* p, int g) {
  if (g == 8) return _mm256_loadu_ps(p);
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, mask);
}

// The f16 at byte `at` of blocks [b, b + g) of a row as 8 floats (0 past g).
// Not 8 u16 stores reloaded as one vector: that stalls on store forwarding
// (a third of the batched time), nor a vpgatherdd (slower still on AMD):
// word inserts in two independent chains.
template <class F>
HWY_INLINE __m256 GatherF16(const uint8_t* row, int64_t b, int g, int at) {
  const uint8_t* p = row + b * F::kBytes + at;
  if (g == 8) {
    __m128i lo = _mm_cvtsi32_si128(LoadU16(p));
    __m128i hi = _mm_cvtsi32_si128(LoadU16(p + 4 * F::kBytes));
    lo = _mm_insert_epi16(lo, LoadU16(p + F::kBytes), 1);
    hi = _mm_insert_epi16(hi, LoadU16(p + 5 * F::kBytes), 1);
    lo = _mm_insert_epi16(lo, LoadU16(p + 2 * F::kBytes), 2);
    hi = _mm_insert_epi16(hi, LoadU16(p + 6 * F::kBytes), 2);
    lo = _mm_insert_epi16(lo, LoadU16(p + 3 * F::kBytes), 3);
    hi = _mm_insert_epi16(hi, LoadU16(p + 7 * F::kBytes), 3);
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi));
  }
  alignas(16) uint16_t w[8] = {};
  for (int k = 0; k < g; ++k) w[k] = LoadU16(p + k * F::kBytes);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(w)));
}

// Blocks [b, b + g): eff[r][t][k] = d_w * d_x of block b + k; the offset
// terms m * d_x*sum(q) added to acc[r][t].
template <class F, int R, int T>
HWY_INLINE void GroupScales(const uint8_t* const* rows, int64_t b, int g, const TokenPtrs<T>& x,
                            float (*eff)[T][8], __m256 (*acc)[T]) {
  for (int r = 0; r < R; ++r) {
    const __m256 dw = GatherF16<F>(rows[r], b, g, 0);
    __m256 m = _mm256_setzero_ps();
    if constexpr (F::kMinAt != 0) {
      m = GatherF16<F>(rows[r], b, g, F::kMinAt);
    } else if constexpr (F::kBias != 0.0f) {
      m = _mm256_mul_ps(_mm256_set1_ps(F::kBias), dw);
    }
    for (int t = 0; t < T; ++t) {
      _mm256_store_ps(eff[r][t], _mm256_mul_ps(dw, LoadGroup(x.d[t] + b, g)));
      if constexpr (kB32HasOff<F>) {
        acc[r][t] = _mm256_fmadd_ps(m, LoadGroup(x.dxs[t] + b, g), acc[r][t]);
      }
    }
  }
}

// Block b + k of R rows x T tokens into acc: decoded once, the activations
// loaded once per token.
template <class F, int R, int T>
HWY_INLINE void BlockDots(const uint8_t* const* rows, int64_t b, int k, const TokenPtrs<T>& x,
                          const float (*eff)[T][8], __m256 (*acc)[T]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i code[R], code_abs[R];
  for (int r = 0; r < R; ++r) {
    code[r] = F::Codes(rows[r] + (b + k) * F::kBytes);
    code_abs[r] = F::kSigned ? _mm256_sign_epi8(code[r], code[r]) : code[r];
  }
  for (int t = 0; t < T; ++t) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + (b + k) * 32));
    for (int r = 0; r < R; ++r) {
      const __m256i xs = F::kSigned ? _mm256_sign_epi8(xv, code[r]) : xv;
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(code_abs[r], xs), ones);
      acc[r][t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_broadcast_ss(&eff[r][t][k]), acc[r][t]);
    }
  }
}

#ifdef MESHNET_B32_PAIRS
// Blocks b + k and b + k + 1 (k even) of R rows x T tokens into acc (two
// blocks' 8 int32 sums per vector; their scales eff[k], eff[k + 1] are spread
// over the matching halves by one permute).
template <class F, int R, int T>
HWY_INLINE void PairDots(const uint8_t* const* rows, int64_t b, int k, const TokenPtrs<T>& x,
                         const float (*eff)[T][8], __m512 (*acc)[T]) {
  // (Not _mm512_setr_epi32 of k: built through memory, its 64-byte reload
  // of 16 scalar stores stalled on store forwarding, 1.7x the decode time.)
  const __m512i spread = _mm512_add_epi32(
      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_set1_epi32(k));
  __m512i code[R];
  __mmask64 neg[R];
  for (int r = 0; r < R; ++r) {
    const __m512i c = Codes64<F>(rows[r] + (b + k) * F::kBytes);
    if constexpr (F::kSigned) {
      neg[r] = _mm512_movepi8_mask(c);
      code[r] = _mm512_abs_epi8(c);
    } else {
      code[r] = c;
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m512i xv = _mm512_loadu_si512(x.q[t] + (b + k) * 32);
    for (int r = 0; r < R; ++r) {
      __m512i xs = xv;
      if constexpr (F::kSigned) xs = _mm512_mask_sub_epi8(xv, neg[r], _mm512_setzero_si512(), xv);
      const __m512i s32 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), code[r], xs);
      const __m512 e =
          _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm256_load_ps(eff[r][t])));
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32), e, acc[r][t]);
    }
  }
}

// Q8_0 packed 16 rows at a time (kPackedQ8Block per 32-column block): one
// vpdpbusd per 4 columns and token for all 16 rows, the token's 4 activation
// bytes broadcast as unsigned (q + 128; 128 x the rows' code sums is taken
// off after, exact), then one convert and FMA per block and token. No
// horizontal sums: lane i is row i.
template <int T>
HWY_INLINE void Q8PackedTile(const uint8_t* group, int64_t nb, const QuantActs& a, int64_t t0,
                             float* y, int64_t y_stride) {
  const uint8_t* xu[T];
  const float* dx[T];
  for (int t = 0; t < T; ++t) {
    xu[t] = a.u8 + (t0 + t) * a.cols;
    dx[t] = a.d + (t0 + t) * nb;
  }
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kPackedQ8Block;
    PrefetchAhead(blk, kPackedQ8Block);
    __m512i sum[T];
    for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
    for (int c = 0; c < 8; ++c) {
      const __m512i wv = _mm512_load_si512(blk + 64 * c);
      for (int t = 0; t < T; ++t) {
        uint32_t x4;
        std::memcpy(&x4, xu[t] + b * 32 + 4 * c, 4);
        sum[t] = _mm512_dpbusd_epi32(sum[t], _mm512_set1_epi32(static_cast<int>(x4)), wv);
      }
    }
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 512)));
    const __m512i off = _mm512_slli_epi32(
        _mm512_cvtepi16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 544))), 7);
    for (int t = 0; t < T; ++t) {
      const __m512 eff = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t][b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum[t], off)), eff, acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

// Row groups [g_begin, g_end) x all tokens: tiles of 8 tokens, then one of the rest.
HWY_INLINE void Q8PackedRows(const WeightMatrix& w, int64_t g_begin, int64_t g_end,
                             const QuantActs& a, int64_t n_tokens, float* y) {
  const int64_t nb = w.cols / 32;
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint8_t* group = static_cast<const uint8_t*>(w.packed) + g * nb * kPackedQ8Block;
    TokenTiles<8>(n_tokens, [&](auto tile, int64_t t) {
      Q8PackedTile<decltype(tile)::value>(group, nb, a, t, y + g * 16, w.rows);
    });
  }
}

// Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL packed 16 rows at a time
// (PackedB32UnitBytes per 64 columns): the codes as unsigned bytes (IQ4_NL's
// levels + 128 by one vpshufb), one vpdpbusd per 4 columns and token for all
// 16 rows against the token's 4 activation bytes broadcast, then per block
// and token the convert and scale, and the offset term m * d_x*sum(q) (m the
// format's min, or kBias * d) as in the unpacked tiles. Lane i is row i.
template <GgmlType kType>
struct B32Packed {
  static constexpr bool kFifth = kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1;
  static constexpr bool kMin = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;
  static constexpr bool kTable = kType == GgmlType::kIQ4_NL;
  static constexpr float kBias = kType == GgmlType::kQ4_0   ? -8.0f
                                 : kType == GgmlType::kQ5_0 ? -16.0f
                                 : kTable                   ? -128.0f
                                                            : 0.0f;
  static constexpr int64_t kUnit = PackedB32UnitBytes(kType);
  static constexpr int64_t kDAt = kFifth ? 640 : 512;  // then kMin's m at kDAt + 64
};

template <class P, int T>
HWY_INLINE void B32PackedTile(const uint8_t* group, int64_t n_units, const QuantActs& a, int64_t t0,
                              float* y, int64_t y_stride) {
  const TokenPtrs<T> x(a, t0);
  const __m512i table = P::kTable ? Iq4UnsignedTable() : _mm512_setzero_si512();
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t u = 0; u < n_units; ++u) {
    const uint8_t* unit = group + u * P::kUnit;
    PrefetchAhead(unit, P::kUnit);
    for (int k = 0; k < 2; ++k) {
      const int64_t b = 2 * u + k;
      __m512i fifth = _mm512_setzero_si512();
      if constexpr (P::kFifth) fifth = _mm512_load_si512(unit + 512 + 64 * k);
      __m512i sum[T];
      const int8_t* xb[T];
      for (int t = 0; t < T; ++t) {
        sum[t] = _mm512_setzero_si512();
        xb[t] = x.q[t] + b * 32;
      }
      auto chunk = [&]<int C>(std::integral_constant<int, C>) {
        PackedChunkDots<P::kFifth, P::kTable, C, T>(_mm512_load_si512(unit + 64 * (4 * k + C)),
                                                    fifth, table, xb, sum);
      };
      chunk(std::integral_constant<int, 0>());
      chunk(std::integral_constant<int, 1>());
      chunk(std::integral_constant<int, 2>());
      chunk(std::integral_constant<int, 3>());
      const __m512 dw = _mm512_cvtph_ps(
          _mm256_load_si256(reinterpret_cast<const __m256i*>(unit + P::kDAt + 32 * k)));
      __m512 m;
      if constexpr (P::kMin) {
        m = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(unit + P::kDAt + 64 + 32 * k)));
      } else {
        m = _mm512_mul_ps(dw, _mm512_set1_ps(P::kBias));
      }
      for (int t = 0; t < T; ++t) {
        const __m512 eff = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[t][b]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), eff, acc[t]);
        acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.dxs[t][b]), acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * y_stride, acc[t]);
}

template <GgmlType kType>
HWY_INLINE void B32PackedRows(const WeightMatrix& w, int64_t g_begin, int64_t g_end,
                              const QuantActs& a, int64_t n_tokens, float* y) {
  using P = B32Packed<kType>;
  const int64_t n_units = w.cols / 64;
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint8_t* group = static_cast<const uint8_t*>(w.packed) + g * n_units * P::kUnit;
    TokenTiles<8>(n_tokens, [&](auto tile, int64_t t) {
      B32PackedTile<P, decltype(tile)::value>(group, n_units, a, t, y + g * 16, w.rows);
    });
  }
}

// B32Tile with block pairs: the offset terms and an odd last block go into
// 256-bit accumulators beside the 512-bit ones. One accumulator of each per
// output, whatever the tile shape (batch invariance, as B32Tile).
template <class F, int R, int T>
HWY_INLINE void B32PairTile(const WeightMatrix& w, int64_t r0, int64_t t0, const QuantActs& a,
                            float* y) {
  const int64_t nb = w.cols / 32;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nb * F::kBytes;
  }
  const TokenPtrs<T> x(a, t0);
  __m512 acc[R][T];
  __m256 side[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      side[r][t] = _mm256_setzero_ps();
      acc[r][t] = _mm512_setzero_ps();
    }
  HWY_ALIGN float eff[R][T][8];
  for (int64_t b = 0; b < nb; b += 8) {
    const int g = static_cast<int>(std::min<int64_t>(8, nb - b));
    GroupScales<F, R, T>(rows, b, g, x, eff, side);
    int k = 0;
    for (; k + 2 <= g; k += 2) PairDots<F, R, T>(rows, b, k, x, eff, acc);
    if (k < g) BlockDots<F, R, T>(rows, b, k, x, eff, side);
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      y[(t0 + t) * w.rows + r0 + r] = HSum(_mm256_add_ps(Halves(acc[r][t]), side[r][t]));
    }
}
#endif  // MESHNET_B32_PAIRS

// Rows [r0, r0 + R) x tokens [t0, t0 + T) of y. Each output has one
// accumulator and takes its blocks (and its groups' offset terms) in order,
// whatever the tile shape, so a row's result is the same bits alone (decode,
// 1 x 1) or in any batch (2 x 4 tiles and their remainders). Decode keeps
// the FMA units busy through the rows' independent chains, which overlap.
template <class F, int R, int T>
HWY_INLINE void B32Tile(const WeightMatrix& w, int64_t r0, int64_t t0, const QuantActs& a,
                        float* y) {
  const int64_t nb = w.cols / 32;
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = static_cast<const uint8_t*>(w.data) + (r0 + r) * nb * F::kBytes;
  }
  const TokenPtrs<T> x(a, t0);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  HWY_ALIGN float eff[R][T][8];
  for (int64_t b = 0; b < nb; b += 8) {
    const int g = static_cast<int>(std::min<int64_t>(8, nb - b));
    GroupScales<F, R, T>(rows, b, g, x, eff, acc);
    if (g == 8) {  // a constant trip count, unrolled
      for (int k = 0; k < 8; ++k) BlockDots<F, R, T>(rows, b, k, x, eff, acc);
    } else {  // the row's last blocks
      for (int k = 0; k < g; ++k) BlockDots<F, R, T>(rows, b, k, x, eff, acc);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[(t0 + t) * w.rows + r0 + r] = HSum(acc[r][t]);
}

#ifdef MESHNET_B32_PAIRS
template <class F, int R, int T>
HWY_INLINE void B32AnyTile(const WeightMatrix& w, int64_t r0, int64_t t0, const QuantActs& a,
                           float* y) {
  B32PairTile<F, R, T>(w, r0, t0, a, y);
}
#else
template <class F, int R, int T>
HWY_INLINE void B32AnyTile(const WeightMatrix& w, int64_t r0, int64_t t0, const QuantActs& a,
                           float* y) {
  B32Tile<F, R, T>(w, r0, t0, a, y);
}
#endif

// R rows x all tokens: tiles of 4 tokens, then one tile of the 1-3 left.
template <class F, int R>
HWY_INLINE void B32Tokens(const WeightMatrix& w, int64_t r0, const QuantActs& a, int64_t n_tokens,
                          float* y) {
  TokenTiles<4>(n_tokens, [&](auto tile, int64_t t) {
    B32AnyTile<F, R, decltype(tile)::value>(w, r0, t, a, y);
  });
}

// Decode (one token) streams one row at a time, which the hardware
// prefetchers follow best; batches take rows in pairs.
template <class F>
void B32Rows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const QuantActs& a,
             int64_t n_tokens, float* y) {
  int64_t r = r_begin;
  if (n_tokens > 1) {
    for (; r + 2 <= r_end; r += 2) B32Tokens<F, 2>(w, r, a, n_tokens, y);
  }
  for (; r < r_end; ++r) B32Tokens<F, 1>(w, r, a, n_tokens, y);
}

// False for the types without a kernel here.
HWY_INLINE bool Block32MatMulRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end,
                                  const QuantActs& a, int64_t n_tokens, float* y) {
  switch (w.type) {
    case GgmlType::kQ8_0:
      return B32Rows<XQ8_0>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ4_0:
      return B32Rows<XQ4_0>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ4_1:
      return B32Rows<XQ4_1>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ5_0:
      return B32Rows<XQ5_0>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ5_1:
      return B32Rows<XQ5_1>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kIQ4_NL:
      return B32Rows<XIQ4_NL>(w, r_begin, r_end, a, n_tokens, y), true;
    default:
      return false;
  }
}

#undef MESHNET_B32_PAIRS
#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_MATMUL_X86_B32_INL_H_
