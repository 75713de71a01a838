// MatMul: prepares activations (quantized for Q* weights), then splits the
// weight rows over the pool in groups of 4 (the decode tile height) and calls
// the dispatched per-target kernels in matmul_kernels.cc.
#include "ops/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "ops/matmul_kernels.h"
#include "ops/quantize.h"
#include "util/dtype.h"

namespace meshnet::ops {

namespace {

constexpr int64_t kRowGroup = 4;
// Below this much weight traffic (bytes x tokens) waking workers costs more
// than it saves (tiny models, tests): run on the calling thread.
constexpr int64_t kMinParallelWork = 64 << 10;
constexpr size_t kAlign = 64;

uint8_t* AlignUp(void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<uint8_t*>((v + kAlign - 1) & ~(uintptr_t{kAlign} - 1));
}

size_t RoundUp(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

}  // namespace

ActFormat ActFormatFor(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kBF16:
      return ActFormat::kF32;
    case GgmlType::kF16:
      return ActFormat::kF16;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
      return ActFormat::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return ActFormat::kQ8_1;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
      return ActFormat::kQ8_K;
  }
  return ActFormat::kF32;
}

bool MatMulQuantizesActivations(GgmlType type) {
  const ActFormat f = ActFormatFor(type);
  return f != ActFormat::kF32 && f != ActFormat::kF16;
}

size_t MatMulScratchBytes(GgmlType type, int64_t n_tokens, int64_t cols) {
  if (type == GgmlType::kF16) {  // the f16-rounded activations, made once per call
    return kAlign + RoundUp(static_cast<size_t>(n_tokens * cols) * sizeof(float));
  }
  if (!MatMulQuantizesActivations(type)) return 0;
  const auto nt = static_cast<size_t>(n_tokens);
  const auto nb = static_cast<size_t>(cols / 32);
  return kAlign + RoundUp(nt * static_cast<size_t>(cols) * sizeof(int16_t)) +
         2 * RoundUp(nt * static_cast<size_t>(cols)) + 2 * RoundUp(nt * nb * sizeof(float)) +
         RoundUp(nt * 2 * nb * sizeof(float));
}

size_t PackedWeightBytes(const WeightMatrix& w) {
  if (w.rows < 16 || !internal::PackedSupported(w.type)) return 0;
  return static_cast<size_t>(w.rows / 16 * internal::PackedGroupBytes(w.type, w.cols));
}

namespace {

// Calls fn(blk, i, src) for each packed block of 16 rows and `cols_per_block`
// columns: blk its bytes in `dst` (`packed_block` each, groups in order),
// i in [0, 16) a row of the group, src that row's GGUF block.
template <class Fn>
void ForPackedBlocks(const WeightMatrix& w, int64_t cols_per_block, int64_t packed_block,
                     uint8_t* dst, Fn&& fn) {
  const int64_t nb = w.cols / cols_per_block;
  const size_t row_bytes = RowBytes(w.type, w.cols);
  const size_t src_block = RowBytes(w.type, cols_per_block);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t g = 0; g < w.rows / 16; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = dst + (g * nb + b) * packed_block;
      for (int i = 0; i < 16; ++i) {
        fn(blk, i, src + static_cast<size_t>(g * 16 + i) * row_bytes + b * src_block);
      }
    }
  }
}

// Row i's codes of a 32-column block as the packed nibble layouts hold them
// (what PackedNibbles reads): 4 vectors of 64 bytes at dst, vector c's lane i
// the codes of columns 8c..8c+3 in the low nibbles, 8c+4..8c+7 in the high.
// code(e): the low 4 bits of column e's code.
template <class Code>
void PackNibbleVectors(uint8_t* dst, int i, Code&& code) {
  for (int c = 0; c < 4; ++c) {
    for (int k = 0; k < 4; ++k) {
      dst[64 * c + 4 * i + k] = static_cast<uint8_t>(code(8 * c + k) | code(8 * c + 4 + k) << 4);
    }
  }
}

