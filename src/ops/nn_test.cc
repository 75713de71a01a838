#include "ops/nn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "ops/hwy_test_util.h"
#include "ops/nn_kernels.h"
#include "ops/nn_test_util.h"
#include "ops/quantize.h"
#include "util/error.h"

namespace meshnet::ops {
namespace {

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs_tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], abs_tol + rel * std::fabs(want[i])) << what << " at " << i;
  }
}

TEST(RmsNorm, MatchesReferenceIncludingInPlace) {
  ForEachSimdTarget([] {
    for (int64_t dim : {1, 7, 64, 100, 4096}) {
      for (int64_t rows : {1, 3}) {
        const auto x = Random(rows * dim, 1, 3.0f);
        const auto w = Random(dim, 2);
        std::vector<float> got(x.size()), want(x.size());
        RmsNorm(x.data(), w.data(), rows, dim, 1e-5f, got.data());
        RmsNormReference(x.data(), w.data(), rows, dim, 1e-5f, want.data());
        ExpectClose(got, want, 1e-5, 1e-7, "rmsnorm");
        std::vector<float> inplace = x;
        RmsNorm(inplace.data(), w.data(), rows, dim, 1e-5f, inplace.data());
        ExpectClose(inplace, want, 1e-5, 1e-7, "rmsnorm in place");
      }
    }
  });
}

TEST(RmsNorm, UnitWeightsGiveUnitRms) {
  std::vector<float> x = {3.0f, -4.0f, 0.0f, 5.0f};  // mean square 12.5
  std::vector<float> w(4, 1.0f), y(4);
  RmsNorm(x.data(), w.data(), 1, 4, 0.0f, y.data());
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], -4.0 / std::sqrt(12.5), 1e-6);
}

// RoPE of x (n_tokens, n_heads, head_dim) from position start, as the shard
// runs it: the angles of the run, then the rotation.
void RopeRun(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
             int64_t start) {
  std::vector<float> cs(static_cast<size_t>(n_tokens * (cfg.rope_dims / 2))), sn(cs.size());
  RopeAngles(cfg, start, n_tokens, cs.data(), sn.data());
  RopeRotate(x, n_tokens, n_heads, head_dim, cfg, cs.data(), sn.data());
}

TEST(Rope, HandComputedRotation) {
  // Position 1, head_dim 4, rope_dims 4, base 100: pair 0 turns by 1 rad, pair 1 by 0.1 rad.
  std::vector<float> x = {1.0f, 0.0f, 0.0f, 2.0f};
  RopeRun(x.data(), 1, 1, 4, RopeConfig{4, 100.0f, 1.0f}, 1);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], -2.0 * std::sin(0.1), 1e-6);
  EXPECT_NEAR(x[3], 2.0 * std::cos(0.1), 1e-6);
}

TEST(Rope, MatchesReferencePartialDimsAndLargePositions) {
  struct Case {
    int n_heads, head_dim, rope_dims;
    float base, scale;
    int64_t start;
  };
  for (const Case& c :
       {Case{2, 8, 8, 10000.f, 1.f, 0}, Case{3, 64, 32, 10000.f, 1.f, 5},
        Case{4, 128, 128, 500000.f, 1.f, 3000}, Case{1, 16, 16, 10000.f, 0.25f, 7}}) {
    const int64_t n_tokens = 3;
    const auto x = Random(n_tokens * c.n_heads * c.head_dim, 4);
    std::vector<float> got = x, want = x;
    const RopeConfig cfg{c.rope_dims, c.base, c.scale};
    RopeRun(got.data(), n_tokens, c.n_heads, c.head_dim, cfg, c.start);
    RopeReference(want.data(), n_tokens, c.n_heads, c.head_dim, cfg, c.start);
    ExpectClose(got, want, 1e-5, 1e-6, "rope");
    for (int64_t k = 0; k < static_cast<int64_t>(x.size()); ++k) {
      if (k % c.head_dim >= c.rope_dims) {
        ASSERT_EQ(got[k], x[k]) << "non-rotated dim changed";
      }
    }
  }
}

