// Layer ranges of shards: parsing "A-B" and splits "0-1,2-3,4-4".
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace meshnet::node {

using LayerRange = std::pair<int, int>;  // inclusive

// "A-B" -> {A, B} with 0 <= A <= B. Throws kInvalidArgument naming the problem.
LayerRange ParseLayerRange(const std::string& text);
// "0-1,2-3,4-4" -> {{0,1},{2,3},{4,4}}; the ranges must be contiguous, start
// at 0 and end at total_layers-1. Throws kInvalidArgument naming the problem.
std::vector<LayerRange> ParseSplit(const std::string& text, int total_layers);
// n_shards nearly equal contiguous ranges (earlier shards get the extra layer).
std::vector<LayerRange> EvenSplit(int n_shards, int total_layers);

}  // namespace meshnet::node