// Row i's one-bit planes of a 32-column block (Q5's fifth bits, Q3_K's
// third; what PackedFifth reads): one vector of 64 bytes at dst, lane i's
// byte m bit j the bit of column 4j + m. bit(e): column e's bit. OR-ed in:
// dst starts zeroed.
template <class Bit>
void PackBitVector(uint8_t* dst, int i, Bit&& bit) {
  for (int e = 0; e < 32; ++e) dst[4 * i + e % 4] |= static_cast<uint8_t>(bit(e) << (e / 4));
}

// The low nibble of element e of a 16-byte nibble block at q (GGML's order:
// e < 16 in byte e's low nibble, e >= 16 in byte e - 16's high one).
int NibbleOf(const uint8_t* q, int e) { return (e < 16 ? q[e] : q[e - 16] >> 4) & 0xF; }

void PackQ8_0(const WeightMatrix& w, uint8_t* dst) {
  ForPackedBlocks(w, 32, internal::kPackedQ8Block, dst,
                  [](uint8_t* blk, int i, const uint8_t* block) {
                    for (int c = 0; c < 8; ++c) {
                      std::memcpy(blk + 64 * c + 4 * i, block + 2 + 4 * c, 4);
                    }
                    std::memcpy(blk + 512 + 2 * i, block, 2);  // the f16 scale
                    int16_t sum = 0;
                    for (int k = 0; k < 32; ++k) {
                      sum = static_cast<int16_t>(sum + static_cast<int8_t>(block[2 + k]));
                    }
                    std::memcpy(blk + 544 + 2 * i, &sum, 2);
                  });
}

// Q4_K (block_q4_K: d, dmin, 12 scale bytes, 128 nibble bytes: 32-block 2k's
// codes in the low nibbles of bytes 32k..32k+31, 2k+1's in the high ones),
// Q5_K (block_q5_K: the same with qh[32] before the nibbles, element e of
// 32-block j's fifth bit at bit j of qh[e]) and IQ4_XS (block_iq4_xs: d,
// scales_h, scales_l[4], then per 32-block 16 nibble bytes, element e < 16 in
// byte e's low nibble, e >= 16 in byte e - 16's high one). The fifth bits are
// OR-ed into `dst`, which PackWeights zeroed.
void PackK4(const WeightMatrix& w, uint8_t* dst) {
  const bool q5 = w.type == GgmlType::kQ5_K, iq = w.type == GgmlType::kIQ4_XS;
  const int64_t kj = q5 ? 320 : 256, sc_at = 8 * kj;
  const int64_t block = internal::PackedGroupBytes(w.type, 256);
  ForPackedBlocks(w, 256, block, dst, [&](uint8_t* blk, int i, const uint8_t* q) {
    for (int j = 0; j < 8; ++j) {
      PackNibbleVectors(blk + kj * j, i, [&](int e) {  // the low 4 bits of element e of block j
        if (iq) return NibbleOf(q + 8 + 16 * j, e);
        const uint8_t byte = q[(q5 ? 48 : 16) + 32 * (j / 2) + e];
        return j % 2 == 0 ? byte & 0xF : byte >> 4;
      });
      if (q5) PackBitVector(blk + kj * j + 256, i, [&](int e) { return (q[16 + e] >> j) & 1; });
      if (iq) {
        uint16_t high;
        std::memcpy(&high, q + 2, 2);
        const int ls = ((q[4 + j / 2] >> (4 * (j % 2))) & 0xF) | ((high >> (2 * j)) & 3) << 4;
        blk[sc_at + 16 * j + i] = static_cast<uint8_t>(static_cast<int8_t>(ls - 32));
      } else {
        uint8_t sc, m;
        Q4KScaleMin(j, q + 4, &sc, &m);
        blk[sc_at + 16 * j + i] = sc;
        blk[sc_at + 128 + 16 * j + i] = m;
      }
    }
    if (iq) {
      std::memcpy(blk + sc_at + 128 + 2 * i, q, 2);  // d
    } else {
      std::memcpy(blk + sc_at + 256 + 2 * i, q, 2);           // d
      std::memcpy(blk + sc_at + 256 + 32 + 2 * i, q + 2, 2);  // dmin
    }
  });
}