TEST(Rope, NeoxRotatesHalvesAndFactorsDivideAngles) {
  // NeoX, head_dim 4, base 100, position 1: pair 0 = (x[0], x[2]) turns by
  // 1 rad, pair 1 = (x[1], x[3]) by 0.1 rad; factor 2 on pair 0 halves its angle.
  const float factors[2] = {2.0f, 1.0f};
  std::vector<float> x = {1.0f, 0.0f, 0.0f, 2.0f};
  RopeConfig cfg{4, 100.0f, 1.0f, /*neox=*/true, factors};
  RopeRun(x.data(), 1, 1, 4, cfg, 1);
  EXPECT_NEAR(x[0], std::cos(0.5), 1e-6);
  EXPECT_NEAR(x[2], std::sin(0.5), 1e-6);
  EXPECT_NEAR(x[1], -2.0 * std::sin(0.1), 1e-6);
  EXPECT_NEAR(x[3], 2.0 * std::cos(0.1), 1e-6);
}

TEST(Rope, NeoxAndFactorsMatchReference) {
  std::vector<float> factors(64);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.25f * static_cast<float>(i % 9);
  for (bool neox : {false, true}) {
    for (const float* ff :
         {static_cast<const float*>(nullptr), static_cast<const float*>(factors.data())}) {
      for (int rope_dims : {16, 32}) {
        const int n_heads = 3, head_dim = 32;
        const int64_t n_tokens = 4, start = 1000;
        const auto x = Random(n_tokens * n_heads * head_dim, 11);
        std::vector<float> got = x, want = x;
        const RopeConfig cfg{rope_dims, 500000.f, 1.f, neox, ff};
        RopeRun(got.data(), n_tokens, n_heads, head_dim, cfg, start);
        RopeReference(want.data(), n_tokens, n_heads, head_dim, cfg, start);
        ExpectClose(got, want, 1e-5, 1e-6, "rope");
        for (int64_t k = 0; k < static_cast<int64_t>(x.size()); ++k) {
          if (k % head_dim >= rope_dims) ASSERT_EQ(got[k], x[k]) << "non-rotated dim changed";
        }
      }
    }
  }
}

// A table of angles made once for a run of positions rotates every token
// exactly as that token alone at its position (the shard's batches and long
// prompts rely on the same bits).
TEST(Rope, AnglesOfARunEqualEachTokenAloneBitForBit) {
  std::vector<float> factors(64);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i % 5);
  for (bool neox : {false, true}) {
    for (const float* ff :
         {static_cast<const float*>(nullptr), static_cast<const float*>(factors.data())}) {
      const int n_heads = 3, head_dim = 64, rope_dims = 48;
      const int64_t n_tokens = 5, start = 777;
      const RopeConfig cfg{rope_dims, 10000.f, 0.5f, neox, ff};
      const auto x = Random(n_tokens * n_heads * head_dim, 12);
      std::vector<float> want = x, got = x;
      for (int64_t t = 0; t < n_tokens; ++t) {
        RopeRun(want.data() + t * n_heads * head_dim, 1, n_heads, head_dim, cfg, start + t);
      }
      std::vector<float> cs(n_tokens * rope_dims / 2), sn(cs.size());
      RopeAngles(cfg, start, n_tokens, cs.data(), sn.data());
      RopeRotate(got.data(), n_tokens, n_heads, head_dim, cfg, cs.data(), sn.data());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
      // Each token has its own angles: rotating by the first token's angles only differs.
      std::vector<float> wrong = x;
      for (int64_t t = 0; t < n_tokens; ++t) {
        RopeRotate(wrong.data() + t * n_heads * head_dim, 1, n_heads, head_dim, cfg, cs.data(),
                   sn.data());
      }
      ASSERT_NE(0, std::memcmp(wrong.data(), want.data(), got.size() * sizeof(float)));
    }
  }
}

TEST(Softmax, MatchesReferenceAndIsStable) {
  ForEachSimdTarget([] {
    for (int64_t n : {1, 7, 16, 100, 1000}) {
      auto x = Random(n, 5, 4.0f);
      x[0] += 1000.0f;  // would overflow exp without the max shift
      std::vector<float> got = x, want = x;
      Softmax(got.data(), n);
      SoftmaxReference(want.data(), n);
      ExpectClose(got, want, 1e-5, 1e-7, "softmax");
      EXPECT_NEAR(std::accumulate(got.begin(), got.end(), 0.0), 1.0, 1e-5);
    }
  });
}

TEST(SwiGlu, MatchesReferenceOverAWideRange) {
  ForEachSimdTarget([] {
    for (int64_t n : {1, 9, 64, 1000}) {
      auto gate = Random(n, 6, 5.0f);
      const auto up = Random(n, 7);
      gate[0] = -200.0f;
      if (n > 1) gate[1] = 150.0f;
      std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      SwiGlu(gate.data(), up.data(), n, got.data());
      SwiGluReference(gate.data(), up.data(), n, want.data());
      ExpectClose(got, want, 1e-5, 1e-7, "swiglu");
    }
  });
}

