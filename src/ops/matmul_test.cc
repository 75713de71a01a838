#include "ops/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/hwy_test_util.h"
#include "ops/matmul_kernels.h"
#include "ops/matmul_test_util.h"
#include "ops/quantize.h"
#include "util/dtype.h"
#include "util/thread_pool.h"

namespace meshnet::ops {
namespace {

using testing::MakeWeights;
using testing::Pack;
using testing::RandomActs;
using testing::Weights;

// Uniformly random block bytes (every code, scale and sign bit pattern,
// e.g. Q8_0's -128 that no quantizer writes) with the f16 scale fields set to
// random finite halves in [2^-10, 2^-4), of either sign for d.
// fill >= 0: every byte but the f16 fields is fill instead.
Weights RandomBitWeights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed, int fill = -1) {
  struct Fields {
    GgmlType type;
    int block_bytes, d_at, dmin_at;  // byte offsets of the f16 fields (-1: none)
  };
  static constexpr Fields kFields[] = {
      {GgmlType::kQ8_0, 34, 0, -1},    {GgmlType::kQ4_0, 18, 0, -1},
      {GgmlType::kQ4_1, 20, 0, 2},     {GgmlType::kQ5_0, 22, 0, -1},
      {GgmlType::kQ5_1, 24, 0, 2},     {GgmlType::kIQ4_NL, 18, 0, -1},
      {GgmlType::kQ2_K, 84, 80, 82},   {GgmlType::kQ3_K, 110, 108, -1},
      {GgmlType::kQ4_K, 144, 0, 2},    {GgmlType::kQ5_K, 176, 0, 2},
      {GgmlType::kQ6_K, 210, 208, -1}, {GgmlType::kIQ4_XS, 136, 0, -1}};
  Fields f{};
  for (const Fields& k : kFields) {
    if (k.type == type) f = k;
  }
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(-10.0f, -4.0f);
  auto half = [&](bool any_sign) {
    const float v = std::exp2(mag(rng)) * (any_sign && rng() % 2 ? -1.0f : 1.0f);
    return FloatToHalf(v);
  };
  Weights out;
  const int64_t rb = RowBytes(type, cols);
  out.bytes.resize(static_cast<size_t>(rb * rows));
  for (auto& b : out.bytes) b = static_cast<uint8_t>(fill >= 0 ? fill : rng());
  for (size_t at = 0; at < out.bytes.size(); at += static_cast<size_t>(f.block_bytes)) {
    const uint16_t d = half(true);
    std::memcpy(out.bytes.data() + at + f.d_at, &d, 2);
    if (f.dmin_at >= 0) {
      const uint16_t m = half(false);
      std::memcpy(out.bytes.data() + at + f.dmin_at, &m, 2);
    }
  }
  out.w = WeightMatrix{type, out.bytes.data(), rows, cols};
  out.dequant.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(type, out.bytes.data() + r * rb, cols, out.dequant.data() + r * cols);
  }
  return out;
}

struct Shape {
  int64_t rows, cols, n_tokens;
};

