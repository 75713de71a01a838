// Highway attention kernels for ops/nn.h (dynamic dispatch): grouped-query
// causal attention over a paged KV layer in any KvDtype. Threading and the
// wrappers live in nn.cc; the scalar reference in nn_reference.cc; the
// q8_0 / q4_0 dot products and V sums in attention_quant-inl.h.
//
// Online ("flash") softmax per (token, query head): keys are visited in
// chunks of kChunk positions; for each head we keep a running max m, running
// denominator l and an unnormalized output o, rescaled by exp(m_old - m_new)
// when the max grows. No score buffer: o lives on the stack (kPairFloats
// floats). A head's arithmetic depends only on its query and its session's
// KV, never on which other heads, tokens or sessions share a call or on the
// thread that runs it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h.
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/attention_quant-inl.h"

#ifndef MESHNET_OPS_ATTENTION_KERNELS_ONCE
#define MESHNET_OPS_ATTENTION_KERNELS_ONCE
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/kv_quant.h"
#include "ops/nn.h"
#include "ops/nn_kernels.h"
#include "util/dtype.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DA = hn::CappedTag<float, 8>;  // head_dim is often 64/128, sometimes 8
constexpr int kChunk = 16;
// Attention scratch: the running outputs of kPairFloats / head_dim pairs
// (at most kMaxPairs) on the stack, 32 KB.
constexpr int kPairFloats = 16 * kMaxHeadDim;
constexpr int kMaxPairs = 64;
// With q8_0 / q4_0 keys, the pairs' quantized queries (each padded to whole
// blocks: at most 31 codes and one scale more per pair), 20 KB.
constexpr int kQueryCodes = kPairFloats + kMaxPairs * kKvQuantBlock;
constexpr int kQueryScales = kPairFloats / kKvQuantBlock + kMaxPairs;

template <KvDtype kDt>
HWY_INLINE hn::Vec<DA> LoadKv(DA d, const uint8_t* row, int64_t i) {
  if constexpr (kDt == KvDtype::kF32) {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kDt == KvDtype::kF16) {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::float16_t, DA>(),
                                      reinterpret_cast<const hwy::float16_t*>(row) + i));
  } else {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DA>(),
                                      reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
  }
}

template <KvDtype kDt>
HWY_INLINE float Dot(const float* q, const uint8_t* krow, int hd) {
  const DA d;
  const int l = static_cast<int>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int i = 0;
  for (; i + l <= hd; i += l) acc = hn::MulAdd(hn::LoadU(d, q + i), LoadKv<kDt>(d, krow, i), acc);
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < hd; ++i) s += q[i] * LoadAs(kDt, krow + i * KvDtypeSize(kDt));
  return s;
}

// The dots of q with four K rows, each summed exactly as Dot sums it (the same
// bits), the four FMA chains interleaved so that their latencies overlap: one
// chain alone waits on every FMA.
template <KvDtype kDt>
HWY_INLINE void Dot4(const float* q, const uint8_t* const* krows, int hd, float* out) {
  const DA d;
  const int l = static_cast<int>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int i = 0;
  for (; i + l <= hd; i += l) {
    const auto qv = hn::LoadU(d, q + i);
    a0 = hn::MulAdd(qv, LoadKv<kDt>(d, krows[0], i), a0);
    a1 = hn::MulAdd(qv, LoadKv<kDt>(d, krows[1], i), a1);
    a2 = hn::MulAdd(qv, LoadKv<kDt>(d, krows[2], i), a2);
    a3 = hn::MulAdd(qv, LoadKv<kDt>(d, krows[3], i), a3);
  }
  float s[4] = {hn::GetLane(hn::SumOfLanes(d, a0)), hn::GetLane(hn::SumOfLanes(d, a1)),
                hn::GetLane(hn::SumOfLanes(d, a2)), hn::GetLane(hn::SumOfLanes(d, a3))};
  for (; i < hd; ++i) {
    for (int k = 0; k < 4; ++k) s[k] += q[i] * LoadAs(kDt, krows[k] + i * KvDtypeSize(kDt));
  }
  for (int k = 0; k < 4; ++k) out[k] = s[k];
}

