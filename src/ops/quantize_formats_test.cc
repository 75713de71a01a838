// The formats added for llama.cpp's presets (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K,
// Q3_K, Q5_K, IQ4_XS): hand-built blocks whose expected values follow the GGML
// format description (not this implementation), and quantize/dequantize
// round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/quantize.h"
#include "util/dtype.h"

namespace meshnet::ops {
namespace {

// GGML's kvalues_iq4nl, spelled out from the format description.
constexpr float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
constexpr uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400;
constexpr uint16_t kHalfTwo = 0x4000, kHalfMinusOne = 0xBC00;

TEST(QuantFormats, RowBytes) {
  EXPECT_EQ(RowBytes(GgmlType::kQ4_1, 64), 40);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_0, 64), 44);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_1, 64), 48);
  EXPECT_EQ(RowBytes(GgmlType::kIQ4_NL, 64), 36);
  EXPECT_EQ(RowBytes(GgmlType::kQ2_K, 512), 168);
  EXPECT_EQ(RowBytes(GgmlType::kQ3_K, 256), 110);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_K, 256), 176);
  EXPECT_EQ(RowBytes(GgmlType::kIQ4_XS, 256), 136);
  EXPECT_FALSE(RowLengthValid(GgmlType::kQ5_0, 48));
  EXPECT_FALSE(RowLengthValid(GgmlType::kIQ4_XS, 32));
  EXPECT_EQ(ParseGgmlType("iq4_nl"), GgmlType::kIQ4_NL);
  EXPECT_EQ(GgmlTypeInfoFor(23)->name, "IQ4_XS");
}

TEST(QuantFormats, Q4_1HandBuilt) {
  BlockQ4_1 b;
  b.d = kHalfHalf;
  b.m = kHalfMinusOne;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(GgmlType::kQ4_1, &b, 32, y);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 1.0f);
    EXPECT_EQ(y[j + 16], (15 - j) * 0.5f - 1.0f);
  }
}

// Element i's fifth bit is bit i of the little-endian u32 qh.
TEST(QuantFormats, Q5_0AndQ5_1HandBuilt) {
  BlockQ5_0 b0;
  BlockQ5_1 b1;
  b0.d = b1.d = kHalfQuarter;
  b1.m = kHalfTwo;
  const uint32_t qh = 0x80000001u | (1u << 17);  // elements 0, 17, 31
  std::memcpy(b0.qh, &qh, 4);
  std::memcpy(b1.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b0.qs[j] = b1.qs[j] = static_cast<uint8_t>(j | (3 << 4));
  float y0[32], y1[32];
  DequantizeRow(GgmlType::kQ5_0, &b0, 32, y0);
  DequantizeRow(GgmlType::kQ5_1, &b1, 32, y1);
  EXPECT_EQ(y0[0], (16 + 0 - 16) * 0.25f);
  EXPECT_EQ(y0[5], (5 - 16) * 0.25f);
  EXPECT_EQ(y0[16], (3 - 16) * 0.25f);
  EXPECT_EQ(y0[17], (16 + 3 - 16) * 0.25f);
  EXPECT_EQ(y0[31], (16 + 3 - 16) * 0.25f);
  EXPECT_EQ(y1[0], 16 * 0.25f + 2.0f);
  EXPECT_EQ(y1[5], 5 * 0.25f + 2.0f);
  EXPECT_EQ(y1[16], 3 * 0.25f + 2.0f);
  EXPECT_EQ(y1[17], 19 * 0.25f + 2.0f);
}

TEST(QuantFormats, IQ4_NLHandBuilt) {
  BlockIQ4_NL b;
  b.d = kHalfTwo;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(GgmlType::kIQ4_NL, &b, 32, y);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * kLevels[j]);
    EXPECT_EQ(y[j + 16], 2.0f * kLevels[15 - j]);
  }
}

