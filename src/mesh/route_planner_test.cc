#include "mesh/route_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "util/error.h"

namespace meshnet::mesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RouteCandidate C(std::string name, int a, int b, int64_t live = 0, int64_t free_bytes = 0) {
  return RouteCandidate{std::move(name), a, b, live, free_bytes};
}

std::vector<std::string> Names(const std::vector<RouteCandidate>& c, std::vector<size_t> idx) {
  std::vector<std::string> out;
  for (size_t i : idx) out.push_back(c[i].name);
  return out;
}

TEST(RoutePlannerTest, ChainsContiguousRanges) {
  std::vector<RouteCandidate> c = {C("c", 4, 4), C("a", 0, 1), C("b", 2, 3)};
  EXPECT_THAT(Names(c, PlanRoute(c, 5)), ElementsAre("a", "b", "c"));
}

TEST(RoutePlannerTest, PrefersFewerHops) {
  std::vector<RouteCandidate> c = {C("a", 0, 1), C("b", 2, 3), C("c", 4, 4), C("big", 2, 4, 100)};
  EXPECT_THAT(Names(c, PlanRoute(c, 5)), ElementsAre("a", "big"));
  c.push_back(C("whole", 0, 4, 1000));
  EXPECT_THAT(Names(c, PlanRoute(c, 5)), ElementsAre("whole"));
}

TEST(RoutePlannerTest, TieBreaksOnLiveSessionsThenFreeKvThenName) {
  std::vector<RouteCandidate> c = {C("a", 0, 1), C("m1", 2, 3, 5, 100), C("m2", 2, 3, 2, 10),
                                   C("t", 4, 4)};
  EXPECT_THAT(Names(c, PlanRoute(c, 5)), ElementsAre("a", "m2", "t"));
  c[1].live_sessions = 2;  // equal load: more free KV wins
  EXPECT_THAT(Names(c, PlanRoute(c, 5)), ElementsAre("a", "m1", "t"));
  c[1].kv_bytes_free = 10;  // all equal: smallest name
  EXPECT_THAT(Names(c, PlanRoute(c, 5)), ElementsAre("a", "m1", "t"));
}

TEST(RoutePlannerTest, DeterministicUnderPermutation) {
  std::vector<RouteCandidate> c = {C("n3", 0, 2), C("n1", 0, 2),    C("n2", 3, 5),
                                   C("n0", 3, 5), C("n5", 0, 5, 1), C("n4", 0, 0)};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(c.begin(), c.end(), rng);
    // Two hops at 0 live sessions would tie with one hop only if hops were not first.
    EXPECT_THAT(Names(c, PlanRoute(c, 6)), ElementsAre("n5"));
  }
  for (auto& x : c) {
    if (x.name == "n5") x.end_layer = 4;  // no longer a single hop
  }
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(c.begin(), c.end(), rng);
    EXPECT_THAT(Names(c, PlanRoute(c, 6)), ElementsAre("n1", "n0"));
  }
}

TEST(RoutePlannerTest, NamesUncoveredLayers) {
  std::vector<RouteCandidate> c = {C("a", 0, 1), C("c", 5, 5), C("d", 8, 9)};
  try {
    PlanRoute(c, 10);
    FAIL() << "expected no route";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnavailable);
    EXPECT_THAT(e.what(), HasSubstr("layers 2-4, 6-7 are served by no live node"));
  }
}

TEST(RoutePlannerTest, ReportsRangesThatDoNotChain) {
  std::vector<RouteCandidate> c = {C("a", 0, 3), C("b", 2, 5), C("c", 6, 7)};
  try {
    PlanRoute(c, 8);
    FAIL() << "expected no route";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnavailable);
    EXPECT_THAT(e.what(), HasSubstr("layers 4-7 cannot be reached"));
  }
}

TEST(RoutePlannerTest, IgnoresInvalidRangesAndEmptyInput) {
  std::vector<RouteCandidate> c = {C("bad", 0, 9), C("neg", -1, 2)};
  EXPECT_THROW(PlanRoute(c, 5), Error);
  EXPECT_THROW(PlanRoute({}, 5), Error);
  EXPECT_THROW(PlanRoute(c, 0), Error);
  EXPECT_EQ(DescribeLayers({0, 1, 2, 4, 7, 8}), "0-2, 4, 7-8");
}

}  // namespace
}  // namespace meshnet::mesh