TEST(AddAndSum, MatchScalarLoops) {
  ForEachSimdTarget([] {
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      const auto a = Random(n, 8), b = Random(n, 9);
      std::vector<float> out(static_cast<size_t>(n));
      Add(a.data(), b.data(), n, out.data());
      double want_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], a[i] + b[i]);
        want_sum += a[i];
      }
      EXPECT_NEAR(Sum(a.data(), n), want_sum, 1e-4 * (1 + n));
    }
  });
}

TEST(EmbeddingLookup, DequantizesRowsAndRejectsBadIds) {
  const int64_t rows = 5, cols = 64;
  const auto table_f = Random(rows * cols, 10);
  const int64_t rb = RowBytes(GgmlType::kQ8_0, cols);
  std::vector<uint8_t> table(static_cast<size_t>(rows * rb));
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(GgmlType::kQ8_0, table_f.data() + r * cols, cols, table.data() + r * rb);
  }
  const WeightMatrix w{GgmlType::kQ8_0, table.data(), rows, cols};
  const int32_t tokens[] = {4, 0, 4};
  std::vector<float> out(3 * cols), want(cols);
  EmbeddingLookup(w, tokens, 3, out.data());
  for (int t = 0; t < 3; ++t) {
    DequantizeRow(GgmlType::kQ8_0, table.data() + tokens[t] * rb, cols, want.data());
    for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(out[t * cols + i], want[i]);
  }
  const int32_t bad[] = {1, 5};
  EXPECT_THROW(EmbeddingLookup(w, bad, 2, out.data()), Error);
  const int32_t negative[] = {-1};
  EXPECT_THROW(EmbeddingLookup(w, negative, 1, out.data()), Error);
}

TEST(StoreKvRow, ConvertsLikeScalarStoreAs) {
  ForEachSimdTarget([] {
    for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
      PagedKv kv(6, 4, 2, 1, 3, 12, dt);
      auto row = Random(37, 11, 10.0f);  // K uses [0, 36), V uses [1, 37)
      row[0] = 1e-6f;                    // f16 subnormal
      row[1] = 70000.0f;                 // f16 overflow
      row[2] = 1.00048828125f;           // f16 tie (1 + 2^-11): rounds to even
      row[3] = -0.0f;
      for (int64_t pos : {0, 3, 5}) {
        StoreKvRow(kv.layer, true, pos, row.data());
        StoreKvRow(kv.layer, false, pos, row.data() + 1);  // shifted: a different V row
        for (int i = 0; i < 36; ++i) {
          uint8_t want[4];
          StoreAs(dt, want, row[i]);
          ASSERT_EQ(std::memcmp(kv.layer.KRow(pos) + i * KvDtypeSize(dt), want, KvDtypeSize(dt)), 0)
              << KvDtypeName(dt) << " k elem " << i;
          StoreAs(dt, want, row[i + 1]);
          ASSERT_EQ(std::memcmp(kv.layer.VRow(pos) + i * KvDtypeSize(dt), want, KvDtypeSize(dt)), 0)
              << KvDtypeName(dt) << " v elem " << i;
        }
      }
      // Layer 0's planes were not touched.
      PagedKvLayer l0 = kv.layer;
      l0.k_offset = 0;
      l0.v_offset = static_cast<size_t>(4) * l0.row_bytes;
      EXPECT_EQ(l0.KRow(3)[0], 0xCD);
      EXPECT_EQ(l0.VRow(5)[7], 0xCD);
    }
  });
}

struct AttnCase {
  int n_heads, n_kv_heads, head_dim, block_tokens;
  int64_t start_pos, n_tokens;
  KvDtype dtype;
};

void CheckAttention(const AttnCase& c, ThreadPool* pool) {
  const int64_t n_pos = c.start_pos + c.n_tokens;
  PagedKv kv(n_pos, c.block_tokens, 2, 1, c.n_kv_heads, c.head_dim, c.dtype);
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  const auto keys = Random(n_pos * kv_dim, 12, 1.5f);
  const auto values = Random(n_pos * kv_dim, 13);
  for (int64_t p = 0; p < n_pos; ++p) {
    StoreKvRow(kv.layer, true, p, keys.data() + p * kv_dim);
    StoreKvRow(kv.layer, false, p, values.data() + p * kv_dim);
  }
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const auto q = Random(c.n_tokens * q_dim, 14, 1.5f);
  std::vector<float> got(static_cast<size_t>(c.n_tokens * q_dim)), want(got.size());
  const AttentionConfig cfg{c.n_heads, c.head_dim, 0.0f};
  Attention(q.data(), c.n_tokens, c.start_pos, kv.layer, cfg, got.data(), pool);
  AttentionReference(q.data(), c.n_tokens, c.start_pos, kv.layer, cfg, want.data());
  ExpectClose(got, want, 1e-4, 2e-5, "attention");
}