// One chunk of online softmax for one head: turns the scores s[0, np) into
// exp(s - m_new) (padding the chunk to kChunk with zeros), adds them to *lsum
// and rescales the running output o[0, hd) when the running max *m grows.
HWY_INLINE void SoftmaxChunk(float* s, int np, int hd, float* m, float* lsum, float* o) {
  const DA d;
  const int l = static_cast<int>(hn::Lanes(d));
  const hn::CappedTag<float, kChunk> dc;
  const int lc = static_cast<int>(hn::Lanes(dc));
  float cmax = s[0];
  for (int j = 1; j < np; ++j) cmax = std::max(cmax, s[j]);
  for (int j = np; j < kChunk; ++j) s[j] = -INFINITY;
  const float m_new = std::max(*m, cmax);
  const float corr = std::exp(*m - m_new);  // 0 on the first chunk
  const auto vm = hn::Set(dc, m_new);
  auto vsum = hn::Zero(dc);
  for (int j = 0; j < kChunk; j += lc) {
    const auto p = hn::Exp(dc, hn::Sub(hn::Load(dc, s + j), vm));
    vsum = hn::Add(vsum, p);
    hn::Store(p, dc, s + j);
  }
  *lsum = *lsum * corr + hn::GetLane(hn::SumOfLanes(dc, vsum));
  if (corr != 1.0f) {
    const auto vc = hn::Set(d, corr);
    int i = 0;
    for (; i + l <= hd; i += l) hn::StoreU(hn::Mul(hn::LoadU(d, o + i), vc), d, o + i);
    for (; i < hd; ++i) o[i] *= corr;
  }
  *m = m_new;
}

// o[0, hd) += sum over j < np of p[j] * V row j. Four vectors of o at a time,
// so four FMA chains overlap instead of one waiting on each FMA's latency;
// every lane still sums over j in order, so the result is the same bits.
template <KvDtype kDt>
HWY_INLINE void AccumulateV(const float* p, const uint8_t* const* vrows, int np, int hd, float* o) {
  const DA d;
  const int l = static_cast<int>(hn::Lanes(d));
  int i = 0;
  for (; i + 4 * l <= hd; i += 4 * l) {
    auto a0 = hn::LoadU(d, o + i), a1 = hn::LoadU(d, o + i + l);
    auto a2 = hn::LoadU(d, o + i + 2 * l), a3 = hn::LoadU(d, o + i + 3 * l);
    for (int j = 0; j < np; ++j) {
      const auto pj = hn::Set(d, p[j]);
      a0 = hn::MulAdd(pj, LoadKv<kDt>(d, vrows[j], i), a0);
      a1 = hn::MulAdd(pj, LoadKv<kDt>(d, vrows[j], i + l), a1);
      a2 = hn::MulAdd(pj, LoadKv<kDt>(d, vrows[j], i + 2 * l), a2);
      a3 = hn::MulAdd(pj, LoadKv<kDt>(d, vrows[j], i + 3 * l), a3);
    }
    hn::StoreU(a0, d, o + i);
    hn::StoreU(a1, d, o + i + l);
    hn::StoreU(a2, d, o + i + 2 * l);
    hn::StoreU(a3, d, o + i + 3 * l);
  }
  for (; i + l <= hd; i += l) {
    auto acc = hn::LoadU(d, o + i);
    for (int j = 0; j < np; ++j)
      acc = hn::MulAdd(hn::Set(d, p[j]), LoadKv<kDt>(d, vrows[j], i), acc);
    hn::StoreU(acc, d, o + i);
  }
  for (; i < hd; ++i) {
    for (int j = 0; j < np; ++j) o[i] += p[j] * LoadAs(kDt, vrows[j] + i * KvDtypeSize(kDt));
  }
}