// Q6_K (block_q6_K: ql[128], qh[64], int8 scales[16], f16 d): element e's
// code is a nibble of ql and two bits of qh as GGML's dequantize_row_q6_K
// reads them; its scale is scales[e / 16]. The bits are OR-ed into `dst`,
// which PackWeights zeroed.
void PackQ6_K(const WeightMatrix& w, uint8_t* dst) {
  ForPackedBlocks(w, 256, internal::kPackedQ6KBlock, dst,
                  [](uint8_t* blk, int i, const uint8_t* q) {
                    auto code = [&](int e) {
                      const int n = e / 128, quarter = e % 128 / 32, l = e % 32;
                      const uint8_t ql = q[64 * n + l + 32 * (quarter & 1)];
                      const int lo = quarter < 2 ? ql & 0xF : ql >> 4;
                      const int hi = (q[128 + 32 * n + l] >> (2 * quarter)) & 3;
                      return lo | hi << 4;
                    };
                    for (int j = 0; j < 8; ++j) {
                      for (int c = 0; c < 8; ++c) {
                        for (int b = 0; b < 4; ++b) {
                          const int v = code(32 * j + 4 * c + b);
                          blk[384 * j + 64 * (c / 2) + 4 * i + b] |=
                              static_cast<uint8_t>((v & 0xF) << (4 * (c % 2)));
                          blk[384 * j + 256 + 64 * (c / 4) + 4 * i + b] |=
                              static_cast<uint8_t>((v >> 4) << (2 * (c % 4)));
                        }
                      }
                    }
                    for (int k = 0; k < 16; ++k) blk[3072 + 16 * k + i] = q[192 + k];
                    std::memcpy(blk + 3328 + 2 * i, q + 208, 2);  // d
                  });
}

// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (GGUF blocks: f16 d, [f16 m], [u32 fifth
// bits], 16 nibble bytes: column e < 16 in byte e's low nibble, e >= 16 in
// byte e - 16's high one), two blocks per unit (PackedB32UnitBytes). The bits
// are OR-ed into `dst`, which PackWeights zeroed.
void PackB32(const WeightMatrix& w, uint8_t* dst) {
  const bool fifth = w.type == GgmlType::kQ5_0 || w.type == GgmlType::kQ5_1;
  const bool min = w.type == GgmlType::kQ4_1 || w.type == GgmlType::kQ5_1;
  const int64_t block_bytes = RowBytes(w.type, 32);
  const int qs_at = 2 + (min ? 2 : 0) + (fifth ? 4 : 0);
  const int64_t d_at = fifth ? 640 : 512;
  ForPackedBlocks(w, 64, internal::PackedB32UnitBytes(w.type), dst,
                  [&](uint8_t* unit, int i, const uint8_t* src) {
                    for (int k = 0; k < 2; ++k) {
                      const uint8_t* q = src + k * block_bytes;
                      PackNibbleVectors(unit + 256 * k, i,
                                        [&](int e) { return NibbleOf(q + qs_at, e); });
                      if (fifth) {
                        uint32_t qh;
                        std::memcpy(&qh, q + 2 + (min ? 2 : 0), 4);
                        PackBitVector(unit + 512 + 64 * k, i,
                                      [&](int e) { return static_cast<int>((qh >> e) & 1); });
                      }
                      std::memcpy(unit + d_at + 32 * k + 2 * i, q, 2);
                      if (min) std::memcpy(unit + d_at + 64 + 32 * k + 2 * i, q + 2, 2);
                    }
                  });
}

