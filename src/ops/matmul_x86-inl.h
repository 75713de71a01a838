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
// (unsigned codes; the offset term of Q4_1/Q5_1/Q4_K/Q5_K/Q2_K, and Q4_0's
// and Q5_0's code bias, goes through the activations' d*sum(q) as in GGML's
// Q4_1). Signed codes use the
// sign trick: |w| (u8) x (x with w's sign) (i8). vpmaddubsw cannot saturate
// here: |w| <= 128 and |x| <= 127 give pair sums <= 32512.
// - 32-element formats (matmul_x86_b32-inl.h): the block's integer dot
//   (exact) is converted and scaled by d_w * d_x into float lanes, as in GGML.
// - K-quants and IQ4_XS: per 32-block, the int16 pair sums are multiplied by
//   the 16-block scales (vpmaddwd) and summed in int32 over the super-block
//   (exact: |sum| < 2^25), then scaled once by d * d_x, as GGML does.
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

// ------------------------------------------------------------ K-quants, IQ4_XS

// A super-block's float scale d, its 16-block scales as int16 (words 0-7 /
// 8-15, each copied to both 128-bit lanes) and its offsets: per 32-block
// (kOff == 1) or per 16-block (kOff == 2), value = d*sc*code - off.
struct KHead {
  float d;
  __m256i sc_lo, sc_hi;
  __m256 off32;
  __m256 off16[2];
};

HWY_INLINE void SetScales16(__m128i sc, KHead* h) {  // 16 int8 scales
  const __m256i s16 = _mm256_cvtepi8_epi16(sc);
  h->sc_lo = _mm256_permute2x128_si256(s16, s16, 0x00);
  h->sc_hi = _mm256_permute2x128_si256(s16, s16, 0x11);
}
HWY_INLINE void SetScales32(__m128i sc, KHead* h) {  // 8 int8 scales in the low bytes
  SetScales16(_mm_unpacklo_epi8(sc, sc), h);
}

// The int16 scales of 32-block J's pair sums: lanes 0-7 (elements 0-15) take
// 16-block 2J's, lanes 8-15 take 2J+1's.
template <int J>
HWY_INLINE __m256i ScaleOf(const KHead& h) {
  constexpr int kB = 4 * (J % 4);
  const __m256i idx =
      _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((kB + 3) << 8 | (kB + 2))),
                       _mm_set1_epi16(static_cast<int16_t>((kB + 1) << 8 | kB)));
  return _mm256_shuffle_epi8(J < 4 ? h.sc_lo : h.sc_hi, idx);
}

HWY_INLINE __m256 U8ToFloat8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

struct XQ4_K {
  static constexpr int kBytes = 144, kOff = 1;
  static constexpr bool kSigned = false;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p);
    uint32_t packed[4];
    Q4KPackedScales(p + 4, packed);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
    SetScales32(sm, h);
    h->off32 = _mm256_mul_ps(_mm256_set1_ps(LoadF16(p + 2)), U8ToFloat8(_mm_srli_si128(sm, 8)));
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    const __m256i v = Load32(p + 16 + 32 * (J / 2));
    return _mm256_and_si256(J % 2 == 0 ? v : _mm256_srli_epi16(v, 4), Bytes(0xF));
  }
};

struct XQ5_K {
  static constexpr int kBytes = 176, kOff = 1;
  static constexpr bool kSigned = false;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) { XQ4_K::Head(p, h); }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    const __m256i v = Load32(p + 48 + 32 * (J / 2));
    const __m256i lo = _mm256_and_si256(J % 2 == 0 ? v : _mm256_srli_epi16(v, 4), Bytes(0xF));
    return _mm256_or_si256(lo, _mm256_and_si256(ShiftBits<4 - J>(Load32(p + 16)), Bytes(0x10)));
  }
};

struct XQ6_K {
  static constexpr int kBytes = 210, kOff = 0;
  static constexpr bool kSigned = true;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p + 208);
    SetScales16(Load16(p + 192), h);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    constexpr int kHalf = J / 4, kQ = J % 4;
    const __m256i ql = Load32(p + 64 * kHalf + 32 * (kQ & 1));
    const __m256i lo = _mm256_and_si256(kQ < 2 ? ql : _mm256_srli_epi16(ql, 4), Bytes(0xF));
    const __m256i hi =
        _mm256_and_si256(ShiftBits<4 - 2 * kQ>(Load32(p + 128 + 32 * kHalf)), Bytes(0x30));
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), Bytes(32));
  }
};

// Q2_K/Q3_K: 32-block J's 2-bit codes are bits 2*(J%4) of 32 bytes at qs + 32*(J/4).
template <int J>
HWY_INLINE __m256i TwoBits(const uint8_t* qs) {
  return _mm256_and_si256(ShiftBits<-2 * (J % 4)>(Load32(qs + 32 * (J / 4))), Bytes(3));
}

struct XQ2_K {
  static constexpr int kBytes = 84, kOff = 2;
  static constexpr bool kSigned = false;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p + 80);
    const __m256 dmin = _mm256_set1_ps(LoadF16(p + 82));
    const __m128i sc = Load16(p), nib = _mm_set1_epi8(0xF);
    SetScales16(_mm_and_si128(sc, nib), h);
    const __m128i mins = _mm_and_si128(_mm_srli_epi16(sc, 4), nib);
    h->off16[0] = _mm256_mul_ps(dmin, U8ToFloat8(mins));
    h->off16[1] = _mm256_mul_ps(dmin, U8ToFloat8(_mm_srli_si128(mins, 8)));
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    return TwoBits<J>(p + 16);
  }
};