// packed: w also carries the PackWeights layout (where the type has one),
// which the targets with a packed kernel read and the others ignore.
void CheckType(GgmlType type, const std::vector<Shape>& shapes, bool random_bits = false,
               bool packed = false) {
  const char* name = GgmlTypeInfoOf(type).name.data();
  ThreadPool pool2(2);
  ThreadPool pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    Weights wt = random_bits ? RandomBitWeights(type, s.rows, s.cols, seed++)
                             : MakeWeights(type, s.rows, s.cols, seed++);
    const std::vector<float> x = RandomActs(s.n_tokens, s.cols, seed++);
    std::vector<uint8_t> packed_bytes;
    if (packed) Pack(wt, packed_bytes);
    std::vector<float> ref_q(static_cast<size_t>(s.n_tokens * s.rows));
    std::vector<float> ref_f(ref_q.size());
    MatMulReferenceQuantized(wt.w, x.data(), s.n_tokens, ref_q.data());
    MatMulReference(wt.w, x.data(), s.n_tokens, ref_f.data());

    // Per-output bounds: rounding (relative to sum |w x|) and the activations'
    // own rounding: sum |w| * d/2 over each activation block, q8_1's f16 s in
    // the offset term, f16 activations for F16 weights.
    std::vector<double> mag(ref_q.size()), act_err(ref_q.size(), 0.0);
    std::vector<int16_t> q(static_cast<size_t>(s.cols));
    std::vector<float> d(static_cast<size_t>(s.cols / 32 + 1)), sb(d.size());
    const bool quant = MatMulQuantizesActivations(type);
    const int64_t rb = RowBytes(type, s.cols);
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const float* xt = x.data() + t * s.cols;
      if (quant) QuantizeActivationsReference(type, xt, s.cols, q.data(), d.data(), sb.data());
      for (int64_t r = 0; r < s.rows; ++r) {
        double m = 0, e = 0;
        for (int64_t i = 0; i < s.cols; ++i) {
          const double wv = wt.dequant[r * s.cols + i];
          m += std::fabs(wv * xt[i]);
          if (quant) e += std::fabs(wv * d[i / 32]) * 0.5;  // q8_K: d < 0 when max < 0
          if (type == GgmlType::kF16)
            e += std::fabs(wv * (xt[i] - HalfToFloat(FloatToHalf(xt[i]))));
        }
        if (ActFormatFor(type) == ActFormat::kQ8_1) {
          for (int64_t b = 0; b < s.cols / 32; ++b) {
            int sum = 0;
            for (int i = 0; i < 32; ++i) sum += q[b * 32 + i];
            uint16_t mbits;
            std::memcpy(&mbits, wt.bytes.data() + r * rb + b * (rb / (s.cols / 32)) + 2, 2);
            e += std::fabs(HalfToFloat(mbits)) * std::fabs(sb[b] - d[b] * sum);
          }
        }
        mag[t * s.rows + r] = m;
        act_err[t * s.rows + r] = e;
      }
    }

    for (ThreadPool* pool : pools) {
      std::vector<float> y(ref_q.size() + 1, -12345.0f);  // last element: overrun guard
      std::vector<uint8_t> scratch(MatMulScratchBytes(type, s.n_tokens, s.cols) + 1);
      MatMul(wt.w, x.data(), s.n_tokens, y.data(), scratch.data() + 1, pool);  // misaligned
      EXPECT_EQ(y.back(), -12345.0f) << name << " wrote past y";
      for (size_t k = 0; k < ref_q.size(); ++k) {
        const double tol = 2e-5 * mag[k] + 1e-6;
        ASSERT_NEAR(y[k], ref_q[k], tol)
            << name << " rows=" << s.rows << " cols=" << s.cols << " tokens=" << s.n_tokens
            << " out=" << k << " threads=" << (pool ? pool->num_threads() : 1);
        ASSERT_NEAR(y[k], ref_f[k], tol + act_err[k] * 1.0001)
            << name << " vs float activations, out=" << k;
      }
    }
  }
}

TEST(MatMul, F32MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kF32, {{1, 1, 1},
                               {5, 7, 1},
                               {13, 33, 3},
                               {37, 100, 1},
                               {9, 64, 9},
                               {4, 256, 5},
                               {70, 48, 2},
                               {257, 515, 2}});
  });
}
TEST(MatMul, F16MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kF16,
              {{3, 7, 1}, {13, 33, 2}, {37, 100, 1}, {9, 64, 7}, {70, 48, 1}, {257, 515, 2}});
  });
}
TEST(MatMul, BF16MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kBF16,
              {{3, 7, 1}, {13, 33, 3}, {37, 100, 1}, {9, 64, 5}, {70, 48, 1}, {257, 515, 1}});
  });
}
TEST(MatMul, Q8_0MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ8_0, {{1, 32, 1},
                                {5, 96, 1},
                                {13, 64, 3},
                                {37, 160, 1},
                                {9, 32, 9},
                                {70, 256, 2},
                                {6, 512, 5},
                                {257, 1024, 3}});
  });
}
TEST(MatMul, Q4_0MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ4_0, {{1, 32, 1},
                                {5, 96, 1},
                                {13, 64, 3},
                                {37, 160, 1},
                                {9, 32, 9},
                                {70, 256, 2},
                                {257, 1024, 1}});
  });
}
TEST(MatMul, Q4_KMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ4_K, {{1, 256, 1},
                                {5, 512, 1},
                                {13, 256, 3},
                                {37, 768, 1},
                                {9, 256, 9},
                                {70, 256, 2},
                                {257, 1024, 2}});
  });
}
TEST(MatMul, Q6_KMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ6_K, {{1, 256, 1},
                                {5, 512, 1},
                                {13, 256, 3},
                                {37, 768, 1},
                                {9, 256, 9},
                                {70, 256, 2},
                                {257, 1024, 1}});
  });
}