// Q2_K (block_q2_K: scales[16] as scale | min << 4, qs[64], d, dmin) and
// Q3_K (block_q3_K: hmask[32], qs[64], 12 scale bytes, d): element e of
// 32-block j has its low 2 bits at bits 2*(j%4) of qs[32*(j/4) + e % 32] and
// (Q3_K) its third bit at bit j of hmask[e]; element n of the super-block
// takes scale byte n / 16. The bits are OR-ed into `dst`, which PackWeights
// zeroed.
void PackKSmall(const WeightMatrix& w, uint8_t* dst) {
  const bool q3 = w.type == GgmlType::kQ3_K;
  const int qs_at = q3 ? 32 : 16;
  const int64_t sc_at = q3 ? 1536 : 1024;
  ForPackedBlocks(w, 256, internal::PackedGroupBytes(w.type, 256), dst,
                  [&](uint8_t* blk, int i, const uint8_t* q) {
                    for (int n = 0; n < 256; ++n) {
                      const int j = n / 32, e = n % 32, k = n / 16, c = n % 16 / 4, m = n % 4;
                      const int low = (q[qs_at + 32 * (j / 4) + e] >> (2 * (j % 4))) & 3;
                      blk[64 * k + 4 * i + m] |= static_cast<uint8_t>(low << (2 * c));
                    }
                    if (q3) {
                      for (int j = 0; j < 8; ++j) {
                        PackBitVector(blk + 1024 + 64 * j, i,
                                      [&](int e) { return (q[e] >> j) & 1; });
                      }
                    }
                    int8_t sc3[16];
                    if (q3) Q3KScales(q + 96, sc3);
                    for (int k = 0; k < 16; ++k) {
                      blk[sc_at + 16 * k + i] = q3 ? static_cast<uint8_t>(sc3[k]) : q[k];
                    }
                    std::memcpy(blk + sc_at + 256 + 2 * i, q + (q3 ? 108 : 80), 2);  // d
                    if (!q3) std::memcpy(blk + sc_at + 288 + 2 * i, q + 82, 2);      // dmin
                  });
}

}  // namespace

void PackWeights(const WeightMatrix& w, void* out) {
  const int64_t group = internal::PackedGroupBytes(w.type, w.cols);
  if (group == 0) return;  // no layout (PackedWeightBytes is 0)
  // The padding, and the OR-ed bits, start from zero.
  std::memset(out, 0, static_cast<size_t>(w.rows / 16 * group));
  if (w.type == GgmlType::kQ8_0) return PackQ8_0(w, static_cast<uint8_t*>(out));
  if (w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ5_K || w.type == GgmlType::kIQ4_XS) {
    return PackK4(w, static_cast<uint8_t*>(out));
  }
  if (w.type == GgmlType::kQ6_K) return PackQ6_K(w, static_cast<uint8_t*>(out));
  if (w.type == GgmlType::kQ2_K || w.type == GgmlType::kQ3_K) {
    return PackKSmall(w, static_cast<uint8_t*>(out));
  }
  if (internal::PackedB32UnitBytes(w.type) > 0) PackB32(w, static_cast<uint8_t*>(out));
}