struct XQ3_K {
  static constexpr int kBytes = 110, kOff = 0;
  static constexpr bool kSigned = true;
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
    SetScales16(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)), h);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {  // bit 2 of element e: bit J of hmask[e]
    const __m256i high = _mm256_and_si256(ShiftBits<2 - J>(Load32(p)), Bytes(4));
    return _mm256_sub_epi8(_mm256_or_si256(TwoBits<J>(p + 32), high), Bytes(4));
  }
};

struct XIQ4_XS {
  static constexpr int kBytes = 136, kOff = 0;
  static constexpr bool kSigned = true;
  static HWY_INLINE void Head(const uint8_t* p, KHead* h) {
    h->d = LoadF16(p);
    // ls_j = (4 bits of byte 4 + j/2 at 4*(j%2)) | (bits 2j, 2j+1 of the u16 at p + 2) << 4.
    uint32_t lo_bytes;
    std::memcpy(&lo_bytes, p + 4, 4);
    const __m128i v = _mm_cvtsi32_si128(static_cast<int>(lo_bytes)), nib = _mm_set1_epi8(0xF);
    const __m256i lo = _mm256_cvtepu8_epi32(
        _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib)));
    const __m256i hi =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(LoadU16(p + 2)),
                                           _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                         _mm256_set1_epi32(3));
    const __m256i ls =
        _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    // Word k of the 16-block scales is ls_{k/2}: each dword holds ls_j twice.
    const __m256i s16 =
        _mm256_or_si256(_mm256_and_si256(ls, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(ls, 16));
    h->sc_lo = _mm256_permute2x128_si256(s16, s16, 0x00);
    h->sc_hi = _mm256_permute2x128_si256(s16, s16, 0x11);
  }
  template <int J>
  static HWY_INLINE __m256i Codes(const uint8_t* p) {
    return Iq4Levels32(Nibbles32(p + 8 + 16 * J));
  }
};

// One row x T tokens of a 256-element format.
template <class F, int T>
HWY_INLINE void KTile(const WeightMatrix& w, int64_t r, int64_t t0, const QuantActs& a, float* y) {
  const int64_t n_super = w.cols / 256;
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * n_super * F::kBytes;
  const TokenPtrs<T> x(a, t0);
  __m256 acc[T], corr[T];
  for (int t = 0; t < T; ++t) acc[t] = corr[t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* p = row + s * F::kBytes;
    KHead h;
    F::Head(p, &h);
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    auto block = [&]<int J>(std::integral_constant<int, J>) {
      const __m256i code = F::template Codes<J>(p);
      const __m256i code_abs = F::kSigned ? _mm256_sign_epi8(code, code) : code;
      const __m256i sc = ScaleOf<J>(h);
      for (int t = 0; t < T; ++t) {
        const __m256i pairs = PairSums<F::kSigned>(code_abs, code, x.q[t] + s * 256 + 32 * J);
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs, sc));
      }
    };
    [&]<int... J>(std::integer_sequence<int, J...>) {
      (block(std::integral_constant<int, J>()), ...);
    }
    (std::make_integer_sequence<int, 8>());
    for (int t = 0; t < T; ++t) {
      acc[t] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(h.d * x.d[t][s * 8]), acc[t]);
      if constexpr (F::kOff == 1) {
        corr[t] = _mm256_fmadd_ps(h.off32, _mm256_loadu_ps(x.dxs[t] + s * 8), corr[t]);
      } else if constexpr (F::kOff == 2) {
        corr[t] = _mm256_fmadd_ps(h.off16[0], _mm256_loadu_ps(x.dxs16[t] + s * 16), corr[t]);
        corr[t] = _mm256_fmadd_ps(h.off16[1], _mm256_loadu_ps(x.dxs16[t] + s * 16 + 8), corr[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) y[(t0 + t) * w.rows + r] = HSum(acc[t]) - HSum(corr[t]);
}

template <class F, int T>
HWY_INLINE void Int8Tile(const WeightMatrix& w, int64_t r, int64_t t0, const QuantActs& a,
                         float* y) {
  KTile<F, T>(w, r, t0, a, y);
}

// Rows [r_begin, r_end) x all tokens, one row at a time (decode: one
// sequential stream, which the hardware prefetchers follow best), tokens in
// tiles of 4 (the accumulators fill the 16 vector registers of AVX2).
template <class F>
void Int8Rows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const QuantActs& a,
              int64_t n_tokens, float* y) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n_tokens; t += 4) Int8Tile<F, 4>(w, r, t, a, y);
    if (t + 2 <= n_tokens) {
      Int8Tile<F, 2>(w, r, t, a, y);
      t += 2;
    }
    if (t < n_tokens) Int8Tile<F, 1>(w, r, t, a, y);
  }
}

// False for the types without an int8 kernel here (float types; the
// 32-element formats take Block32MatMulRows in matmul_x86_b32-inl.h).
HWY_INLINE bool Int8MatMulRows(const WeightMatrix& w, int64_t r_begin, int64_t r_end,
                               const QuantActs& a, int64_t n_tokens, float* y) {
  switch (w.type) {
    case GgmlType::kQ2_K:
      return Int8Rows<XQ2_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ3_K:
      return Int8Rows<XQ3_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ4_K:
      return Int8Rows<XQ4_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ5_K:
      return Int8Rows<XQ5_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kQ6_K:
      return Int8Rows<XQ6_K>(w, r_begin, r_end, a, n_tokens, y), true;
    case GgmlType::kIQ4_XS:
      return Int8Rows<XIQ4_XS>(w, r_begin, r_end, a, n_tokens, y), true;
    default:
      return false;
  }
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_MATMUL_X86_INL_H_