// Q2_K: 16-block k has scale scales[k] & 15 and min scales[k] >> 4; element
// 128*h + 32*g + l has its code in qs[32*h + l] at bits 2g.
TEST(QuantFormats, Q2_KHandBuilt) {
  BlockQ2_K b;
  std::memset(&b, 0, sizeof(b));
  for (auto& s : b.scales) s = 0x21;  // scale 1, min 2
  b.scales[2] = 0x53;                 // elements 32..47: scale 3, min 5
  b.d = kHalfHalf;
  b.dmin = kHalfQuarter;
  b.qs[0] = 0b11100100;  // elements 0, 32, 64, 96: codes 0, 1, 2, 3
  b.qs[32 + 17] = 3;     // element 145: code 3
  float y[256];
  DequantizeRow(GgmlType::kQ2_K, &b, 256, y);
  EXPECT_EQ(y[0], -0.5f);
  EXPECT_EQ(y[32], 0.5f * 3 * 1 - 0.25f * 5);
  EXPECT_EQ(y[33], -0.25f * 5);
  EXPECT_EQ(y[64], 0.5f * 2 - 0.5f);
  EXPECT_EQ(y[96], 0.5f * 3 - 0.5f);
  EXPECT_EQ(y[145], 0.5f * 3 - 0.5f);
  EXPECT_EQ(y[255], -0.5f);
}

// Q3_K: 6-bit scales stored +32 (byte k%8 holds the low nibble of scale k,
// in its high nibble for k >= 8; byte 8 + k%4 the top bits at 2*(k/4)); an
// element's code is its 2 bits minus 4 unless its hmask bit is set.
TEST(QuantFormats, Q3_KHandBuilt) {
  BlockQ3_K b;
  std::memset(&b, 0, sizeof(b));
  int stored[16];
  for (int& s : stored) s = 33;  // scale +1
  stored[5] = 32 - 3;            // elements 80..95: scale -3
  for (int k = 0; k < 16; ++k) {
    b.scales[k % 8] |= static_cast<uint8_t>((stored[k] & 0xF) << (k < 8 ? 0 : 4));
    b.scales[8 + k % 4] |= static_cast<uint8_t>((stored[k] >> 4) << (2 * (k / 4)));
  }
  std::memset(b.hmask, 0xFF, sizeof(b.hmask));
  b.hmask[0] = 0xFE;  // element 0: no high bit
  b.d = kHalfHalf;
  b.qs[0] = 1;        // element 0: 1 - 4
  b.qs[16] = 2 << 4;  // element 80 (group 2 at bits 4-5): 2
  float y[256];
  DequantizeRow(GgmlType::kQ3_K, &b, 256, y);
  EXPECT_EQ(y[0], 0.5f * 1 * (1 - 4));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[80], 0.5f * -3 * 2);
  EXPECT_EQ(y[81], 0.0f);
}

// Q5_K: Q4_K's 6-bit (scale, min) packing; element l of 32-block j takes the
// low (j even) or high nibble of qs[32*(j/2) + l] and bit j of qh[l].
TEST(QuantFormats, Q5_KHandBuilt) {
  BlockQ5_K b;
  std::memset(&b, 0, sizeof(b));
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  b.scales[0] = 2;  // j = 0: scale 2
  b.scales[4] = 1;  //        min 1
  // j = 5: scale 17 = 0b01'0001, min 3: low nibbles in byte 9, top bits of
  // the scale in byte 1 (bits 6-7), of the min in byte 5.
  b.scales[9] = static_cast<uint8_t>(1 | (3 << 4));
  b.scales[1] = 1 << 6;
  b.qs[0] = 5;
  b.qh[0] = 1;  // element 0: 5 + 16
  b.qs[64 + 3] = 0x70;
  b.qh[3] = 1 << 5;  // element 163: 7 + 16
  float y[256];
  DequantizeRow(GgmlType::kQ5_K, &b, 256, y);
  EXPECT_EQ(y[0], 2.0f * 21 - 0.5f);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_EQ(y[163], 17.0f * 23 - 0.5f * 3);
  EXPECT_EQ(y[164], -0.5f * 3);
}

