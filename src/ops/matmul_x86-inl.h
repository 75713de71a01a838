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
// The block's integer dot (exact) is converted and scaled by d_w * d_x into
// float lanes, as in GGML. (The K-quants and IQ4_XS: matmul_kquant_x86-inl.h.)
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
#include <utility>

#include "hwy/highway.h"
#include "ops/matmul_formats-inl.h"
#include "ops/matmul_kernels.h"

HWY_BEFORE_NAMESPACE();
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

// ------------------------------------------------------------ 32-element formats

// Block(p, &m) returns the 32 codes and sets m to the block's offset (value =
// d*code + m; formats without one leave it).
struct XQ8_0 {
  static constexpr int kBytes = 34;
  static constexpr bool kSigned = true, kHasOff = false;
  static HWY_INLINE __m256i Block(const uint8_t* p, float*) { return Load32(p + 2); }
};
// Q4_0/Q5_0 take their -8/-16 like Q4_1's offset (m = -8d, -16d, times the
// activations' d*sum(q), which is exact in float for q8_0): unsigned codes
// skip the sign trick, measured 1.2x faster than signed ones on the decode matvec.
struct XQ4_0 {
  static constexpr int kBytes = 18;
  static constexpr bool kSigned = false, kHasOff = true;
  static HWY_INLINE __m256i Block(const uint8_t* p, float* m) {
    *m = -8.0f * LoadF16(p);
    return Nibbles32(p + 2);
  }
};
struct XQ4_1 {
  static constexpr int kBytes = 20;
  static constexpr bool kSigned = false, kHasOff = true;
  static HWY_INLINE __m256i Block(const uint8_t* p, float* m) {
    *m = LoadF16(p + 2);
    return Nibbles32(p + 4);
  }
};
struct XQ5_0 {
  static constexpr int kBytes = 22;
  static constexpr bool kSigned = false, kHasOff = true;
  static HWY_INLINE __m256i Block(const uint8_t* p, float* m) {
    *m = -16.0f * LoadF16(p);
    return _mm256_or_si256(Nibbles32(p + 6), FifthBits(p + 2));
  }
};
struct XQ5_1 {
  static constexpr int kBytes = 24;
  static constexpr bool kSigned = false, kHasOff = true;
  static HWY_INLINE __m256i Block(const uint8_t* p, float* m) {
    *m = LoadF16(p + 2);
    return _mm256_or_si256(Nibbles32(p + 8), FifthBits(p + 4));
  }
};
struct XIQ4_NL {
  static constexpr int kBytes = 18;
  static constexpr bool kSigned = true, kHasOff = false;
  static HWY_INLINE __m256i Block(const uint8_t* p, float*) {
    return Iq4Levels32(Nibbles32(p + 2));
  }
};

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

// One row x T tokens of a 32-element format. A one-token tile alternates two
// accumulators so consecutive blocks' FMAs overlap.
template <class F, int T>
HWY_INLINE void SmallTile(const WeightMatrix& w, int64_t r, int64_t t0, const QuantActs& a,
                          float* y) {
  constexpr int kAcc = T == 1 ? 2 : 1;
  const int64_t nb = w.cols / 32;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * nb * F::kBytes;
  const TokenPtrs<T> x(a, t0);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kAcc][T];
  float off[T];
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < kAcc; ++k) acc[k][t] = _mm256_setzero_ps();
    off[t] = 0.0f;
  }
  int64_t b = 0;
  for (; b + kAcc <= nb; b += kAcc) {
    for (int k = 0; k < kAcc; ++k) {
      const uint8_t* p = row + (b + k) * F::kBytes;
      float m = 0.0f;
      const __m256i code = F::Block(p, &m);
      const __m256i code_abs = F::kSigned ? _mm256_sign_epi8(code, code) : code;
      const float dw = LoadF16(p);
      for (int t = 0; t < T; ++t) {
        const __m256i s32 =
            _mm256_madd_epi16(PairSums<F::kSigned>(code_abs, code, x.q[t] + (b + k) * 32), ones);
        acc[k][t] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_set1_ps(dw * x.d[t][b + k]), acc[k][t]);
        if constexpr (F::kHasOff) off[t] += m * x.dxs[t][b + k];
      }
    }
  }
  for (; b < nb; ++b) {  // (kAcc = 2 and an odd block count) the last block
    const uint8_t* p = row + b * F::kBytes;
    float m = 0.0f;
    const __m256i code = F::Block(p, &m);
    const __m256i code_abs = F::kSigned ? _mm256_sign_epi8(code, code) : code;
    const __m256i s32 =
        _mm256_madd_epi16(PairSums<F::kSigned>(code_abs, code, x.q[0] + b * 32), ones);
    acc[0][0] =
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_set1_ps(LoadF16(p) * x.d[0][b]), acc[0][0]);
    if constexpr (F::kHasOff) off[0] += m * x.dxs[0][b];
  }
  for (int t = 0; t < T; ++t) {
    __m256 total = acc[0][t];
    for (int k = 1; k < kAcc; ++k) total = _mm256_add_ps(total, acc[k][t]);
    y[(t0 + t) * w.rows + r] = HSum(total) + off[t];
  }
}

// Rows [r_begin, r_end) x all tokens, one row at a time (decode: one
// sequential stream, which the hardware prefetchers follow best), tokens in
// tiles of 4 (the accumulators fill the 16 vector registers of AVX2).
template <class F>
void Int8Rows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const QuantActs& a,
              int64_t n_tokens, float* y) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n_tokens; t += 4) SmallTile<F, 4>(w, r, t, a, y);
    if (t + 2 <= n_tokens) {
      SmallTile<F, 2>(w, r, t, a, y);
      t += 2;
    }
    if (t < n_tokens) SmallTile<F, 1>(w, r, t, a, y);
  }
}

// False for the types without an int8 kernel (float types).
HWY_INLINE bool Int8MatMulRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end,
                               const QuantActs& a, int64_t n_tokens, float* y) {
  switch (w.type) {
    case GgmlType::kQ8_0:
      return Int8Rows<XQ8_0>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ4_0:
      return Int8Rows<XQ4_0>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ4_1:
      return Int8Rows<XQ4_1>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ5_0:
      return Int8Rows<XQ5_0>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ5_1:
      return Int8Rows<XQ5_1>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kIQ4_NL:
      return Int8Rows<XIQ4_NL>(w, r_begin, r_end, a, n_tokens, y), true;
    default:
      return false;
  }
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_MATMUL_X86_INL_H_