TEST(MatMul, Q4_1MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ4_1,
              {{1, 32, 1}, {5, 96, 1}, {13, 64, 3}, {9, 32, 9}, {70, 256, 2}, {257, 512, 1}});
  });
}
TEST(MatMul, Q5_0MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ5_0,
              {{1, 32, 1}, {5, 96, 1}, {13, 64, 3}, {9, 32, 9}, {70, 256, 2}, {257, 512, 1}});
  });
}
TEST(MatMul, Q5_1MatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ5_1,
              {{1, 32, 1}, {5, 96, 1}, {13, 64, 3}, {9, 32, 9}, {70, 256, 2}, {257, 512, 1}});
  });
}
TEST(MatMul, IQ4_NLMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kIQ4_NL,
              {{1, 32, 1}, {5, 96, 1}, {13, 64, 3}, {9, 32, 9}, {70, 256, 2}, {257, 512, 1}});
  });
}
TEST(MatMul, Q2_KMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ2_K,
              {{1, 256, 1}, {5, 512, 1}, {13, 256, 3}, {9, 256, 9}, {70, 256, 2}, {257, 768, 1}});
  });
}
TEST(MatMul, Q3_KMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ3_K,
              {{1, 256, 1}, {5, 512, 1}, {13, 256, 3}, {9, 256, 9}, {70, 256, 2}, {257, 768, 1}});
  });
}
TEST(MatMul, Q5_KMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kQ5_K,
              {{1, 256, 1}, {5, 512, 1}, {13, 256, 3}, {9, 256, 9}, {70, 256, 2}, {257, 768, 1}});
  });
}
TEST(MatMul, IQ4_XSMatchesReference) {
  ForEachSimdTarget([] {
    CheckType(GgmlType::kIQ4_XS,
              {{1, 256, 1}, {5, 512, 1}, {13, 256, 3}, {9, 256, 9}, {70, 256, 2}, {257, 768, 1}});
  });
}

constexpr GgmlType kQuantTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                    GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL,
                                    GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                    GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS};

// Every bit pattern of the blocks decodes as the reference does, in the
// decode matvec and in every token tile (4, 2 and 1 tokens, and their mixes).
TEST(MatMul, QuantTypesOnRandomBitsMatchReference) {
  ForEachSimdTarget([] {
    for (GgmlType type : kQuantTypes) {
      CheckType(type, {{7, 512, 1}, {5, 256, 2}, {3, 256, 7}, {4, 768, 16}, {2, 256, 33}},
                /*random_bits=*/true);
    }
  });
}

// The K-quants packed 16 rows at a time: row counts around the groups of 16
// (the rest unpacked), token counts around the tiles of 4 and 8, every code, scale
// and min (random bits).
void CheckPackedKQuant(GgmlType type) {
  ForEachSimdTarget([type] {
    const std::vector<Shape> shapes = {{16, 256, 1}, {35, 512, 7}, {48, 256, 19},
                                       {33, 768, 8}, {17, 256, 9}, {16, 512, 16}};
    CheckType(type, shapes, /*random_bits=*/false, /*packed=*/true);
    CheckType(type, shapes, /*random_bits=*/true, /*packed=*/true);
  });
}
TEST(MatMul, PackedQ4_KMatchesReference) { CheckPackedKQuant(GgmlType::kQ4_K); }
TEST(MatMul, PackedQ6_KMatchesReference) { CheckPackedKQuant(GgmlType::kQ6_K); }
TEST(MatMul, PackedQ5_KMatchesReference) { CheckPackedKQuant(GgmlType::kQ5_K); }
TEST(MatMul, PackedIQ4_XSMatchesReference) { CheckPackedKQuant(GgmlType::kIQ4_XS); }
TEST(MatMul, PackedQ2_KMatchesReference) { CheckPackedKQuant(GgmlType::kQ2_K); }
TEST(MatMul, PackedQ3_KMatchesReference) { CheckPackedKQuant(GgmlType::kQ3_K); }

