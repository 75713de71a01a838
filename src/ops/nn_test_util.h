// Test helpers of the ops/nn kernel tests: random data and a hand-built
// paged KV cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ops/paged_kv.h"
#include "util/dtype.h"

namespace meshnet::ops {

inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A hand-built paged cache: `n_layers` owned layers, blocks allocated
// separately and listed in a shuffled order (the table is not contiguous).
struct PagedKv {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<uint8_t*> table;
  PagedKvLayer layer;

  PagedKv(int64_t n_positions, int block_tokens, int n_layers, int layer, int n_kv_heads,
          int head_dim, KvDtype dtype) {
    const auto row_bytes = static_cast<size_t>(KvRowBytes(dtype, n_kv_heads, head_dim));
    const size_t block_bytes = 2 * static_cast<size_t>(n_layers) * block_tokens * row_bytes;
    const int64_t n_blocks = (n_positions + block_tokens - 1) / block_tokens;
    storage.resize(static_cast<size_t>(n_blocks));
    for (auto& b : storage) b.assign(block_bytes, 0xCD);
    std::vector<size_t> order(storage.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(3));
    for (size_t i : order) table.push_back(storage[i].data());
    this->layer.blocks = table.data();
    this->layer.block_tokens = block_tokens;
    this->layer.k_offset = static_cast<size_t>(2 * layer) * block_tokens * row_bytes;
    this->layer.v_offset = this->layer.k_offset + static_cast<size_t>(block_tokens) * row_bytes;
    this->layer.row_bytes = row_bytes;
    this->layer.n_kv_heads = n_kv_heads;
    this->layer.head_dim = head_dim;
    this->layer.dtype = dtype;
    this->layer.n_positions = n_positions;
  }
};

}  // namespace meshnet::ops
