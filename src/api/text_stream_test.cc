#include "api/text_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace meshnet::api {
namespace {

std::string Feed(TextStream& s, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += s.Push(p);
  return out + s.Finish();
}

TEST(TextStream, StopMatchedAcrossPiecesIsNeverEmitted) {
  TextStream s({"o W"});
  EXPECT_EQ(Feed(s, {"Hel", "lo", " Wo", "rld"}), "Hell");
  EXPECT_TRUE(s.stopped());
}

TEST(TextStream, HeldBackPrefixIsReleasedWhenItCannotMatch) {
  TextStream s({"xyz"});
  EXPECT_EQ(s.Push("ab x"), "ab ");
  EXPECT_EQ(s.Push("y"), "");
  EXPECT_EQ(s.Push("q"), "xyq");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.Finish(), "");
}

TEST(TextStream, HeldPrefixAtTheEndIsFlushed) {
  TextStream s({"END"});
  EXPECT_EQ(s.Push("the E"), "the ");
  EXPECT_EQ(s.Finish(), "E");
}

TEST(TextStream, EarliestOfSeveralStopsWins) {
  TextStream s({"cd", "b"});
  EXPECT_EQ(Feed(s, {"abcd"}), "a");
}

TEST(TextStream, Utf8CharacterSplitOverPiecesWaitsForItsLastByte) {
  TextStream s({});
  EXPECT_EQ(s.Push("caf\xc3"), "caf");
  EXPECT_EQ(s.Push("\xa9!"), "\xc3\xa9!");
}

// Every way of cutting a text into three pieces gives the same visible text:
// the text up to its first stop match.
TEST(TextStream, OutputIsIndependentOfPieceBoundaries) {
  const std::string text = "Once upon a t\xc3\xa9me, the end. More";
  const std::vector<std::string> stops = {"the end", "\xc3\xa9me!"};
  const std::string want = text.substr(0, text.find("the end"));
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      TextStream s(stops);
      std::string got = Feed(s, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      ASSERT_EQ(got, want) << "cuts at " << i << ", " << j;
      ASSERT_TRUE(s.stopped());
    }
  }
}

}  // namespace
}  // namespace meshnet::api