namespace {

// The matrices of one MatMulMany call that share their prepared activations,
// each a range of work units (groups of 16 packed rows, or of kRowGroup rows)
// in one index space, so that one parallel job covers them all.
struct Parts {
  const WeightMatrix* w[kMaxMany];
  float* y[kMaxMany];
  int64_t first[kMaxMany + 1];  // unit index where matrix i starts; first[n] = total
  int n = 0;
  bool packed = false;
};

// Calls fn(w, y, local_begin, local_end) for each matrix's share of units
// [u0, u1).
template <class Fn>
void ForEachPart(const Parts& p, int64_t u0, int64_t u1, Fn&& fn) {
  for (int i = 0; i < p.n && u0 < u1; ++i) {
    const int64_t lo = std::max(u0, p.first[i]), hi = std::min(u1, p.first[i + 1]);
    if (lo < hi) fn(*p.w[i], p.y[i], lo - p.first[i], hi - p.first[i]);
  }
}

// The float types (F32, BF16, F16: activations rounded once into scratch).
void MatMulFloatParts(const Parts& p, const float* x, int64_t n_tokens, void* scratch,
                      ThreadPool* pool, int64_t min_chunk) {
  bool round_acts = p.w[0]->type == GgmlType::kF16;
  const float* xa = x;
  if (round_acts && scratch != nullptr) {
    auto* xr = reinterpret_cast<float*>(AlignUp(scratch));
    internal::RoundToF16(x, n_tokens * p.w[0]->cols, xr);
    xa = xr;
    round_acts = false;
  }
  ParallelForOrInline(
      pool, p.first[p.n],
      [&](int64_t u0, int64_t u1) {
        ForEachPart(p, u0, u1, [&](const WeightMatrix& w, float* y, int64_t g0, int64_t g1) {
          internal::MatMulFloatRows(w, g0 * kRowGroup, std::min(w.rows, g1 * kRowGroup), xa,
                                    n_tokens, y, round_acts);
        });
      },
      min_chunk);
}

// u8 = q8 + 128 (flipping the sign bit), eight bytes at a time.
void ToUnsigned(const int8_t* q8, uint8_t* u8, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, q8 + i, 8);
    w ^= 0x8080808080808080ULL;
    std::memcpy(u8 + i, &w, 8);
  }
  for (; i < n; ++i) u8[i] = static_cast<uint8_t>(q8[i]) ^ 0x80;
}

// The activations of the Q* types, quantized once into scratch (over the pool
// when there are several tokens); the packed Q8_0 tile also reads them as
// unsigned bytes.
internal::QuantActs QuantizeInto(GgmlType type, const float* x, int64_t n_tokens, int64_t cols,
                                 bool unsigned_too, void* scratch, ThreadPool* pool) {
  const auto nt = static_cast<size_t>(n_tokens);
  const auto nb = static_cast<size_t>(cols / 32);
  uint8_t* p = AlignUp(scratch);
  internal::QuantActs acts;
  acts.cols = cols;
  acts.q = reinterpret_cast<int16_t*>(p);
  p += RoundUp(nt * static_cast<size_t>(cols) * sizeof(int16_t));
  acts.q8 = reinterpret_cast<int8_t*>(p);
  p += RoundUp(nt * static_cast<size_t>(cols));
  if (unsigned_too) acts.u8 = p;
  p += RoundUp(nt * static_cast<size_t>(cols));
  acts.d = reinterpret_cast<float*>(p);
  p += RoundUp(nt * nb * sizeof(float));
  acts.dxs = reinterpret_cast<float*>(p);
  p += RoundUp(nt * nb * sizeof(float));
  acts.dxs16 = reinterpret_cast<float*>(p);
  const ActFormat fmt = ActFormatFor(type);
  auto quantize = [&](int64_t t0, int64_t t1) {
    internal::QuantizeActs(fmt, x, t0, t1, acts);
    if (acts.u8 != nullptr) ToUnsigned(acts.q8 + t0 * cols, acts.u8 + t0 * cols, (t1 - t0) * cols);
  };
  if (n_tokens == 1 || pool == nullptr) {
    quantize(0, n_tokens);
  } else {
    pool->ParallelFor(n_tokens, quantize);
  }
  return acts;
}

void MatMulQuantParts(const Parts& p, const float* x, int64_t n_tokens, void* scratch,
                      ThreadPool* pool, int64_t min_chunk) {
  const WeightMatrix& w0 = *p.w[0];
  // The packed Q8_0 tile reads the activations as unsigned.
  const bool unsigned_too = p.packed && w0.type == GgmlType::kQ8_0;
  const internal::QuantActs acts =
      QuantizeInto(w0.type, x, n_tokens, w0.cols, unsigned_too, scratch, pool);
  // Units: groups of 16 packed rows (a decode chunk of two streams enough),
  // or of kRowGroup rows.
  ParallelForOrInline(
      pool, p.first[p.n],
      [&](int64_t u0, int64_t u1) {
        ForEachPart(p, u0, u1, [&](const WeightMatrix& w, float* y, int64_t g0, int64_t g1) {
          if (p.packed) return internal::MatMulPackedRows(w, g0, g1, acts, n_tokens, y);
          internal::MatMulQuantRows(w, g0 * kRowGroup, std::min(w.rows, g1 * kRowGroup), acts,
                                    n_tokens, y);
        });
      },
      p.packed ? (n_tokens == 1 ? 2 : 1) : min_chunk);
  if (!p.packed) return;
  for (int i = 0; i < p.n; ++i) {  // rows past the last group of 16
    const WeightMatrix& w = *p.w[i];
    const int64_t done = w.rows / 16 * 16;
    if (done < w.rows) internal::MatMulQuantRows(w, done, w.rows, acts, n_tokens, p.y[i]);
  }
}

