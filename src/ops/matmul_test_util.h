// Test helpers shared by the matmul tests: quantized matrices of normal
// weights (with their exact decoded values), activations with an outlier, and
// the packed layout.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ops/matmul.h"
#include "ops/matmul_kernels.h"
#include "ops/quantize.h"

namespace meshnet::ops::testing {

struct Weights {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  std::vector<float> dequant;  // (rows, cols) exact decoded values
};

inline Weights MakeWeights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  Weights out;
  const int64_t rb = RowBytes(type, cols);
  out.bytes.resize(static_cast<size_t>(rb * rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    // Rows with different magnitudes, and an all-zero row.
    const float scale = (r % 7 == 3) ? 0.0f : 1.0f + static_cast<float>(r % 5);
    for (auto& v : row) v = scale * dist(rng);
    QuantizeRow(type, row.data(), cols, out.bytes.data() + r * rb);
  }
  out.w = WeightMatrix{type, out.bytes.data(), rows, cols};
  out.dequant.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(type, out.bytes.data() + r * rb, cols, out.dequant.data() + r * cols);
  }
  return out;
}

inline std::vector<float> RandomActs(int64_t n_tokens, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));
  for (auto& v : x) v = dist(rng);
  if (cols >= 64) x[5] = 25.0f;  // an outlier coarsens one activation block
  return x;
}

// wt with PackWeights' layout in `packed_bytes` (when the type has one and w
// has at least 16 rows): written whatever the current target (the layout is
// plain C++); targets without a packed kernel ignore it.
inline void Pack(Weights& wt, std::vector<uint8_t>& packed_bytes) {
  const int64_t group = internal::PackedGroupBytes(wt.w.type, wt.w.cols);
  if (group == 0 || wt.w.rows < 16) return;
  packed_bytes.resize(static_cast<size_t>(wt.w.rows / 16 * group) + 64);
  void* at = packed_bytes.data() + (64 - reinterpret_cast<uintptr_t>(packed_bytes.data()) % 64);
  PackWeights(wt.w, at);
  wt.w.packed = at;
}

}  // namespace meshnet::ops::testing
