// The llama.cpp-parity ops (ops/nn.h, ops/matmul.h: *Ggml): each agrees with
// its reference to within its rounding, and MatMulGgml's quantized dots
// with the reference over the same quantized activations. Bit parity with
// llama.cpp itself is checked end to end by quant_generation_test.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/matmul.h"
#include "ops/nn.h"
#include "ops/quantize.h"
#include "util/thread_pool.h"

namespace meshnet::ops {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << i;
}

TEST(GgmlParity, RmsNormRopeSwiGluMatchTheirReferences) {
  const int64_t rows = 3, dim = 172;  // 172: SwiGLU's libm tail after 21 groups of 8
  const auto x = Random(rows * dim, 1), w = Random(dim, 2), up = Random(rows * dim, 3);
  std::vector<float> got(x.size()), want(x.size());
  RmsNormGgml(x.data(), w.data(), rows, dim, 1e-5f, got.data());
  RmsNormReference(x.data(), w.data(), rows, dim, 1e-5f, want.data());
  ExpectNear(got, want, 1e-5);
  SwiGluGgml(x.data(), up.data(), rows, dim, got.data());
  SwiGluReference(x.data(), up.data(), rows * dim, want.data());
  ExpectNear(got, want, 1e-5);
  for (bool neox : {false, true}) {
    const RopeConfig cfg{8, 10000.0f, 1.0f, neox, nullptr};
    auto a = Random(4 * 2 * 8, 4), b = a;
    RopeGgml(a.data(), 4, 2, 8, cfg, 300);
    RopeReference(b.data(), 4, 2, 8, cfg, 300);
    ExpectNear(a, b, 1e-4);  // f32 angles at position ~300
  }
}

// F16, Q8_0 and Q5_1 rows (the types MatMulGgml covers), several tokens,
// pooled and not: close to MatMulReferenceQuantized, the same either way.
TEST(GgmlParity, MatMulMatchesTheReferenceOnItsTypes) {
  ThreadPool pool(2);
  const int64_t rows = 40, cols = 160, n = 3;
  const auto wf = Random(rows * cols, 5), x = Random(n * cols, 6);
  for (GgmlType t : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ5_1}) {
    ASSERT_TRUE(MatMulGgmlSupports(t));
    std::vector<uint8_t> data(static_cast<size_t>(RowBytes(t, cols) * rows));
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRow(t, wf.data() + r * cols, cols, data.data() + r * RowBytes(t, cols));
    }
    const WeightMatrix w{t, data.data(), rows, cols};
    std::vector<float> got(n * rows), pooled(n * rows), want(n * rows);
    MatMulGgml(w, x.data(), n, got.data(), nullptr);
    MatMulGgml(w, x.data(), n, pooled.data(), &pool);
    MatMulReferenceQuantized(w, x.data(), n, want.data());
    EXPECT_EQ(got, pooled);
    ExpectNear(got, want, 1e-3);
  }
  EXPECT_FALSE(MatMulGgmlSupports(GgmlType::kQ4_K));
}

}  // namespace
}  // namespace meshnet::ops