TEST(Attention, MatchesReferenceOverPagedLayouts) {
  ThreadPool pool(2);
  ForEachSimdTarget([&] {
    for (const AttnCase& c : {
             AttnCase{4, 4, 8, 1, 0, 1, KvDtype::kF32},     // first token
             AttnCase{4, 4, 8, 1, 5, 3, KvDtype::kF32},     // block_tokens 1
             AttnCase{8, 2, 64, 16, 37, 1, KvDtype::kF16},  // GQA decode
             AttnCase{8, 2, 64, 16, 0, 20, KvDtype::kF16},  // prefill across blocks
             AttnCase{6, 1, 12, 3, 17, 4, KvDtype::kBF16},  // MQA, odd head_dim tail
             AttnCase{16, 1, 16, 5, 9, 2, KvDtype::kF32},   // group > 8 query heads
             AttnCase{2, 2, 128, 16, 70, 2, KvDtype::kBF16},
             // more heads than one kernel call takes (16), the pool's split
             // falling inside a token's heads; a call's heads spanning KV heads
             AttnCase{20, 20, 8, 4, 6, 3, KvDtype::kF32},
             AttnCase{24, 4, 16, 16, 3, 3, KvDtype::kF16},
             // head_dims that are not a multiple of the V loop's unrolled
             // four vectors of 8 (48: one pass and two single vectors; 24: three)
             AttnCase{4, 2, 48, 16, 21, 2, KvDtype::kF16},
             AttnCase{4, 4, 24, 8, 9, 1, KvDtype::kF16},
         }) {
      SCOPED_TRACE(::testing::Message()
                   << "heads " << c.n_heads << "/" << c.n_kv_heads << " hd " << c.head_dim << " bt "
                   << c.block_tokens << " start " << c.start_pos << " n " << c.n_tokens);
      CheckAttention(c, nullptr);
      CheckAttention(c, &pool);
    }
  });
}

// AttentionBatch over sequences of different lengths, starts and KV layouts
// gives exactly what one Attention call per sequence gives.
TEST(Attention, BatchEqualsOneCallPerSequence) {
  ThreadPool pool(2);
  const int n_heads = 8, n_kv = 2, hd = 16;
  const int64_t q_dim = n_heads * hd, kv_dim = n_kv * hd;
  struct Seq {
    int64_t start, n;
    int block_tokens;
  };
  const std::vector<Seq> shapes = {{0, 5, 4}, {9, 1, 16}, {3, 1, 1}, {30, 7, 8}, {0, 1, 2}};
  std::vector<std::unique_ptr<PagedKv>> kvs;
  std::vector<std::vector<float>> qs, want;
  std::vector<AttentionSeq> seqs;
  const AttentionConfig cfg{n_heads, hd, 0.0f};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Seq& sh = shapes[i];
    const int64_t n_pos = sh.start + sh.n;
    kvs.push_back(std::make_unique<PagedKv>(n_pos, sh.block_tokens, 1, 0, n_kv, hd, KvDtype::kF16));
    const auto keys = Random(n_pos * kv_dim, 20 + static_cast<int>(i), 1.5f);
    const auto values = Random(n_pos * kv_dim, 40 + static_cast<int>(i));
    for (int64_t p = 0; p < n_pos; ++p) {
      StoreKvRow(kvs[i]->layer, true, p, keys.data() + p * kv_dim);
      StoreKvRow(kvs[i]->layer, false, p, values.data() + p * kv_dim);
    }
    qs.push_back(Random(sh.n * q_dim, 60 + static_cast<int>(i), 1.5f));
    want.emplace_back(static_cast<size_t>(sh.n * q_dim));
    Attention(qs[i].data(), sh.n, sh.start, kvs[i]->layer, cfg, want[i].data(), nullptr);
  }
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<std::vector<float>> got;
    seqs.clear();
    for (size_t i = 0; i < shapes.size(); ++i) {
      got.emplace_back(want[i].size(), -1.0f);
      seqs.push_back({qs[i].data(), shapes[i].n, shapes[i].start, &kvs[i]->layer, nullptr});
    }
    for (size_t i = 0; i < shapes.size(); ++i) seqs[i].out = got[i].data();
    AttentionBatch(seqs.data(), static_cast<int64_t>(seqs.size()), cfg, p);
    for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(got[i], want[i]) << "sequence " << i;
  }
}