// Walks a head's K and V rows from position 0 in order: a block pointer and an
// offset advanced per position, instead of PagedKvLayer::KRow/VRow's division
// and modulo (two 64-bit divisions per position and head, which cost more than
// the head's dot product itself on this machine's cores).
class KvCursor {
 public:
  explicit KvCursor(const PagedKvLayer& kv) : kv_(kv) {}
  HWY_INLINE void Next(const uint8_t** krow, const uint8_t** vrow) {
    const uint8_t* base = kv_.blocks[block_] + static_cast<size_t>(off_) * kv_.row_bytes;
    *krow = base + kv_.k_offset;
    *vrow = base + kv_.v_offset;
    if (++off_ == kv_.block_tokens) {
      off_ = 0;
      ++block_;
    }
  }

 private:
  const PagedKvLayer& kv_;
  int64_t block_ = 0;
  int32_t off_ = 0;
};

// One (token, query head) of an attention call.
struct HeadPair {
  const float* q;  // the head's query
  float* out;      // its output
  size_t off;      // byte offset of its KV head in a row
  int64_t n_pos;   // positions it attends to (causal: start_pos + t + 1)
};

// Asks for one pair's slices [off, off + bytes) of `n` rows, a cache line at a
// time. AttendPairs asks kAhead pairs ahead of its arithmetic (K slices, then V
// slices, then the next chunk's K): a chunk's pairs read scattered 128-256 byte
// slices of 1.5-3 KB rows, a pattern the hardware prefetchers do not follow, so
// without this each slice waited on DRAM. BM_AttentionBatch, 16 sessions x 512
// positions, 2 threads: F16 KV 1.39 -> 0.80 ms, F32 1.56 -> 1.55 ms (already at
// ~0.8 of read bandwidth); 1 thread: F16 2.31 -> 1.14, F32 2.51 -> 2.15 ms.
// Three pairs ahead measured best of 1, 2, 3, 4 and 6.
// A q8_0 / q4_0 head's slice (68 or 36 bytes at head_dim 64) is not aligned
// to lines, so its last byte is asked for too.
constexpr int kAhead = 3;
template <KvDtype kDt>
HWY_INLINE void PrefetchSlices(const uint8_t* const* rows, int n, size_t off, size_t bytes) {
  for (int j = 0; j < n; ++j) {
    for (size_t b = 0; b < bytes; b += 64) hwy::Prefetch(rows[j] + off + b);
    if constexpr (IsQuantizedKv(kDt)) hwy::Prefetch(rows[j] + off + bytes - 1);
  }
}

// The query of one pair: floats, and for q8_0 / q4_0 keys its quantized codes
// and block scales (the attention scale folded in).
struct PairQuery {
  const float* q;
  const int16_t* codes;
  const float* scales;
};

// s[0, np) = scale * (q . K row j), the K rows' head at byte offset `off`.
template <KvDtype kDt>
HWY_INLINE void ChunkScores(const PairQuery& pq, const uint8_t* const* krows, size_t off, int np,
                            int hd, float scale, float* s) {
  const uint8_t* hk[kChunk];
  for (int j = 0; j < np; ++j) hk[j] = krows[j] + off;
  if constexpr (IsQuantizedKv(kDt)) {
    QuantScores<kDt>(pq.codes, pq.scales, hk, np, hd, s);
  } else {
    int j = 0;
    for (; j + 4 <= np; j += 4) {
      float r[4];
      Dot4<kDt>(pq.q, hk + j, hd, r);
      for (int k = 0; k < 4; ++k) s[j + k] = r[k] * scale;
    }
    for (; j < np; ++j) s[j] = Dot<kDt>(pq.q, hk[j], hd) * scale;
  }
}

// o += sum over j < np of p[j] * V row j's head at byte offset `off`.
template <KvDtype kDt>
HWY_INLINE void ChunkValues(const float* p, const uint8_t* const* vrows, size_t off, int np, int hd,
                            float* o) {
  const uint8_t* hv[kChunk];
  for (int j = 0; j < np; ++j) hv[j] = vrows[j] + off;
  if constexpr (IsQuantizedKv(kDt)) {
    QuantAccumulateV<kDt>(p, hv, np, hd, o);
  } else {
    AccumulateV<kDt>(p, hv, np, hd, o);
  }
}

