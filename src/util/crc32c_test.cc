#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace meshnet {
namespace {

// Known vectors: the "check" value of CRC-32C and RFC 3720 appendix B.4.
TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string_view("")), 0u);
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xff);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(buf.data(), buf.size()), 0x113FDB5Cu);
  // Same vectors through the portable path.
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtendPortable(0, buf.data(), buf.size()), 0x113FDB5Cu);
}

TEST(Crc32cTest, LibraryAndReferenceAgreeOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(4096 + 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 63, 64, 100, 255, 256, 1023, 1024, 4096}) {
      EXPECT_EQ(Crc32c(data.data() + offset, n), Crc32cExtendPortable(0, data.data() + offset, n))
          << "offset " << offset << " n " << n;
    }
  }
}

TEST(Crc32cTest, ExtendEqualsOneShot) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    const uint32_t head = Crc32c(s.data(), cut);
    EXPECT_EQ(Crc32cExtend(head, s.data() + cut, s.size() - cut), Crc32c(s));
    EXPECT_EQ(Crc32cExtendPortable(Crc32cExtendPortable(0, s.data(), cut), s.data() + cut,
                                   s.size() - cut),
              Crc32c(s));
  }
}

TEST(Crc32cTest, DetectsASingleBitFlip) {
  std::vector<uint8_t> data(3072, 0x5a);
  const uint32_t good = Crc32c(data.data(), data.size());
  for (size_t byte : {0, 1, 1535, 3071}) {
    for (int bit = 0; bit < 8; ++bit) {
      data[byte] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(Crc32c(data.data(), data.size()), good);
      data[byte] ^= static_cast<uint8_t>(1 << bit);
    }
  }
}

}  // namespace
}  // namespace meshnet