TEST(Attention, SinglePositionReturnsItsValueAndEqualKeysAverage) {
  const int hd = 8;
  PagedKv kv(3, 2, 1, 0, 1, hd, KvDtype::kF32);
  std::vector<float> k(hd, 0.5f), v0(hd), v1(hd), v2(hd);
  for (int i = 0; i < hd; ++i) {
    v0[i] = static_cast<float>(i);
    v1[i] = 10.0f;
    v2[i] = -static_cast<float>(i);
  }
  for (int64_t p = 0; p < 3; ++p) StoreKvRow(kv.layer, true, p, k.data());
  StoreKvRow(kv.layer, false, 0, v0.data());
  StoreKvRow(kv.layer, false, 1, v1.data());
  StoreKvRow(kv.layer, false, 2, v2.data());
  const auto q = Random(3 * hd, 15);
  std::vector<float> out(3 * hd);
  Attention(q.data(), 3, 0, kv.layer, AttentionConfig{1, hd, 0.0f}, out.data(), nullptr);
  for (int i = 0; i < hd; ++i) {
    EXPECT_NEAR(out[i], v0[i], 1e-6);                     // token 0 sees only position 0
    EXPECT_NEAR(out[hd + i], (v0[i] + v1[i]) / 2, 1e-5);  // equal scores: plain mean
    EXPECT_NEAR(out[2 * hd + i], (v0[i] + v1[i] + v2[i]) / 3, 1e-5);
  }
}

// ---- llama.cpp F16 attention parity (AttentionConfig::ggml_f16) ----

AttentionConfig GgmlConfig(int n_heads, int head_dim) {
  AttentionConfig cfg{n_heads, head_dim, 0.0f};
  cfg.ggml_f16 = true;
  return cfg;
}

// Products 2^24 (lane 0 of accumulator 0), 1 (accumulator 1), -2^24
// (accumulator 2): ggml reduces (acc0 + acc2) + (acc1 + acc3) = 1, where a
// running f32 sum would lose the 1. The tail past the 32-element blocks is
// summed in double: +2^24, -2^24 after the block result 1 keep it.
TEST(AttentionGgmlF16, DotFollowsGgmlLaneOrderAndDoubleTail) {
  std::vector<uint16_t> x(40, FloatToHalf(0.0f)), y(40, FloatToHalf(1.0f));
  x[0] = y[0] = y[16] = y[32] = y[33] = FloatToHalf(4096.0f);
  x[16] = FloatToHalf(-4096.0f);
  x[8] = FloatToHalf(1.0f);
  EXPECT_EQ(internal::GgmlDotF16(x.data(), y.data(), 32), 1.0f);
  x[32] = FloatToHalf(4096.0f);
  x[33] = FloatToHalf(-4096.0f);
  EXPECT_EQ(internal::GgmlDotF16(x.data(), y.data(), 40), 1.0f);
  EXPECT_EQ(internal::GgmlDotF16(x.data() + 32, y.data() + 32, 8), 0.0f);
}

// Products 2^24 (lane 0), 1 (lane 1), -2^24 (lane 4): tinyBLAS's horizontal
// sum adds lanes 0 and 4 first and keeps the 1 that a running f32 sum loses;
// the second block of 8 lands in the same lanes.
TEST(AttentionGgmlF16, TinyBlasDotFollowsItsHorizontalSum) {
  std::vector<uint16_t> x(16, FloatToHalf(0.0f)), y(16, FloatToHalf(1.0f));
  x[0] = y[0] = y[12] = FloatToHalf(4096.0f);
  x[1] = FloatToHalf(1.0f);
  x[12] = FloatToHalf(-4096.0f);
  EXPECT_EQ(internal::TinyBlasDotF16(x.data(), y.data(), 8), 0x1p24f);
  EXPECT_EQ(internal::TinyBlasDotF16(x.data(), y.data(), 16), 1.0f);
}