// Q8_0 likewise (tiles of 8 tokens), codes at every byte value (-128
// included: the unsigned-activation correction must be exact).
TEST(MatMul, PackedQ8_0MatchesReference) {
  ForEachSimdTarget([] {
    const std::vector<Shape> shapes = {{16, 256, 1}, {35, 512, 7}, {48, 64, 19}, {33, 96, 8},
                                       {17, 32, 9},  {64, 768, 3}, {16, 32, 16}};
    CheckType(GgmlType::kQ8_0, shapes, /*random_bits=*/false, /*packed=*/true);
    CheckType(GgmlType::kQ8_0, shapes, /*random_bits=*/true, /*packed=*/true);
  });
}

// The 32-element formats packed two blocks per unit: rows around the groups
// of 16, tokens around the tiles of 8, every bit pattern (every code, fifth
// bit and scale), and columns that are not a multiple of 64 (not packed).
TEST(MatMul, PackedBlock32MatchesReference) {
  const GgmlType types[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                            GgmlType::kIQ4_NL};
  ForEachSimdTarget([&] {
    const std::vector<Shape> shapes = {{16, 64, 1},  {35, 512, 7}, {48, 128, 19},
                                       {33, 768, 8}, {17, 64, 9},  {16, 96, 16}};
    for (GgmlType type : types) {
      CheckType(type, shapes, /*random_bits=*/false, /*packed=*/true);
      CheckType(type, shapes, /*random_bits=*/true, /*packed=*/true);
    }
  });
}

// Batches of the continuous-batching and prefill sizes (token tiles and tails).
TEST(MatMul, QuantTypesBatchedMatchReference) {
  ForEachSimdTarget([] {
    for (GgmlType type : kQuantTypes)
      CheckType(type, {{6, 256, 6}, {3, 512, 13}, {5, 256, 64}, {2, 512, 7}});
  });
}

// The 32-element formats' tiles (2 rows x 4 tokens, groups of 8 blocks) at
// the edges: rows and tokens not multiples of the tile, rows of 1-7 blocks
// past the last full group (352 = 11 blocks, 544 = 17, 96 = 3), and every
// bit pattern of the blocks.
TEST(MatMul, Block32TilesAtEdgeSizes) {
  const GgmlType types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                            GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL};
  ForEachSimdTarget([&] {
    for (GgmlType type : types) {
      CheckType(type, {{1, 352, 4}, {2, 352, 5}, {3, 544, 7}, {4, 256, 8}, {5, 96, 3}});
      CheckType(type, {{3, 352, 6}, {1, 544, 1}, {2, 224, 9}}, /*random_bits=*/true);
    }
  });
}

// The int8 kernels sum pair products of several blocks in int16 before
// scaling: every code at its largest (all bits set) times activations of
// +-127 of one sign is the worst case, in the decode matvec and in token tiles.
TEST(MatMul, KQuantsAtTheLargestCodesAndActivations) {
  ForEachSimdTarget([] {
    for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                          GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
      const int64_t rows = 3, cols = 512, n_tokens = 6;
      const Weights wt = RandomBitWeights(type, rows, cols, 31, /*fill=*/0xFF);
      std::vector<float> x(static_cast<size_t>(n_tokens * cols));
      for (int64_t t = 0; t < n_tokens; ++t) {  // +1, -1, then mixed signs per 256
        for (int64_t i = 0; i < cols; ++i) {
          x[t * cols + i] = (t == 0 || (t > 1 && (i / 256 + t) % 2 == 0)) ? 1.0f : -1.0f;
        }
      }
      for (int64_t nt : {int64_t{1}, n_tokens}) {
        std::vector<float> y(static_cast<size_t>(nt * rows)), want(y.size());
        std::vector<uint8_t> scratch(MatMulScratchBytes(type, nt, cols));
        MatMul(wt.w, x.data(), nt, y.data(), scratch.data(), nullptr);
        MatMulReferenceQuantized(wt.w, x.data(), nt, want.data());
        for (int64_t t = 0; t < nt; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            double mag = 0;
            for (int64_t i = 0; i < cols; ++i) mag += std::fabs(wt.dequant[r * cols + i]);
            ASSERT_NEAR(y[t * rows + r], want[t * rows + r], 2e-5 * mag + 1e-6)
                << GgmlTypeInfoOf(type).name << " token " << t << " of " << nt << " row " << r;
          }
        }
      }
    }
  });
}

