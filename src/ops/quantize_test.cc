#include "ops/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/half_inline.h"
#include "util/dtype.h"

namespace meshnet::ops {
namespace {

std::vector<float> RandomRow(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(HalfToFloatFast, MatchesReferenceForEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = HalfToFloat(static_cast<uint16_t>(h));
    const float got = HalfToFloatFast(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(FloatBits(want), FloatBits(got)) << h;
    }
  }
}

// Every float that is a half, the midpoints between neighbouring halves (ties)
// and their float neighbours, and a stride over all bit patterns.
TEST(FloatToHalfFast, MatchesReferenceAtHalvesTiesAndAStride) {
  auto check = [](uint32_t bits) {
    const float f = BitsFloat(bits);
    ASSERT_EQ(FloatToHalfFast(f), FloatToHalf(f)) << std::hex << bits;
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const float lo = HalfToFloat(static_cast<uint16_t>(h | sign));
      const float hi = HalfToFloat(static_cast<uint16_t>((h + 1) | sign));
      const uint32_t mid = FloatBits((lo + hi) / 2);  // exact in f32
      for (uint32_t b : {FloatBits(lo), mid - 1, mid, mid + 1}) check(b);
    }
  }
  for (uint64_t b = 0; b <= 0xffffffffu; b += 4093) check(static_cast<uint32_t>(b));
  for (uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x477ff000u, 0x477fefffu}) check(b);
}

TEST(Quantize, RowBytesAndValidity) {
  EXPECT_EQ(RowBytes(GgmlType::kF32, 7), 28);
  EXPECT_EQ(RowBytes(GgmlType::kBF16, 7), 14);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 96), 54);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_K, 512), 288);
  EXPECT_EQ(RowBytes(GgmlType::kQ6_K, 256), 210);
  EXPECT_TRUE(RowLengthValid(GgmlType::kF16, 3));
  EXPECT_FALSE(RowLengthValid(GgmlType::kQ8_0, 33));
  EXPECT_FALSE(RowLengthValid(GgmlType::kQ4_K, 32));
  EXPECT_FALSE(RowLengthValid(GgmlType::kF32, -1));
}

// Hand-built blocks: expected values follow the GGML format description, not
// this implementation.
TEST(Dequantize, Q8_0HandBuilt) {
  BlockQ8_0 b;
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
  float y[32];
  DequantizeRow(GgmlType::kQ8_0, &b, 32, y);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.5f);
}

TEST(Dequantize, Q4_0HandBuiltLowNibblesFirst) {
  BlockQ4_0 b;
  b.d = 0x4000;  // 2.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(GgmlType::kQ4_0, &b, 32, y);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 2.0f) << j;
    EXPECT_EQ(y[j + 16], (7 - j) * 2.0f) << j;
  }
}

TEST(Dequantize, Q4_KHandBuiltSixBitScales) {
  // Sub-block scales/mins; j >= 4 need the high 2 bits stored in bytes 0..7.
  const int s[8] = {1, 2, 3, 4, 17, 33, 48, 63};
  const int m[8] = {0, 1, 2, 3, 20, 40, 5, 63};
  BlockQ4_K b;
  b.d = 0x3C00;     // 1.0
  b.dmin = 0x3800;  // 0.5
  const uint8_t packed[12] = {65, 130, 195, 196, 64, 129, 2, 195, 65, 129, 80, 255};
  std::memcpy(b.scales, packed, 12);
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * k + l] = static_cast<uint8_t>((l & 15) | ((15 - (l & 15)) << 4));
  float y[256];
  DequantizeRow(GgmlType::kQ4_K, &b, 256, y);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;  // sub-block
    const int l = e % 32;
    const int code = (j % 2 == 0) ? (l & 15) : 15 - (l & 15);
    EXPECT_EQ(y[e], 1.0f * s[j] * code - 0.5f * m[j]) << e;
  }
}

TEST(Dequantize, Q6_KHandBuilt) {
  BlockQ6_K b;
  std::memset(b.ql, 0x21, sizeof(b.ql));  // low nibble 1, high nibble 2
  std::memset(b.qh, 0xE4, sizeof(b.qh));  // 2-bit fields 0, 1, 2, 3 (low to high)
  for (int k = 0; k < 16; ++k) b.scales[k] = static_cast<int8_t>(k - 8);
  b.d = 0x3400;  // 0.25
  float y[256];
  DequantizeRow(GgmlType::kQ6_K, &b, 256, y);
  // Within each 128 half: quarters use (ql low, qh bits 0-1), (ql[+32] low,
  // bits 2-3), (ql high, bits 4-5), (ql[+32] high, bits 6-7).
  const int code_of_quarter[4] = {1 | (0 << 4), 1 | (1 << 4), 2 | (2 << 4), 2 | (3 << 4)};
  for (int e = 0; e < 256; ++e) {
    const int code = code_of_quarter[(e % 128) / 32];
    EXPECT_EQ(y[e], 0.25f * static_cast<float>(e / 16 - 8) * static_cast<float>(code - 32)) << e;
  }
}

