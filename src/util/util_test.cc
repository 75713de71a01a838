#include <gtest/gtest.h>

#include "util/clock.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/sizes.h"

namespace meshnet {
namespace {

TEST(Sizes, ParsesUnits) {
  EXPECT_EQ(ParseByteSize("64MiB"), 64LL << 20);
  EXPECT_EQ(ParseByteSize("2GiB"), 2LL << 30);
  EXPECT_EQ(ParseByteSize("1000"), 1000);
  EXPECT_EQ(ParseByteSize("1.5kb"), 1500);
  EXPECT_EQ(ParseByteSize("512KiB"), 512 * 1024);
}

TEST(Sizes, RejectsGarbage) {
  for (const char* bad : {"", "MiB", "-5", "12 parsecs", "1..2", "99999999999TiB"}) {
    EXPECT_THROW(ParseByteSize(bad), Error) << bad;
  }
}

TEST(Hash, Sha256KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Hash, Fnv1aMatchesSpecExample) {
  // From ../shared/spec/kv-trace.md: fnv1a32("a") = 3826002220.
  EXPECT_EQ(Fnv1a32("a"), 3826002220u);
  EXPECT_EQ(Fnv1a32(""), 0x811C9DC5u);
}

TEST(Clock, FakeClockIsSettable) {
  FakeClock c(1.5);
  EXPECT_EQ(c.Now(), 1.5);
  c.Advance(0.25);
  EXPECT_EQ(c.Now(), 1.75);
}

}  // namespace
}  // namespace meshnet

#include "util/dtype.h"

namespace meshnet {
namespace {

TEST(Dtype, HalfRoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.482f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), HalfToFloat(DoubleToHalf(f))) << f;
  }
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);           // overflow to inf
  EXPECT_EQ(DoubleToHalf(1.0 + 1.0 / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(DoubleToHalf(1.0 + 3.0 / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(HalfToFloat(0x0001), 5.9604645e-08f);     // smallest subnormal
}

TEST(Dtype, Bf16Rounding) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(3.140625f)), 3.140625f);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82);
}

TEST(Dtype, ParseNames) {
  EXPECT_EQ(ParseKvDtype("float16"), KvDtype::kF16);
  EXPECT_EQ(KvDtypeName(KvDtype::kBF16), "bfloat16");
  EXPECT_THROW(ParseKvDtype("f16"), Error);
  EXPECT_THROW(ParseKvDtype("int8"), Error);
}

}  // namespace
}  // namespace meshnet
