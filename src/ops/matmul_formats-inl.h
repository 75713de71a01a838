// Internal: the GGML block formats as seen by the quantized matmul kernels
// (matmul_kernels.cc), compiled once per Highway target: how to read a
// block's scales and unpack its codes to int16 lanes. Not a public API.
//
// Per-target include guard (Highway's -inl.h convention): this header is
// re-included by foreach_target for every target.
#if defined(MESHNET_OPS_MATMUL_FORMATS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MESHNET_OPS_MATMUL_FORMATS_INL_H_
#undef MESHNET_OPS_MATMUL_FORMATS_INL_H_
#else
#define MESHNET_OPS_MATMUL_FORMATS_INL_H_
#endif

#include <cstring>

#include "hwy/highway.h"
#include "ops/half_inline.h"
#include "ops/quantize.h"

HWY_BEFORE_NAMESPACE();
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One int16 vector holds up to a whole 32-block (AVX-512); narrower targets
// take 32 / kN16 chunks per block, each inside one 16-block scale / nibble half.
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

// Each format: kSuper elements per super-block of kBytes, kSub 32-blocks in it;
// Header(p) reads per-32-block float scale and offset (kHasOff: the block's
// value is scale*code - off, and off multiplies the activations' d*sum(q);
// kHasOff16: the same per 16-block with off16); Code(p, h, j, e) returns the
// int16 codes of elements [e, e + Lanes(D16)) of 32-block j.

struct SubScales {
  HWY_ALIGN float scale[8];
  HWY_ALIGN float off[8];
  HWY_ALIGN float off16[16];  // Q2_K: dmin * min of each 16-block
  int8_t sc16[16];            // Q3_K: the signed 6-bit 16-block scales
};
using D8F = hn::CappedTag<float, 8>;  // one lane per 32-block of a K super-block

// Element i of a 32-block whose 16 bytes at p hold i in the low nibble of
// p[i] and i+16 in the high nibble (Q4_*, Q5_*, IQ4_*): the nibbles of
// elements [e, e + Lanes(d)).
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<uint8_t, D>> Nibbles(D, const uint8_t* p, size_t e) {
  const hn::Rebind<uint8_t, D> du8;
#if HWY_TARGET != HWY_SCALAR  // (no Combine there; kN16 is 1)
  if constexpr (kN16 == 32) {
    const hn::Half<decltype(du8)> dh;
    const auto bytes = hn::LoadU(dh, p);
    return hn::Combine(du8, hn::ShiftRight<4>(bytes), hn::And(bytes, hn::Set(dh, 0xF)));
  }
#endif
  const auto bytes = hn::LoadU(du8, p + (e < 16 ? e : e - 16));
  return e < 16 ? hn::And(bytes, hn::Set(du8, 0xF)) : hn::ShiftRight<4>(bytes);
}

// IQ4 levels of nibble codes: a byte shuffle within each 128-bit block.
HWY_ALIGN static constexpr int8_t kIq4Table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                   1,    13,   25,  38,  53,  69,  89,  113};
template <class D>
HWY_INLINE hn::Vec<D> Iq4Levels(D d, hn::Vec<hn::Rebind<uint8_t, D>> nib) {
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(d, kIq4Table[hn::GetLane(nib)]);
#else
  const hn::Rebind<int8_t, D> di8;
  const hn::CappedTag<int8_t, (kN16 > 16 ? kN16 : 16)> dt;
  const auto levels = hn::TableLookupBytes(hn::LoadDup128(dt, kIq4Table), hn::BitCast(di8, nib));
  return hn::PromoteTo(d, levels);
#endif
}