TEST(Quantize, Q8_0ReferenceFormula) {
  // amax 127 -> d = 1: codes are the rounded inputs.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = (j == 5) ? -127.0f : static_cast<float>(j) * 1.4f - 20.0f;
  BlockQ8_0 b;
  QuantizeRow(GgmlType::kQ8_0, x, 32, &b);
  EXPECT_EQ(b.d, 0x3C00);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(b.qs[j], static_cast<int>(std::roundf(x[j]))) << j;
}

TEST(Quantize, Q4_0MaxMagnitudeMapsToCodeZero) {
  float x[32] = {};
  x[3] = -16.0f;  // largest magnitude, negative: d = -16 / -8 = 2
  x[20] = 13.0f;  // 13 / 2 + 8.5 = 15.0 -> 15
  BlockQ4_0 b;
  QuantizeRow(GgmlType::kQ4_0, x, 32, &b);
  EXPECT_EQ(b.d, 0x4000);
  EXPECT_EQ(b.qs[3] & 0xF, 0);
  EXPECT_EQ(b.qs[4] >> 4, 15);
  EXPECT_EQ(b.qs[0] & 0xF, 8);
}

struct RoundTripCase {
  GgmlType type;
  int64_t n;
  double max_rel_rmse;  // rmse / rms(x)
};

class RoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTrip, ErrorIsBounded) {
  const auto c = GetParam();
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::vector<float> x = RandomRow(c.n, seed, 0.02f * static_cast<float>(seed * seed));
    if (seed == 3 && c.n >= 64) {  // an outlier and a constant-positive stretch
      x[7] = 40.0f;
      for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 1.0f + 0.01f * i;
    }
    std::vector<uint8_t> q(static_cast<size_t>(RowBytes(c.type, c.n)) + 1, 0xAB);
    QuantizeRow(c.type, x.data(), c.n, q.data());
    EXPECT_EQ(q.back(), 0xAB) << "wrote past RowBytes";
    std::vector<float> y(static_cast<size_t>(c.n));
    DequantizeRow(c.type, q.data(), c.n, y.data());
    double se = 0, sx = 0;
    for (int64_t i = 0; i < c.n; ++i) {
      se += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
      sx += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(se / sx), c.max_rel_rmse)
        << GgmlTypeInfoOf(c.type).name << " seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTrip,
                         ::testing::Values(RoundTripCase{GgmlType::kF32, 7, 0.0},
                                           RoundTripCase{GgmlType::kF16, 33, 1e-3},
                                           RoundTripCase{GgmlType::kBF16, 1, 8e-3},
                                           RoundTripCase{GgmlType::kBF16, 65, 8e-3},
                                           RoundTripCase{GgmlType::kQ8_0, 32, 0.01},
                                           RoundTripCase{GgmlType::kQ8_0, 96 * 32, 0.02},
                                           RoundTripCase{GgmlType::kQ4_0, 32 * 5, 0.15},
                                           RoundTripCase{GgmlType::kQ4_K, 256, 0.12},
                                           RoundTripCase{GgmlType::kQ4_K, 256 * 3, 0.12},
                                           RoundTripCase{GgmlType::kQ6_K, 256, 0.04},
                                           RoundTripCase{GgmlType::kQ6_K, 256 * 3, 0.04}));

TEST(Quantize, AllZeroRowsStayZero) {
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    std::vector<float> x(512, 0.0f), y(512, 1.0f);
    std::vector<uint8_t> q(static_cast<size_t>(RowBytes(t, 512)));
    QuantizeRow(t, x.data(), 512, q.data());
    DequantizeRow(t, q.data(), 512, y.data());
    for (float v : y) EXPECT_EQ(v, 0.0f) << GgmlTypeInfoOf(t).name;
  }
}

TEST(Quantize, ExactlyRepresentableRowsSurvive) {
  // Values on a Q8_0 grid with an f16-exact scale decode unchanged.
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 0.25f * static_cast<float>((i * 37) % 255 - 127);
  x[0] = -127 * 0.25f;  // each block holds a +-127 code, so d = 0.25 exactly
  x[32] = 127 * 0.25f;
  std::vector<uint8_t> q(static_cast<size_t>(RowBytes(GgmlType::kQ8_0, 64)));
  QuantizeRow(GgmlType::kQ8_0, x.data(), 64, q.data());
  std::vector<float> y(64);
  DequantizeRow(GgmlType::kQ8_0, q.data(), 64, y.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

}  // namespace
}  // namespace meshnet::ops