// ggml's vectorized expf: within 2 ulp of libm's where the result is normal,
// exp(0) == 1, and its two-step scaling below 2^-126 and saturation.
TEST(AttentionGgmlF16, ExpfIsCloseToLibmAndSaturates) {
  for (float x = -87.0f; x <= 88.0f; x += 0.01171875f) {
    const float want = std::exp(x);
    ASSERT_NEAR(internal::GgmlExpf(x), want, 2 * (std::nextafter(want, INFINITY) - want)) << x;
  }
  EXPECT_EQ(internal::GgmlExpf(0.0f), 1.0f);
  EXPECT_NEAR(internal::GgmlExpf(-95.0f), std::exp(-95.0f), 3e-45);
  EXPECT_EQ(internal::GgmlExpf(-INFINITY), 0.0f);
  EXPECT_EQ(internal::GgmlExpf(-200.0f), 0.0f);
  EXPECT_EQ(internal::GgmlExpf(200.0f), INFINITY);
}

// Equal scores over 3 positions: each probability float(1/3) is rounded to
// f16 (0x3555 = 0.333251953125) before multiplying V = 1, so the output is
// 3 x that (exact in f32), not f32's 1.
TEST(AttentionGgmlF16, RoundsProbabilitiesToHalf) {
  const int hd = 8;
  PagedKv kv(3, 2, 1, 0, 1, hd, KvDtype::kF16);
  std::vector<float> k(hd, 0.25f), v(hd, 1.0f);
  for (int64_t p = 0; p < 3; ++p) {
    StoreKvRow(kv.layer, true, p, k.data());
    StoreKvRow(kv.layer, false, p, v.data());
  }
  const std::vector<float> q(hd, 0.5f);
  std::vector<float> got(hd), f32(hd);
  Attention(q.data(), 1, 2, kv.layer, GgmlConfig(1, hd), got.data(), nullptr);
  Attention(q.data(), 1, 2, kv.layer, AttentionConfig{1, hd, 0.0f}, f32.data(), nullptr);
  for (int i = 0; i < hd; ++i) {
    EXPECT_EQ(got[i], 3 * 0.333251953125f);
    EXPECT_NEAR(f32[i], 1.0f, 1e-6);
  }
}

// Agrees with the double reference to f16 accuracy over the shapes the f32
// path is checked on, pooled or not; an F32 cache is refused.
TEST(AttentionGgmlF16, CloseToReferenceAndNeedsF16Cache) {
  ThreadPool pool(2);
  for (const AttnCase& c :
       {AttnCase{8, 2, 64, 16, 37, 1, KvDtype::kF16}, AttnCase{8, 2, 64, 16, 0, 20, KvDtype::kF16},
        AttnCase{8, 8, 8, 4, 11, 5, KvDtype::kF16}, AttnCase{2, 1, 40, 3, 6, 2, KvDtype::kF16}}) {
    const int64_t n_pos = c.start_pos + c.n_tokens;
    PagedKv kv(n_pos, c.block_tokens, 1, 0, c.n_kv_heads, c.head_dim, c.dtype);
    const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
    const auto keys = Random(n_pos * kv_dim, 12, 1.5f), values = Random(n_pos * kv_dim, 13);
    for (int64_t p = 0; p < n_pos; ++p) {
      StoreKvRow(kv.layer, true, p, keys.data() + p * kv_dim);
      StoreKvRow(kv.layer, false, p, values.data() + p * kv_dim);
    }
    const auto q = Random(c.n_tokens * c.n_heads * c.head_dim, 14, 1.5f);
    std::vector<float> got(q.size()), pooled(q.size()), want(q.size());
    Attention(q.data(), c.n_tokens, c.start_pos, kv.layer, GgmlConfig(c.n_heads, c.head_dim),
              got.data(), nullptr);
    Attention(q.data(), c.n_tokens, c.start_pos, kv.layer, GgmlConfig(c.n_heads, c.head_dim),
              pooled.data(), &pool);
    AttentionReference(q.data(), c.n_tokens, c.start_pos, kv.layer,
                       AttentionConfig{c.n_heads, c.head_dim, 0.0f}, want.data());
    EXPECT_EQ(got, pooled);
    ExpectClose(got, want, 1e-2, 5e-3, "ggml f16 attention");
  }
  PagedKv f32(1, 1, 1, 0, 1, 8, KvDtype::kF32);
  std::vector<float> q(8, 1.0f), out(8);
  EXPECT_THROW(Attention(q.data(), 1, 0, f32.layer, GgmlConfig(1, 8), out.data(), nullptr), Error);
}

}  // namespace
}  // namespace meshnet::ops
