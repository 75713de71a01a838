// q8_0 / q4_0 KV: the block layout and quantizers (ops/kv_quant.h) and the
// fused attention over them, every SIMD target against the scalar reference.
#include "ops/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ops/hwy_test_util.h"
#include "ops/nn.h"
#include "ops/nn_test_util.h"
#include "util/dtype.h"

namespace meshnet::ops {
namespace {

constexpr KvDtype kQuantDtypes[] = {KvDtype::kQ8_0, KvDtype::kQ4_0};

uint16_t ScaleBits(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return d;
}

TEST(KvQuant, HeadBytesCountBlocksAndShortTails) {
  EXPECT_EQ(KvHeadBytes(KvDtype::kQ8_0, 64), 68);  // two ggml blocks of 34
  EXPECT_EQ(KvHeadBytes(KvDtype::kQ4_0, 64), 36);  // two of 18
  EXPECT_EQ(KvHeadBytes(KvDtype::kQ8_0, 8), 10);   // one short block: scale + 8 codes
  EXPECT_EQ(KvHeadBytes(KvDtype::kQ4_0, 8), 6);
  EXPECT_EQ(KvHeadBytes(KvDtype::kQ4_0, 39), 18 + 2 + 4);  // 7 values: 4 bytes
  EXPECT_EQ(KvHeadBytes(KvDtype::kF16, 64), 128);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 12, 64), 12 * 68);
}

// q8_0: d = max|x| / 127 in f16, codes round(x * 127 / max|x|); a zero block
// has d = 0 and codes 0.
TEST(KvQuant, Q8BlocksAsStated) {
  std::vector<float> x(40, 0.0f);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.5f;  // max |x| = 8 at i = 0
  std::vector<uint8_t> head(static_cast<size_t>(KvHeadBytes(KvDtype::kQ8_0, 40)));
  QuantizeKvHead(KvDtype::kQ8_0, x.data(), 40, head.data());
  EXPECT_EQ(ScaleBits(head.data()), FloatToHalf(8.0f / 127.0f));
  for (int i = 0; i < 32; ++i) {
    const int want = static_cast<int>(std::nearbyint(x[i] * (127.0f / 8.0f)));
    EXPECT_EQ(static_cast<int8_t>(head[2 + i]), want) << i;
  }
  EXPECT_EQ(static_cast<int8_t>(head[2]), -127);
  EXPECT_EQ(ScaleBits(head.data() + 34), 0);  // the 8-value tail: all zero
  for (int i = 0; i < 8; ++i) EXPECT_EQ(head[36 + i], 0);
  std::vector<float> back(40);
  DequantizeKvHead(KvDtype::kQ8_0, head.data(), 40, back.data());
  const float d = HalfToFloat(FloatToHalf(8.0f / 127.0f));
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(back[i], static_cast<int8_t>(head[2 + i]) * (i < 32 ? d : 0));
}