TEST(MatMul, FloatWeightsAtEveryAlignment) {
  // The decode kernel aligns the weight stream with a masked head and tail;
  // place the matrix at every element offset within 64 bytes.
  ForEachSimdTarget([] {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      const int64_t elem = RowBytes(type, 1);
      for (int64_t cols : {7, 33, 100, 515, 768}) {
        Weights wt = MakeWeights(type, 3, cols, 21);
        const std::vector<float> x = RandomActs(1, cols, 22);
        std::vector<float> want(3);
        MatMulReferenceQuantized(wt.w, x.data(), 1, want.data());  // F16: f16 activations
        for (int64_t off = 0; off < 64; off += elem) {
          std::vector<uint8_t> buf(wt.bytes.size() + 64 + 64);
          uint8_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) + off;
          std::memcpy(base, wt.bytes.data(), wt.bytes.size());
          const WeightMatrix w{type, base, 3, cols};
          std::vector<float> y(3);
          MatMul(w, x.data(), 1, y.data(), nullptr, nullptr);
          for (int r = 0; r < 3; ++r) {
            double mag = 0;
            for (int64_t i = 0; i < cols; ++i) mag += std::fabs(wt.dequant[r * cols + i] * x[i]);
            ASSERT_NEAR(y[r], want[r], 2e-5 * mag + 1e-6)
                << GgmlTypeInfoOf(type).name << " cols " << cols << " offset " << off;
          }
        }
      }
    }
  });
}

TEST(MatMul, ActivationQuantizationIsRoundHalfEvenPer32Block) {
  std::vector<float> x(64, 0.0f);
  x[0] = 127.0f;  // block 0: d = 1, so codes are x rounded half to even
  x[1] = 2.5f;
  x[2] = -3.5f;
  x[3] = 0.49f;
  x[40] = -0.5f;  // block 1: d = 0.5/127, rounded to f16 as GGML's q8_0 stores it
  std::vector<int16_t> q(64);
  float d[2], s[2];
  QuantizeActivationsReference(GgmlType::kQ8_0, x.data(), 64, q.data(), d, s);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], -4);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(d[1], HalfToFloat(FloatToHalf(0.5f / 127.0f)));
  EXPECT_NE(d[1], 0.5f / 127.0f);
  EXPECT_EQ(q[40], -127);
  EXPECT_EQ(q[33], 0);
  EXPECT_EQ(s[0], 0.0f);
  // q8_1 (Q4_1/Q5_1 weights): s = f16(d * sum(q)) with the unrounded d.
  QuantizeActivationsReference(GgmlType::kQ5_1, x.data(), 64, q.data(), d, s);
  EXPECT_EQ(s[0], HalfToFloat(FloatToHalf(1.0f * (127 + 2 - 4))));
  EXPECT_EQ(s[1], HalfToFloat(FloatToHalf(0.5f / 127.0f * -127.0f)));
}

TEST(MatMul, Q8KActivationsScaleByTheSignedMaxOf256) {
  std::vector<float> x(256, 0.0f);
  x[3] = -127.0f;  // the first element of largest magnitude: iscale = -127/-127 = 1
  x[200] = 127.0f;
  x[7] = 0.5f;  // ties round to even
  x[9] = 1.5f;
  x[10] = -2.5f;
  std::vector<int16_t> q(256);
  float d[8], s[8];
  QuantizeActivationsReference(GgmlType::kQ4_K, x.data(), 256, q.data(), d, s);
  for (float v : d) EXPECT_EQ(v, 1.0f);
  EXPECT_EQ(q[3], -127);
  EXPECT_EQ(q[200], 127);
  EXPECT_EQ(q[7], 0);
  EXPECT_EQ(q[9], 2);
  EXPECT_EQ(q[10], -2);
  // The sign of d follows the first extreme.
  x[3] = 127.0f;
  x[200] = -127.0f;
  QuantizeActivationsReference(GgmlType::kIQ4_XS, x.data(), 256, q.data(), d, s);
  EXPECT_EQ(d[0], -1.0f);
  EXPECT_EQ(q[3], -127);
  EXPECT_EQ(q[200], 127);
  EXPECT_EQ(q[9], -2);
}

