// Internal: int8 quantized matmul kernels for the x86 Highway targets with
// AVX2 (AVX2 and the AVX-512 targets, which run them on 256-bit vectors).
// Included by matmul_kernels.cc once per target; other targets keep the
// portable int16 QuantTile there.
//
// Why intrinsics: the fast path is the unsigned x signed 8-bit pairwise
// multiply-add (vpmaddubsw), which the Highway in Debian bookworm (1.0.3) does
// not expose; everything around it stays in Highway's per-target namespace.
//
// Each weight block's 32 codes are one vector of int8 (signed codes) or uint8
// (unsigned codes; the offset term of Q4_1/Q5_1, and Q4_0's
// and Q5_0's code bias, goes through the activations' d*sum(q) as in GGML's
// Q4_1). Signed codes use the
// sign trick: |w| (u8) x (x with w's sign) (i8). vpmaddubsw cannot saturate
// here: |w| <= 128 and |x| <= 127 give pair sums <= 32512.
// The formats' kernels live in their own files: the 32-element formats in
// matmul_x86_b32-inl.h, the K-quants and IQ4_XS in matmul_kquant_x86-inl.h.
// A tile is one weight row x T tokens: each block is decoded once and reused
// for the T tokens (T = 1 is the decode matvec, one sequential stream).
//
// Per-target include guard (Highway's -inl.h convention).
#if defined(MESHNET_OPS_MATMUL_X86_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MESHNET_OPS_MATMUL_X86_INL_H_
#undef MESHNET_OPS_MATMUL_X86_INL_H_
#else
#define MESHNET_OPS_MATMUL_X86_INL_H_
#endif

#include <cstring>
#include <type_traits>
#include <utility>

#include "hwy/highway.h"
#include "ops/matmul_formats-inl.h"
#include "ops/matmul_kernels.h"

// The AVX3_DL kernels with VNNI need GCC's cumulative `#pragma GCC target`
// (clang builds run the 256-bit kernels on that target).
#ifndef MESHNET_OPS_VNNI
#if defined(__GNUC__) && !defined(__clang__)
#define MESHNET_OPS_VNNI 1
#else
#define MESHNET_OPS_VNNI 0
#endif
#endif

HWY_BEFORE_NAMESPACE();
#if HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
#pragma GCC target("avx512vnni")  // as in matmul_x86_b32-inl.h: for PackedChunkDots
#endif
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

HWY_INLINE __m256i Bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
HWY_INLINE __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
HWY_INLINE __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The 32 nibble codes of 16 bytes: element i < 16 in the low nibble of byte
// i, element i + 16 in its high nibble.
HWY_INLINE __m256i Nibbles32(const uint8_t* p) {
  const __m128i b = Load16(p);
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
  return _mm256_and_si256(v, Bytes(0xF));
}

// Bits [0, 32) of the little-endian word at p as bytes 0x10 (set) or 0.
HWY_INLINE __m256i FifthBits(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  // Byte i takes byte i/8 of qh (a per-lane shuffle: lane 1 reads bytes 2-3).
  const __m256i which =
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), which);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(set, Bytes(0x10));
}

// Bits of each byte shifted left by kBy (right if negative), in 16-bit words:
// callers mask the result to bits that came from the same byte.
template <int kBy>
HWY_INLINE __m256i ShiftBits(__m256i v) {
  if constexpr (kBy > 0) return _mm256_slli_epi16(v, kBy);
  if constexpr (kBy < 0) return _mm256_srli_epi16(v, -kBy);
  return v;
}

HWY_INLINE __m256i Iq4Levels32(__m256i nib) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Table)));
  return _mm256_shuffle_epi8(table, nib);
}

HWY_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#if HWY_TARGET <= HWY_AVX3
// The sum of v's two 256-bit halves.
HWY_INLINE __m256 Halves(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}
#endif

#if HWY_TARGET <= HWY_AVX3
// Packed layouts' fifth bits (a 32-column block's vector: lane i, byte m, bit
// j is row i's column 4j + m): chunk J's (columns 4J..4J+3) as 0x10 or 0.
// (kTo: the bit it goes to; Q3_K's third bit is 0x04.)
template <int J, int kTo = 4>
HWY_INLINE __m512i PackedFifth(__m512i bits) {
  const __m512i moved =
      J <= kTo ? _mm512_slli_epi16(bits, kTo - J) : _mm512_srli_epi16(bits, J - kTo);
  return _mm512_and_si512(moved, _mm512_set1_epi8(static_cast<char>(1 << kTo)));
}

// The IQ4 levels + 128 as unsigned bytes, in every 128-bit lane (for vpshufb).
HWY_INLINE __m512i Iq4UnsignedTable() {
  return _mm512_xor_si512(
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Table))),
      _mm512_set1_epi8(static_cast<char>(0x80)));
}

