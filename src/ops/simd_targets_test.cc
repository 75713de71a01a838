#include "ops/simd_targets.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <string>

#include "util/error.h"

namespace meshnet::ops {
namespace {

TEST(SimdTargets, LeavingTheBestOutRunsTheNextOne) {
  const std::string all = AvailableSimdTargets();
  const std::string best = BestSimdTarget();
  ASSERT_EQ(all.substr(0, best.size()), best);
  if (all.find(' ') == std::string::npos) GTEST_SKIP() << "one target only: " << all;
  DisableSimdTargets(best);
  EXPECT_NE(BestSimdTarget(), best);
  EXPECT_EQ(AvailableSimdTargets(), all.substr(best.size() + 1));
  hwy::DisableTargets(0);
  EXPECT_EQ(BestSimdTarget(), best);
}

TEST(SimdTargets, UnknownNamesAndLeavingNothingAreErrors) {
  const std::string best = BestSimdTarget();
  try {
    DisableSimdTargets("AVX2,NOT_A_TARGET");
    FAIL() << "an unknown target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NOT_A_TARGET"), std::string::npos) << e.what();
  }
  std::string all = AvailableSimdTargets();
  for (char& c : all) c = c == ' ' ? ',' : c;
  EXPECT_THROW(DisableSimdTargets(all), Error);
  EXPECT_EQ(BestSimdTarget(), best) << "a refused call changes nothing";
}

}  // namespace
}  // namespace meshnet::ops