// IQ4_XS: sub-block j's scale is (low nibble j of scales_l | 2 bits j of
// scales_h << 4) - 32; codes index the IQ4_NL levels as in IQ4_NL.
TEST(QuantFormats, IQ4_XSHandBuilt) {
  BlockIQ4_XS b;
  std::memset(&b, 0, sizeof(b));
  b.d = kHalfHalf;
  int ls[8] = {34, 32, 32, 31, 32, 32, 32, 32};
  for (int j = 0; j < 8; ++j) {
    b.scales_l[j / 2] |= static_cast<uint8_t>((ls[j] & 0xF) << (4 * (j % 2)));
    b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls[j] >> 4) << (2 * j)));
  }
  b.qs[0] = 0x0F;       // element 0: level 15; element 16: level 0
  b.qs[48 + 4] = 0x80;  // sub-block 3: element 4 level 0, element 20 level 8
  float y[256];
  DequantizeRow(GgmlType::kIQ4_XS, &b, 256, y);
  EXPECT_EQ(y[0], 0.5f * 2 * kLevels[15]);
  EXPECT_EQ(y[16], 0.5f * 2 * kLevels[0]);
  EXPECT_EQ(y[96 + 4], 0.5f * -1 * kLevels[0]);
  EXPECT_EQ(y[96 + 20], 0.5f * -1 * kLevels[8]);
  EXPECT_EQ(y[40], 0.0f);
}

struct Case {
  GgmlType type;
  int64_t n;
  double max_rel_rmse;  // rmse / rms(x)
};

class FormatRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(FormatRoundTrip, ErrorIsBoundedAndZerosStayZero) {
  const Case c = GetParam();
  const char* name = GgmlTypeInfoOf(c.type).name.data();
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.02f * static_cast<float>(seed * seed));
    std::vector<float> x(static_cast<size_t>(c.n));
    for (auto& v : x) v = dist(rng);
    if (seed == 3) {  // an outlier and a constant-positive stretch
      x[7] = 40.0f * 0.02f * 9;
      for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.2f + 0.001f * i;
    }
    std::vector<uint8_t> q(static_cast<size_t>(RowBytes(c.type, c.n)) + 1, 0xAB);
    QuantizeRow(c.type, x.data(), c.n, q.data());
    EXPECT_EQ(q.back(), 0xAB) << name << " wrote past RowBytes";
    std::vector<float> y(x.size());
    DequantizeRow(c.type, q.data(), c.n, y.data());
    double se = 0, sx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      se += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
      sx += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(se / sx), c.max_rel_rmse) << name << " seed " << seed;
  }
  std::vector<float> zeros(static_cast<size_t>(c.n), 0.0f), y(zeros.size(), 1.0f);
  std::vector<uint8_t> q(static_cast<size_t>(RowBytes(c.type, c.n)));
  QuantizeRow(c.type, zeros.data(), c.n, q.data());
  DequantizeRow(c.type, q.data(), c.n, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f) << name;
}

INSTANTIATE_TEST_SUITE_P(
    NewTypes, FormatRoundTrip,
    ::testing::Values(Case{GgmlType::kQ4_1, 32 * 8, 0.15}, Case{GgmlType::kQ5_0, 32 * 8, 0.12},
                      Case{GgmlType::kQ5_1, 32 * 8, 0.06}, Case{GgmlType::kIQ4_NL, 32 * 8, 0.15},
                      Case{GgmlType::kQ2_K, 256 * 2, 0.45}, Case{GgmlType::kQ3_K, 256 * 2, 0.25},
                      Case{GgmlType::kQ5_K, 256 * 2, 0.06},
                      Case{GgmlType::kIQ4_XS, 256 * 2, 0.15}));

}  // namespace
}  // namespace meshnet::ops