// The packed nibble layouts' codes of a 32-column block from its vector C
// (lane i: row i's columns 8C..8C+3 in the low nibbles, 8C+4..8C+7 in the
// high): *lo and *hi, with the fifth bits (kFifth) or through the IQ4 table
// (kTable), as unsigned bytes.
template <bool kFifth, bool kTable, int C>
HWY_INLINE void PackedNibbles(__m512i v, __m512i fifth, __m512i table, __m512i* lo, __m512i* hi) {
  const __m512i nib = _mm512_set1_epi8(0xF);
  *lo = _mm512_and_si512(v, nib);
  *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
  if constexpr (kFifth) {
    *lo = _mm512_or_si512(*lo, PackedFifth<2 * C>(fifth));
    *hi = _mm512_or_si512(*hi, PackedFifth<2 * C + 1>(fifth));
  }
  if constexpr (kTable) {
    *lo = _mm512_shuffle_epi8(table, *lo);
    *hi = _mm512_shuffle_epi8(table, *hi);
  }
}

#if HWY_TARGET == HWY_AVX3_DL && MESHNET_OPS_VNNI
// Columns 8C..8C+7 of a packed nibble block (its vector C) into sum[t], the
// 16 rows' int32 sums, for T tokens whose activations of that 32-column block
// start at x[t]: the codes decoded once, two vpdpbusd per token.
template <bool kFifth, bool kTable, int C, int T>
HWY_INLINE void PackedChunkDots(__m512i v, __m512i fifth, __m512i table, const int8_t* const* x,
                                __m512i* sum) {
  __m512i lo, hi;
  PackedNibbles<kFifth, kTable, C>(v, fifth, table, &lo, &hi);
  for (int t = 0; t < T; ++t) {
    int32_t xl, xh;
    std::memcpy(&xl, x[t] + 8 * C, 4);
    std::memcpy(&xh, x[t] + 8 * C + 4, 4);
    sum[t] = _mm512_dpbusd_epi32(sum[t], lo, _mm512_set1_epi32(xl));
    sum[t] = _mm512_dpbusd_epi32(sum[t], hi, _mm512_set1_epi32(xh));
  }
}
#endif  // HWY_AVX3_DL
#endif

// Prefetches [p, p + n) into L1, a cache line at a time (packed tiles read
// the blocks ahead of the one they compute).
HWY_INLINE void PrefetchBytes(const uint8_t* p, int64_t n) {
  for (int64_t k = 0; k < n; k += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + k), _MM_HINT_T0);
  }
}

// The packed tiles' prefetch: the `n` bytes of a block 8 KB past the one at
// p (a packed matrix is one contiguous stream per thread, so this runs on
// into the next row groups). Measured (ops_bench decode, 1 thread, packed,
// two alternations of 2.3, 4, 8, 12 and 16 KB): 8 KB took Q2_K from 0.75-0.79
// of the read bandwidth to 0.93-0.94, Q3_K 0.78-0.79 -> 0.88-0.97, Q4_K
// 0.84-0.86 -> 0.90-0.94, IQ4_XS 0.82-0.88 -> 0.88-0.96, Q4_0 0.81-0.85 ->
// 0.88-0.94; Q8_0 and the batches did not move. The blocks one ahead (Q2_K's
// 1.3 KB) left DRAM's latency uncovered; 12-16 KB lost the K-quants again.
inline constexpr int64_t kPrefetchDistance = 8192;
HWY_INLINE void PrefetchAhead(const uint8_t* p, int64_t n) {
  PrefetchBytes(p + kPrefetchDistance, n);
}

// Tokens [0, n) in tiles: tile(std::integral_constant<int, kMax>(), t0) for
// each full tile of kMax tokens, then one tile of the 1 .. kMax-1 left (a
// batch of 7 is 4 + 3, not 4 + 1 + 1 + 1: each tile decodes the codes again).
template <int K, class Tile>
HWY_INLINE void RestTile(int rest, Tile& tile, int64_t t0) {
  if constexpr (K > 0) {
    if (rest == K) return tile(std::integral_constant<int, K>(), t0);
    RestTile<K - 1>(rest, tile, t0);
  }
}
template <int kMax, class Tile>
HWY_INLINE void TokenTiles(int64_t n, Tile&& tile) {
  int64_t t = 0;
  for (; t + kMax <= n; t += kMax) tile(std::integral_constant<int, kMax>(), t);
  RestTile<kMax - 1>(static_cast<int>(n - t), tile, t);
}

// Activations of T tokens starting at t0.
template <int T>
struct TokenPtrs {
  const int8_t* q[T];
  const float* d[T];
  const float* dxs[T];
  const float* dxs16[T];
  TokenPtrs(const QuantActs& a, int64_t t0) {
    const int64_t nb = a.cols / 32;
    for (int t = 0; t < T; ++t) {
      q[t] = a.q8 + (t0 + t) * a.cols;
      d[t] = a.d + (t0 + t) * nb;
      dxs[t] = a.dxs + (t0 + t) * nb;
      dxs16[t] = a.dxs16 + (t0 + t) * (a.cols / 16);
    }
  }
};

// Integer pair sums (int16) of codes w (|w| if signed, with sw = w) and 32 activations.
template <bool kSigned>
HWY_INLINE __m256i PairSums(__m256i w_abs, __m256i w, const int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm256_maddubs_epi16(w_abs, kSigned ? _mm256_sign_epi8(xv, w) : xv);
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_MATMUL_X86_INL_H_