// q4_0: m = the value of largest magnitude, d = m / -8, code = round(x * -8 /
// m) + 8 clamped to 15; byte j = code j | code (j + h) << 4 (ggml's block for
// 32 values, h = 16; a short block of 7 has h = 4 and its last high nibble 8).
TEST(KvQuant, Q4BlocksAsStated) {
  std::vector<float> x(39);
  for (int i = 0; i < 39; ++i) x[i] = static_cast<float>(i % 11) - 4.0f;  // m = 6
  x[35] = -12.0f;                                                         // tail's m
  std::vector<uint8_t> head(static_cast<size_t>(KvHeadBytes(KvDtype::kQ4_0, 39)));
  QuantizeKvHead(KvDtype::kQ4_0, x.data(), 39, head.data());
  auto code = [&](float v, float m) {
    return std::clamp(static_cast<int>(std::nearbyint(v * (-8.0f / m))) + 8, 0, 15);
  };
  EXPECT_EQ(ScaleBits(head.data()), FloatToHalf(6.0f / -8.0f));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(head[2 + j] & 0xF, code(x[j], 6.0f)) << j;
    EXPECT_EQ(head[2 + j] >> 4, code(x[j + 16], 6.0f)) << j;
  }
  const uint8_t* tail = head.data() + 18;
  EXPECT_EQ(ScaleBits(tail), FloatToHalf(-12.0f / -8.0f));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(tail[2 + j] & 0xF, code(x[32 + j], -12.0f)) << j;
  for (int j = 0; j < 3; ++j) EXPECT_EQ(tail[2 + j] >> 4, code(x[36 + j], -12.0f)) << j;
  EXPECT_EQ(tail[5] >> 4, 8);
  EXPECT_EQ(tail[2 + 3] & 0xF, 0);  // x[35] = m itself: code 0, value -8 d
  std::vector<uint8_t> zero(static_cast<size_t>(KvHeadBytes(KvDtype::kQ4_0, 32)));
  const std::vector<float> zeros(32, 0.0f);
  QuantizeKvHead(KvDtype::kQ4_0, zeros.data(), 32, zero.data());
  EXPECT_EQ(ScaleBits(zero.data()), 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(zero[2 + j], 0x88);
}

// Round trip within half a step (d / 2) per value for q8_0; for q4_0 within
// a step (a value of the sign opposite to m rounds to code 16, clamped to 15);
// plus d's f16 rounding (2^-11 relative) times the largest code. Full, short
// and odd blocks; KvBlockCodes reads back the codes the dequantizer multiplies.
TEST(KvQuant, RoundTripWithinAStep) {
  for (KvDtype dt : kQuantDtypes) {
    const float bound = dt == KvDtype::kQ8_0 ? 0.5005f + 127.0f / 2000 : 1.001f + 8.0f / 2000;
    for (int hd : {7, 8, 32, 40, 64, 72, 128}) {
      const auto x = Random(3 * hd, 5 + hd, 2.0f);
      std::vector<uint8_t> row(static_cast<size_t>(KvRowBytes(dt, 3, hd)));
      QuantizeKvRow(dt, x.data(), 3, hd, row.data());
      std::vector<float> back(x.size());
      DequantizeKvRow(dt, row.data(), 3, hd, back.data());
      for (int h = 0; h < 3; ++h) {
        const uint8_t* head = row.data() + h * KvHeadBytes(dt, hd);
        for (int b = 0; b < KvBlocks(hd); ++b) {
          int8_t codes[kKvQuantBlock];
          const float d = KvBlockCodes(dt, head, hd, b, codes);
          for (int i = 32 * b; i < std::min(hd, 32 * b + 32); ++i) {
            const size_t k = static_cast<size_t>(h * hd + i);
            ASSERT_EQ(back[k], codes[i - 32 * b] * d);
            ASSERT_LE(std::fabs(back[k] - x[k]), bound * std::fabs(d))
                << KvDtypeName(dt) << " hd " << hd << " value " << k;
          }
        }
      }
    }
  }
}

// StoreKvRow writes exactly the quantizer's bytes into the paged row.
TEST(KvQuant, StoreKvRowQuantizesEachHead) {
  for (KvDtype dt : kQuantDtypes) {
    PagedKv kv(5, 2, 2, 1, 3, 40, dt);
    const auto row = Random(3 * 40, 9, 3.0f);
    StoreKvRow(kv.layer, /*key=*/true, 3, row.data());
    StoreKvRow(kv.layer, /*key=*/false, 4, row.data());
    std::vector<uint8_t> want(static_cast<size_t>(KvRowBytes(dt, 3, 40)));
    QuantizeKvRow(dt, row.data(), 3, 40, want.data());
    EXPECT_EQ(std::memcmp(kv.layer.KRow(3), want.data(), want.size()), 0);
    EXPECT_EQ(std::memcmp(kv.layer.VRow(4), want.data(), want.size()), 0);
  }
}

}  // namespace
}  // namespace meshnet::ops