// The pairs' queries: their floats and, for q8_0 / q4_0 keys, each quantized
// once into `codes` and `scales` (QuantizeQueryHead, the scale folded in).
// Returns the most positions a pair attends to.
template <KvDtype kDt>
HWY_INLINE int64_t PrepareQueries(const AttentionArgs& a, const HeadPair* pr, int n, int16_t* codes,
                                  float* scales, PairQuery* pq) {
  const int nb = KvBlocks(a.head_dim);
  int64_t max_pos = 0;
  for (int i = 0; i < n; ++i) {
    max_pos = std::max(max_pos, pr[i].n_pos);
    pq[i] = {pr[i].q, nullptr, nullptr};
    if constexpr (IsQuantizedKv(kDt)) {
      pq[i].codes = codes + i * nb * kKvQuantBlock;
      pq[i].scales = scales + i * nb;
      QuantizeQueryHead(pr[i].q, a.head_dim, a.scale, codes + i * nb * kKvQuantBlock,
                        scales + i * nb);
    }
  }
  return max_pos;
}

// Up to kMaxPairs (token, head) pairs, each against its own KV head, chunk by
// chunk over the positions: the pairs read adjacent slices of the same rows
// (rows are [n_kv_heads][head_dim]) one after another, so each row comes from
// memory about once per call, where one head's walk over all positions at a
// time fetched a 256-byte slice per 3 KB row and waited on DRAM for every
// head (1.5x slower on a 16-session batch, ops_bench BM_AttentionBatch); and
// the several tokens of a prompt chunk in one call share each row read (a
// prompt of 811 tokens spent 45% of its time here, rereading its whole
// context from L3 for every token). Each pair's arithmetic is the same as
// alone (chunks start at multiples of kChunk whatever the pair), and with
// q8_0 / q4_0 keys each pair's query is quantized once, here.
template <KvDtype kDt>
void AttendPairs(const AttentionArgs& a, const HeadPair* pr, int n) {
  const PagedKvLayer& kv = *a.kv;
  const int hd = a.head_dim;
  HWY_ALIGN float o_buf[kPairFloats];
  HWY_ALIGN float s[kMaxPairs][kChunk];
  float m[kMaxPairs], lsum[kMaxPairs];
  PairQuery pq[kMaxPairs];
  HWY_ALIGN int16_t q_codes[IsQuantizedKv(kDt) ? kQueryCodes : 1];
  float q_scales[IsQuantizedKv(kDt) ? kQueryScales : 1];
  for (int i = 0; i < n; ++i) {
    std::fill(o_buf + i * hd, o_buf + (i + 1) * hd, 0.0f);
    m[i] = -INFINITY;
    lsum[i] = 0.0f;
  }
  const int64_t max_pos = PrepareQueries<kDt>(a, pr, n, q_codes, q_scales, pq);
  KvCursor cur(kv);
  const uint8_t* rows[2][2][kChunk];  // [chunk parity][K, V][position in chunk]
  const int first = static_cast<int>(std::min<int64_t>(kChunk, max_pos));
  for (int j = 0; j < first; ++j) cur.Next(&rows[0][0][j], &rows[0][1][j]);
  const auto slice = static_cast<size_t>(KvHeadBytes(kDt, hd));
  for (int i = 0; i < std::min(kAhead, n); ++i) {
    PrefetchSlices<kDt>(rows[0][0], first, pr[i].off, slice);
  }
  for (int64_t p0 = 0, c = 0; p0 < max_pos; p0 += kChunk, c ^= 1) {
    const int np_all = static_cast<int>(std::min<int64_t>(kChunk, max_pos - p0));
    const uint8_t* const* krows = rows[c][0];
    const uint8_t* const* vrows = rows[c][1];
    const int n_next = static_cast<int>(std::clamp<int64_t>(max_pos - p0 - kChunk, 0, kChunk));
    for (int j = 0; j < n_next; ++j) cur.Next(&rows[c ^ 1][0][j], &rows[c ^ 1][1][j]);
    int np[kMaxPairs];  // each pair's positions in this chunk (causal)
    for (int i = 0; i < n; ++i) {
      np[i] = static_cast<int>(std::clamp<int64_t>(pr[i].n_pos - p0, 0, np_all));
    }
    for (int i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        PrefetchSlices<kDt>(krows, np[i + kAhead], pr[i + kAhead].off, slice);
      } else if (i + kAhead - n < n) {
        PrefetchSlices<kDt>(vrows, np[i + kAhead - n], pr[i + kAhead - n].off, slice);
      }
      ChunkScores<kDt>(pq[i], krows, pr[i].off, np[i], hd, a.scale, s[i]);
    }
    for (int i = 0; i < n; ++i) {
      if (np[i] > 0) SoftmaxChunk(s[i], np[i], hd, &m[i], &lsum[i], o_buf + i * hd);
    }
    for (int i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        PrefetchSlices<kDt>(vrows, np[i + kAhead], pr[i + kAhead].off, slice);
      } else if (i + kAhead - n < n) {
        PrefetchSlices<kDt>(rows[c ^ 1][0], n_next, pr[i + kAhead - n].off, slice);
      }
      if (np[i] > 0) ChunkValues<kDt>(s[i], vrows, pr[i].off, np[i], hd, o_buf + i * hd);
    }
  }
  for (int i = 0; i < n; ++i) {
    const float inv = 1.0f / lsum[i];
    for (int k = 0; k < hd; ++k) pr[i].out[k] = o_buf[i * hd + k] * inv;
  }
}