// Whether MatMulMany can prepare the activations once for all of them.
bool ShareInput(std::span<const WeightMatrix* const> ws) {
  for (const WeightMatrix* w : ws) {
    if (w->type != ws[0]->type || w->cols != ws[0]->cols ||
        (w->packed != nullptr) != (ws[0]->packed != nullptr)) {
      return false;
    }
  }
  return true;
}

}  // namespace

void MatMul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, void* scratch,
            ThreadPool* pool) {
  const WeightMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  MatMulMany(ws, x, n_tokens, ys, scratch, pool);
}

void MatMulMany(std::span<const WeightMatrix* const> ws, const float* x, int64_t n_tokens,
                std::span<float* const> ys, void* scratch, ThreadPool* pool) {
  if (n_tokens <= 0 || ws.empty()) return;
  if (ws.size() > static_cast<size_t>(kMaxMany) || !ShareInput(ws)) {
    for (size_t i = 0; i < ws.size(); ++i) MatMul(*ws[i], x, n_tokens, ys[i], scratch, pool);
    return;
  }
  Parts p;
  p.packed = ws[0]->packed != nullptr;
  int64_t work = 0;
  p.first[0] = 0;
  for (const WeightMatrix* w : ws) {
    p.w[p.n] = w;
    p.y[p.n] = ys[static_cast<size_t>(p.n)];
    const int64_t units = p.packed ? w->rows / 16 : (w->rows + kRowGroup - 1) / kRowGroup;
    p.first[p.n + 1] = p.first[p.n] + units;
    work += RowBytes(w->type, w->cols) * w->rows * n_tokens;
    ++p.n;
  }
  if (p.first[p.n] == 0 && !p.packed) return;  // no rows
  if (work < kMinParallelWork) pool = nullptr;
  // Enough groups per chunk that a chunk streams a few hundred KB in decode.
  const int64_t min_chunk = n_tokens == 1 ? 8 : 1;
  if (MatMulQuantizesActivations(ws[0]->type)) {
    MatMulQuantParts(p, x, n_tokens, scratch, pool, min_chunk);
  } else {
    MatMulFloatParts(p, x, n_tokens, scratch, pool, min_chunk);
  }
}

// ---------------------------------------------------------------- references

namespace {

float RoundToHalf(float v) { return HalfToFloat(FloatToHalf(v)); }

// q8_0 / q8_1 of one 32-block.
void Q8_0Reference(const float* x, bool with_sum, int16_t* q, float* d, float* s) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.0f;
  const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int i = 0; i < 32; ++i) {
    q[i] = static_cast<int16_t>(std::nearbyint(x[i] * inv));
    sum += q[i];
  }
  *d = RoundToHalf(scale);
  *s = with_sum ? RoundToHalf(scale * static_cast<float>(sum)) : 0.0f;
}

// q8_K of one 256-block; d gets the scale 8 times (once per 32-block).
void Q8_KReference(const float* x, int16_t* q, float* d) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < kQK_K; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  const float iscale = amax != 0.0f ? -127.0f / vmax : 0.0f;
  for (int i = 0; i < kQK_K; ++i) {
    q[i] = static_cast<int16_t>(std::min(127.0f, std::nearbyint(iscale * x[i])));
  }
  for (int j = 0; j < 8; ++j) d[j] = amax != 0.0f ? 1.0f / iscale : 0.0f;
}

}  // namespace