// MatMulMany over matrices of the same input gives each output bit for bit
// as MatMul of its matrix alone: rows around the groups of 16 and 4, decode
// and batch token counts, with and without pools and packing, and matrices
// of mixed types (which it runs one by one).
TEST(MatMul, ManyMatchesOneAtATime) {
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                            GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                            GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ2_K};
  ForEachSimdTarget([&] {
    ThreadPool pool2(2);
    ThreadPool pool3(3);
    ThreadPool* pools[] = {nullptr, &pool2, &pool3};
    uint32_t seed = 7;
    for (GgmlType type : types) {
      for (bool packed : {false, true}) {
        for (const int64_t rows_of_first : {160, 17}) {
          const int64_t cols = 512;
          // The last matrix is of another type when mixed: one MatMul each.
          for (bool mixed : {false, true}) {
            const GgmlType last =
                mixed ? (type == GgmlType::kQ8_0 ? GgmlType::kQ4_K : GgmlType::kQ8_0) : type;
            std::vector<Weights> wts;
            wts.push_back(MakeWeights(type, rows_of_first, cols, seed++));
            wts.push_back(MakeWeights(type, 48, cols, seed++));
            wts.push_back(MakeWeights(last, 35, cols, seed++));
            std::vector<std::vector<uint8_t>> packs(wts.size());
            for (size_t i = 0; packed && i < wts.size(); ++i) Pack(wts[i], packs[i]);
            for (int64_t n_tokens : {1, 5, 16}) {
              const std::vector<float> x = RandomActs(n_tokens, cols, seed++);
              size_t scratch_bytes = 0;
              for (const Weights& w : wts) {
                scratch_bytes =
                    std::max(scratch_bytes, MatMulScratchBytes(w.w.type, n_tokens, cols));
              }
              std::vector<uint8_t> scratch(scratch_bytes + 1);
              for (ThreadPool* pool : pools) {
                std::vector<std::vector<float>> alone(wts.size()), many(wts.size());
                const WeightMatrix* ws[3];
                float* ys[3];
                for (size_t i = 0; i < wts.size(); ++i) {
                  const size_t n = static_cast<size_t>(n_tokens * wts[i].w.rows);
                  alone[i].assign(n, 0.0f);
                  many[i].assign(n + 1, -12345.0f);  // last: overrun guard
                  MatMul(wts[i].w, x.data(), n_tokens, alone[i].data(), scratch.data() + 1, pool);
                  ws[i] = &wts[i].w;
                  ys[i] = many[i].data();
                }
                MatMulMany(ws, x.data(), n_tokens, ys, scratch.data() + 1, pool);
                for (size_t i = 0; i < wts.size(); ++i) {
                  EXPECT_EQ(many[i].back(), -12345.0f) << "wrote past output " << i;
                  many[i].pop_back();
                  ASSERT_EQ(
                      std::memcmp(many[i].data(), alone[i].data(), alone[i].size() * sizeof(float)),
                      0)
                      << GgmlTypeInfoOf(type).name << " packed=" << packed << " mixed=" << mixed
                      << " rows=" << wts[i].w.rows << " tokens=" << n_tokens << " output " << i
                      << " threads=" << (pool ? pool->num_threads() : 1);
                }
              }
            }
          }
        }
      }
    }
  });
}

TEST(MatMul, ZeroTokensOrRowsIsANoOp) {
  Weights wt = MakeWeights(GgmlType::kQ8_0, 4, 32, 3);
  float y = 7.0f;
  MatMul(wt.w, nullptr, 0, &y, nullptr, nullptr);
  EXPECT_EQ(y, 7.0f);
}

}  // namespace
}  // namespace meshnet::ops
