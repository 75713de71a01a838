// Fused attention over q8_0 / q4_0 KV (ops/nn.h Attention, kernels in
// attention_kernels.cc + attention_quant-inl.h): every SIMD target against
// the scalar reference, extreme codes, the error against an f32 cache, and
// batch and thread invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "ops/hwy_test_util.h"
#include "ops/kv_quant.h"
#include "ops/nn.h"
#include "ops/nn_test_util.h"
#include "util/dtype.h"
#include "util/error.h"

#if defined(__SANITIZE_THREAD__)
#define MESHNET_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MESHNET_TSAN_BUILD 1
#endif
#endif

// Counts allocations made by the current thread (the kernels must make none).
namespace {
thread_local int64_t t_allocations = 0;
}  // namespace

#ifdef MESHNET_TSAN_BUILD
// clang links its TSan runtime whole (with its own operator new), so a
// replacement would not link: count through the sanitizer's malloc hooks.
#include <sanitizer/allocator_interface.h>
namespace {
void OnMalloc(const volatile void*, size_t) { ++t_allocations; }
void OnFree(const volatile void*) {}
[[maybe_unused]] const int kHooksInstalled =
    __sanitizer_install_malloc_and_free_hooks(OnMalloc, OnFree);
}  // namespace
#else
void* operator new(std::size_t size) {
  ++t_allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace meshnet::ops {
namespace {

struct QCase {
  int n_heads, n_kv_heads, head_dim, block_tokens;
  int64_t start_pos, n_tokens;
  KvDtype dtype;
};

// K ~ N(0, 1.5^2), V ~ N(0, 1) rows stored through StoreKvRow.
void FillRandom(PagedKv* kv, int64_t n_pos, uint32_t seed) {
  const int64_t kv_dim = static_cast<int64_t>(kv->layer.n_kv_heads) * kv->layer.head_dim;
  const auto keys = Random(n_pos * kv_dim, seed, 1.5f);
  const auto values = Random(n_pos * kv_dim, seed + 1);
  for (int64_t p = 0; p < n_pos; ++p) {
    StoreKvRow(kv->layer, true, p, keys.data() + p * kv_dim);
    StoreKvRow(kv->layer, false, p, values.data() + p * kv_dim);
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs_tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], abs_tol + rel * std::fabs(want[i])) << "at " << i;
  }
}

// Kernel vs reference for one case, on the calling thread and on a pool
// (which must give the same bits: a head's result never depends on the split).
void CheckCase(const QCase& c, PagedKv* kv, ThreadPool* pool) {
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const auto q = Random(c.n_tokens * q_dim, 14, 1.5f);
  std::vector<float> got(static_cast<size_t>(c.n_tokens * q_dim)), pooled(got.size()),
      want(got.size());
  const AttentionConfig cfg{c.n_heads, c.head_dim, 0.0f};
  Attention(q.data(), c.n_tokens, c.start_pos, kv->layer, cfg, got.data(), nullptr);
  Attention(q.data(), c.n_tokens, c.start_pos, kv->layer, cfg, pooled.data(), pool);
  AttentionReference(q.data(), c.n_tokens, c.start_pos, kv->layer, cfg, want.data());
  EXPECT_EQ(got, pooled);
  ExpectClose(got, want, 1e-4, 2e-5);
}

std::vector<QCase> Cases() {
  std::vector<QCase> cases;
  for (KvDtype dt : {KvDtype::kQ8_0, KvDtype::kQ4_0}) {
    for (const QCase& c : {
             QCase{8, 2, 64, 16, 37, 1, dt},   // GQA decode, two full blocks per head
             QCase{8, 2, 64, 16, 0, 20, dt},   // a prompt across paged blocks
             QCase{4, 4, 8, 3, 10, 3, dt},     // head_dim 8: one short block per head
             QCase{4, 2, 40, 5, 21, 2, dt},    // a full block and a short one of 8
             QCase{6, 1, 72, 4, 17, 4, dt},    // MQA, two full blocks and 8
             QCase{4, 4, 7, 2, 5, 2, dt},      // an odd head_dim
             QCase{2, 2, 128, 16, 70, 2, dt},  // four blocks, ragged paged tail
             QCase{20, 20, 32, 4, 6, 3, dt},   // more heads than one kernel call takes
             QCase{12, 12, 64, 16, 300, 1, dt}, QCase{4, 4, 64, 1, 9, 1, dt},  // block_tokens 1
         }) {
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(QuantAttention, MatchesReferenceOnEveryTarget) {
  ThreadPool pool(2);
  ForEachSimdTarget([&] {
    for (const QCase& c : Cases()) {
      SCOPED_TRACE(::testing::Message()
                   << KvDtypeName(c.dtype) << " heads " << c.n_heads << "/" << c.n_kv_heads
                   << " hd " << c.head_dim << " bt " << c.block_tokens << " start " << c.start_pos
                   << " n " << c.n_tokens);
      const int64_t n_pos = c.start_pos + c.n_tokens;
      PagedKv kv(n_pos, c.block_tokens, 2, 1, c.n_kv_heads, c.head_dim, c.dtype);
      FillRandom(&kv, n_pos, 12);
      CheckCase(c, &kv, &pool);
    }
  });
}

// Codes the quantizer never writes but an imported block may hold: q8_0
// codes over all of [-128, 127] (a third of them -128) and q4_0 bytes over
// every nibble, with random f16 scales of both signs.
TEST(QuantAttention, ExtremeCodesIncludingMinus128) {
  ThreadPool pool(2);
  ForEachSimdTarget([&] {
    for (KvDtype dt : {KvDtype::kQ8_0, KvDtype::kQ4_0}) {
      for (int hd : {64, 40}) {
        const QCase c{4, 2, hd, 4, 23, 2, dt};
        const int64_t n_pos = c.start_pos + c.n_tokens;
        PagedKv kv(n_pos, c.block_tokens, 1, 0, c.n_kv_heads, hd, dt);
        std::mt19937 rng(77);
        std::uniform_int_distribution<int> byte(0, 255);
        std::uniform_real_distribution<float> scale(0.002f, 0.02f);
        const int64_t head_bytes = KvHeadBytes(dt, hd);
        for (int64_t p = 0; p < n_pos; ++p) {
          for (uint8_t* row : {kv.layer.KRow(p), kv.layer.VRow(p)}) {
            for (int64_t i = 0; i < static_cast<int64_t>(kv.layer.row_bytes); ++i) {
              row[i] = dt == KvDtype::kQ8_0 && byte(rng) < 85 ? 0x80 : byte(rng);
            }
            for (int h = 0; h < c.n_kv_heads; ++h) {  // sane scales
              for (int b = 0; b < KvBlocks(hd); ++b) {
                const uint16_t d = FloatToHalf(byte(rng) < 128 ? -scale(rng) : scale(rng));
                std::memcpy(row + h * head_bytes + b * (dt == KvDtype::kQ8_0 ? 34 : 18), &d, 2);
              }
            }
          }
        }
        SCOPED_TRACE(::testing::Message() << KvDtypeName(dt) << " hd " << hd);
        CheckCase(c, &kv, &pool);
      }
    }
  });
}

// The error a quantized cache adds, against the exact attention over the same
// K/V in an f32 cache (random data as above, 2 prompt tokens and decode after
// 200 positions; head_dim 64 and 8): q8_0 within 0.01 of values of scale 1
// (rms 0.002; measured 0.0043 and 0.0008), q4_0 within 0.1 (rms 0.03;
// measured 0.053 and 0.015).
TEST(QuantAttention, CloseToTheF32Cache) {
  for (KvDtype dt : {KvDtype::kQ8_0, KvDtype::kQ4_0}) {
    for (const QCase& c : {QCase{8, 2, 64, 16, 200, 2, dt}, QCase{4, 4, 8, 3, 60, 1, dt}}) {
      const int64_t n_pos = c.start_pos + c.n_tokens;
      PagedKv quant(n_pos, c.block_tokens, 1, 0, c.n_kv_heads, c.head_dim, dt);
      PagedKv exact(n_pos, c.block_tokens, 1, 0, c.n_kv_heads, c.head_dim, KvDtype::kF32);
      FillRandom(&quant, n_pos, 31);
      FillRandom(&exact, n_pos, 31);
      const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
      const auto q = Random(c.n_tokens * q_dim, 32, 0.5f);
      std::vector<float> got(static_cast<size_t>(c.n_tokens * q_dim)), want(got.size());
      const AttentionConfig cfg{c.n_heads, c.head_dim, 0.0f};
      Attention(q.data(), c.n_tokens, c.start_pos, quant.layer, cfg, got.data(), nullptr);
      AttentionReference(q.data(), c.n_tokens, c.start_pos, exact.layer, cfg, want.data());
      double max_err = 0, sq = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_err = std::max(max_err, static_cast<double>(std::fabs(got[i] - want[i])));
        sq += static_cast<double>(got[i] - want[i]) * (got[i] - want[i]);
      }
      const double rms = std::sqrt(sq / static_cast<double>(got.size()));
      SCOPED_TRACE(::testing::Message() << KvDtypeName(dt) << " hd " << c.head_dim << " max "
                                        << max_err << " rms " << rms);
      EXPECT_LT(max_err, dt == KvDtype::kQ8_0 ? 0.01 : 0.1);
      EXPECT_LT(rms, dt == KvDtype::kQ8_0 ? 0.002 : 0.03);
      EXPECT_GT(rms, 0.0);  // the cache really is quantized
    }
  }
}

// One batch of sessions with q8_0, q4_0, f16 and f32 caches of different
// lengths and pagings gives each session exactly what it gets alone, on the
// calling thread or a pool: no session's attention depends on another's rows.
TEST(QuantAttention, BatchOfMixedDtypesEqualsEachAlone) {
  ThreadPool pool(2);
  const int n_heads = 8, n_kv = 2, hd = 64;
  const int64_t q_dim = n_heads * hd;
  struct Seq {
    int64_t start, n;
    int block_tokens;
    KvDtype dtype;
  };
  const std::vector<Seq> shapes = {{0, 5, 4, KvDtype::kQ8_0}, {40, 1, 16, KvDtype::kF16},
                                   {3, 1, 1, KvDtype::kQ4_0}, {30, 7, 8, KvDtype::kQ8_0},
                                   {17, 1, 2, KvDtype::kF32}, {65, 1, 16, KvDtype::kQ8_0}};
  const AttentionConfig cfg{n_heads, hd, 0.0f};
  std::vector<std::unique_ptr<PagedKv>> kvs;
  std::vector<std::vector<float>> qs, want;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Seq& sh = shapes[i];
    kvs.push_back(
        std::make_unique<PagedKv>(sh.start + sh.n, sh.block_tokens, 1, 0, n_kv, hd, sh.dtype));
    FillRandom(kvs[i].get(), sh.start + sh.n, 20 + 2 * static_cast<uint32_t>(i));
    qs.push_back(Random(sh.n * q_dim, 60 + static_cast<uint32_t>(i), 1.5f));
    want.emplace_back(static_cast<size_t>(sh.n * q_dim));
    Attention(qs[i].data(), sh.n, sh.start, kvs[i]->layer, cfg, want[i].data(), nullptr);
  }
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<std::vector<float>> got;
    std::vector<AttentionSeq> seqs;
    for (size_t i = 0; i < shapes.size(); ++i) got.emplace_back(want[i].size(), -1.0f);
    for (size_t i = 0; i < shapes.size(); ++i) {
      seqs.push_back({qs[i].data(), shapes[i].n, shapes[i].start, &kvs[i]->layer, got[i].data()});
    }
    AttentionBatch(seqs.data(), static_cast<int64_t>(seqs.size()), cfg, p);
    for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(got[i], want[i]) << "sequence " << i;
  }
}

// A decode step's kernels over a quantized cache allocate nothing: the row
// store (the quantizer) and the fused attention, alone and batched, on the
// calling thread (the query codes and scales live on the kernel's stack).
TEST(QuantAttention, StoreAndAttentionAllocateNothing) {
  for (KvDtype dt : {KvDtype::kQ8_0, KvDtype::kQ4_0}) {
    const int n_heads = 8, n_kv = 2, hd = 72;
    PagedKv kv(40, 16, 1, 0, n_kv, hd, dt);
    FillRandom(&kv, 39, 5);
    const auto row = Random(n_kv * hd, 6);
    const auto q = Random(n_heads * hd, 7);
    std::vector<float> out(q.size());
    const AttentionConfig cfg{n_heads, hd, 0.0f};
    AttentionSeq seq{q.data(), 1, 39, &kv.layer, out.data()};
    const int64_t before = t_allocations;
    StoreKvRow(kv.layer, true, 39, row.data());
    StoreKvRow(kv.layer, false, 39, row.data());
    Attention(q.data(), 1, 39, kv.layer, cfg, out.data(), nullptr);
    AttentionBatch(&seq, 1, cfg, nullptr);
    EXPECT_EQ(t_allocations, before) << KvDtypeName(dt);
  }
}

// llama.cpp parity arithmetic exists for f16 caches only; a q8_0 cache is
// refused, not silently computed another way.
TEST(QuantAttention, GgmlParityRefusesAQuantizedCache) {
  PagedKv kv(1, 1, 1, 0, 1, 32, KvDtype::kQ8_0);
  std::vector<float> q(32, 1.0f), out(32);
  AttentionConfig cfg{1, 32, 0.0f};
  cfg.ggml_f16 = true;
  EXPECT_THROW(Attention(q.data(), 1, 0, kv.layer, cfg, out.data(), nullptr), Error);
}

}  // namespace
}  // namespace meshnet::ops