void QuantizeActivationsReference(GgmlType type, const float* x, int64_t cols, int16_t* q, float* d,
                                  float* s) {
  const ActFormat fmt = ActFormatFor(type);
  if (fmt == ActFormat::kQ8_K) {
    for (int64_t b = 0; b < cols / kQK_K; ++b) {
      Q8_KReference(x + b * kQK_K, q + b * kQK_K, d + b * 8);
    }
    for (int64_t b = 0; b < cols / 32; ++b) s[b] = 0.0f;
    return;
  }
  for (int64_t b = 0; b < cols / 32; ++b) {
    Q8_0Reference(x + b * 32, fmt == ActFormat::kQ8_1, q + b * 32, d + b, s + b);
  }
}

namespace {

// Activations as MatMul sees them (dequantized or f16-rounded), per token.
struct RefActs {
  std::vector<double> xs;   // (n_tokens, cols)
  std::vector<float> d, s;  // (n_tokens, cols/32), Q* types only
  std::vector<int> sumq;    // (n_tokens, cols/32), Q* types only
};

RefActs PrepareRefActs(GgmlType type, const float* x, int64_t n_tokens, int64_t cols,
                       bool quantized_acts) {
  RefActs a;
  a.xs.resize(static_cast<size_t>(n_tokens * cols));
  const ActFormat fmt = quantized_acts ? ActFormatFor(type) : ActFormat::kF32;
  if (fmt == ActFormat::kF32 || fmt == ActFormat::kF16) {
    for (size_t i = 0; i < a.xs.size(); ++i) {
      a.xs[i] = fmt == ActFormat::kF16 ? RoundToHalf(x[i]) : x[i];
    }
    return a;
  }
  const int64_t nb = cols / 32;
  a.d.resize(static_cast<size_t>(n_tokens * nb));
  a.s.resize(a.d.size());
  a.sumq.assign(a.d.size(), 0);
  std::vector<int16_t> q(static_cast<size_t>(cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* d = a.d.data() + t * nb;
    QuantizeActivationsReference(type, x + t * cols, cols, q.data(), d, a.s.data() + t * nb);
    for (int64_t i = 0; i < cols; ++i) {
      a.xs[t * cols + i] = static_cast<double>(q[i]) * d[i / 32];
      a.sumq[t * nb + i / 32] += q[i];
    }
  }
  return a;
}

void ReferenceImpl(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
                   bool quantized_acts) {
  const int64_t row_bytes = RowBytes(w.type, w.cols);
  const int64_t nb = w.cols / 32;
  std::vector<float> wrow(static_cast<size_t>(w.cols));
  const RefActs a = PrepareRefActs(w.type, x, n_tokens, w.cols, quantized_acts);
  const bool q8_1 = quantized_acts && ActFormatFor(w.type) == ActFormat::kQ8_1;
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * row_bytes;
    DequantizeRow(w.type, row, w.cols, wrow.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0.0;
      for (int64_t i = 0; i < w.cols; ++i) sum += wrow[i] * a.xs[t * w.cols + i];
      // q8_1: the offset m of each Q4_1/Q5_1 block (f16 at byte 2) multiplies
      // the stored s instead of d*sum(q).
      for (int64_t b = 0; q8_1 && b < nb; ++b) {
        uint16_t m;
        std::memcpy(&m, row + b * (row_bytes / nb) + 2, 2);
        const size_t k = static_cast<size_t>(t * nb + b);
        sum += static_cast<double>(HalfToFloat(m)) *
               (static_cast<double>(a.s[k]) - static_cast<double>(a.d[k]) * a.sumq[k]);
      }
      y[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace

void MatMulReference(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  ReferenceImpl(w, x, n_tokens, y, /*quantized_acts=*/false);
}

void MatMulReferenceQuantized(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  ReferenceImpl(w, x, n_tokens, y, /*quantized_acts=*/true);
}

}  // namespace meshnet::ops