void AttendPairsAs(const AttentionArgs& a, const HeadPair* pr, int n) {
  switch (a.kv->dtype) {
    case KvDtype::kF32:
      return AttendPairs<KvDtype::kF32>(a, pr, n);
    case KvDtype::kF16:
      return AttendPairs<KvDtype::kF16>(a, pr, n);
    case KvDtype::kBF16:
      return AttendPairs<KvDtype::kBF16>(a, pr, n);
    case KvDtype::kQ8_0:
      return AttendPairs<KvDtype::kQ8_0>(a, pr, n);
    case KvDtype::kQ4_0:
      return AttendPairs<KvDtype::kQ4_0>(a, pr, n);
  }
}

// Work items [begin, end) of (token, KV head), item = t * n_kv_heads + g:
// their query heads as pairs, as many per call as the scratch holds
// (kPairFloats / head_dim, at most kMaxPairs: five 12-head tokens at
// head_dim 64), so that consecutive tokens of a prompt share the calls.
void AttentionItemsImpl(const AttentionArgs& a, int64_t begin, int64_t end) {
  const int n_kv = a.kv->n_kv_heads;
  const int group = a.n_heads / n_kv;
  const int hd = a.head_dim;
  const int cap = std::min(kMaxPairs, kPairFloats / hd);
  const int64_t q_stride = static_cast<int64_t>(a.n_heads) * hd;
  HeadPair pairs[kMaxPairs];
  int n = 0;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / n_kv;
    const int g = static_cast<int>(item - t * n_kv);
    for (int h = g * group; h < (g + 1) * group; ++h) {
      pairs[n++] = {a.q + t * q_stride + static_cast<int64_t>(h) * hd,
                    a.out + t * q_stride + static_cast<int64_t>(h) * hd,
                    static_cast<size_t>(g * KvHeadBytes(a.kv->dtype, hd)), a.start_pos + t + 1};
      if (n == cap) {
        AttendPairsAs(a, pairs, n);
        n = 0;
      }
    }
  }
  if (n > 0) AttendPairsAs(a, pairs, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace meshnet::ops::internal {

HWY_EXPORT(AttentionItemsImpl);

void AttentionItems(const AttentionArgs& a, int64_t begin, int64_t end) {
  HWY_DYNAMIC_DISPATCH(AttentionItemsImpl)(a, begin, end);
}

}  // namespace meshnet::ops::internal
#endif  // HWY_ONCE