// Bit (e + lane) of the 32-bit qh, as 0 or 16 (Q5_0/Q5_1's fifth code bit).
HWY_ALIGN static constexpr int16_t kLaneBit[32] = {
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, -32768,
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, -32768};
template <class D>
HWY_INLINE hn::Vec<D> Q5High(D d, const uint8_t* qh_bytes, size_t e) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const auto lo = static_cast<int16_t>(qh & 0xFFFF), hi = static_cast<int16_t>(qh >> 16);
  hn::Vec<D> src;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kN16 == 32) {
    const hn::Half<D> dh;
    src = hn::Combine(d, hn::Set(dh, hi), hn::Set(dh, lo));
  } else
#endif
  {
    src = hn::Set(d, e < 16 ? lo : hi);
  }
  const auto bit = hn::LoadU(d, kLaneBit + e % 16);
  return hn::IfThenElseZero(hn::Ne(hn::And(src, bit), hn::Zero(d)), hn::Set(d, 16));
}

// code * the 16-block scale sc[0] (lanes of elements < 16) or sc[1].
template <class D>
HWY_INLINE hn::Vec<D> MulScale16(D d, hn::Vec<D> code, const int8_t* sc, size_t e) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kN16 == 32) {  // lanes [0, 16) and [16, 32) have their own scale
    const hn::Half<D> dh;
    return hn::Mul(code, hn::Combine(d, hn::Set(dh, sc[1]), hn::Set(dh, sc[0])));
  }
#endif
  return hn::Mul(code, hn::Set(d, sc[e / 16]));
}

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

// Q4_K/Q5_K's 12 packed scale bytes at p unpacked to 8 scales, then 8 mins
// (bytes of out). As three words: bytes 0-3 hold scales 0-3 (low 6 bits) and
// the top 2 bits of scales 4-7; bytes 4-7 the same for mins; bytes 8-11 the
// low nibbles of scales 4-7 and mins 4-7 (cf. Q4KScaleMin).
HWY_INLINE void Q4KPackedScales(const uint8_t* p, uint32_t out[4]) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  out[0] = u[0] & 0x3f3f3f3fu;
  out[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  out[2] = u[1] & 0x3f3f3f3fu;
  out[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
}

struct Q4_KFmt {
  static constexpr int kSuper = 256, kBytes = 144, kSub = 8;
  static constexpr bool kHasOff = true;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    const float d = LoadF16(p);
    const float dmin = LoadF16(p + 2);
    uint32_t packed[4];
    Q4KPackedScales(p + 4, packed);
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
    return MulScale16(d, code, sc, e);
  }
};

struct Q5_0Fmt {  // value = d*(code - 16)
  static constexpr int kSuper = 32, kBytes = 22, kSub = 1;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) { h->scale[0] = LoadF16(p); }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int, size_t e) {
    const auto code = hn::Or(hn::PromoteTo(d, Nibbles(d, p + 6, e)), Q5High(d, p + 2, e));
    return hn::Sub(code, hn::Set(d, 16));
  }
};

// Q4_1 (kFifth false) and Q5_1: d, m, Q5_1's fifth bits, the nibbles;
// value = d*code + m.
template <bool kFifth>
struct Qx_1Fmt {
  static constexpr int kSuper = 32, kBytes = kFifth ? 24 : 20, kSub = 1;
  static constexpr bool kHasOff = true;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    h->scale[0] = LoadF16(p);
    h->off[0] = -LoadF16(p + 2);
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int, size_t e) {
    const auto lo = hn::PromoteTo(d, Nibbles(d, p + (kFifth ? 8 : 4), e));
    if constexpr (kFifth) return hn::Or(lo, Q5High(d, p + 4, e));
    return lo;
  }
};
using Q4_1Fmt = Qx_1Fmt<false>;
using Q5_1Fmt = Qx_1Fmt<true>;

struct IQ4_NLFmt {  // value = d*level
  static constexpr int kSuper = 32, kBytes = 18, kSub = 1;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) { h->scale[0] = LoadF16(p); }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int, size_t e) {
    return Iq4Levels(d, Nibbles(d, p + 2, e));
  }
};

// Q2_K/Q3_K: element e of 32-block j has its 2-bit code in byte
// 32*(j/4) + e of qs, at bit 2*(j%4); its 16-block is 2j + e/16.
template <class D>
HWY_INLINE hn::Vec<D> TwoBitCodes(D d, const uint8_t* qs, int j, size_t e) {
  const auto bytes = hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), qs + 32 * (j / 4) + e));
  return hn::And(hn::ShiftRightSame(bytes, 2 * (j % 4)), hn::Set(d, 3));
}

struct Q2_KFmt {  // value = d*sc*code - dmin*m per 16-block
  static constexpr int kSuper = 256, kBytes = 84, kSub = 8;
  static constexpr bool kHasOff = false, kHasOff16 = true;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    const float d = LoadF16(p + 80);
    const float dmin = LoadF16(p + 82);
    for (int j = 0; j < 8; ++j) h->scale[j] = d;
    for (int k = 0; k < 16; ++k) {
      h->off16[k] = dmin * static_cast<float>(p[k] >> 4);
      h->sc16[k] = static_cast<int8_t>(p[k] & 0xF);
    }
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales& h, int j, size_t e) {
    return MulScale16(d, TwoBitCodes(d, p + 16, j, e), h.sc16 + 2 * j, e);
  }
};

struct Q3_KFmt {  // value = d*(sc-32)*code, code in [-4, 3]
  static constexpr int kSuper = 256, kBytes = 110, kSub = 8;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    const float d = LoadF16(p + 108);
    for (int j = 0; j < 8; ++j) h->scale[j] = d;
    Q3KScales(p + 96, h->sc16);
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales& h, int j, size_t e) {
    // Bit 2 of element e of 32-block j is bit j of hmask[e].
    const auto hm = hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + e));
    const auto high = hn::ShiftLeft<2>(hn::And(hn::ShiftRightSame(hm, j), hn::Set(d, 1)));
    const auto code = hn::Sub(hn::Or(TwoBitCodes(d, p + 32, j, e), high), hn::Set(d, 4));
    return MulScale16(d, code, h.sc16 + 2 * j, e);
  }
};

struct Q5_KFmt {  // Q4_K's scales and mins with a fifth code bit
  static constexpr int kSuper = 256, kBytes = 176, kSub = 8;
  static constexpr bool kHasOff = true;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) { Q4_KFmt::Header(p, h); }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int j, size_t e) {
    const auto bytes =
        hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + 48 + 32 * (j / 2) + e));
    const auto lo = (j % 2 == 0) ? hn::And(bytes, hn::Set(d, 0xF)) : hn::ShiftRight<4>(bytes);
    const auto qh = hn::PromoteTo(d, hn::LoadU(hn::Rebind<uint8_t, D>(), p + 16 + e));
    return hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(qh, j), hn::Set(d, 1))));
  }
};

struct IQ4_XSFmt {  // value = d*(ls-32)*level per 32-block
  static constexpr int kSuper = 256, kBytes = 136, kSub = 8;
  static constexpr bool kHasOff = false;
  static HWY_INLINE void Header(const uint8_t* p, SubScales* h) {
    const float d = LoadF16(p);
    const uint16_t sh = LoadU16(p + 2);
    for (int j = 0; j < 8; ++j) {
      const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
      h->scale[j] = d * static_cast<float>(ls - 32);
    }
  }
  template <class D>
  static HWY_INLINE hn::Vec<D> Code(D d, const uint8_t* p, const SubScales&, int j, size_t e) {
    return Iq4Levels(d, Nibbles(d, p + 8 + 16 * j, e));
  }
};

template <class Fmt>
constexpr bool HasOff16() {
  if constexpr (requires { Fmt::kHasOff16; }) {
    return Fmt::kHasOff16;
  } else {
    return false;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#endif  // MESHNET_OPS_MATMUL_FORMATS_INL_H_
