// Batch invariance of the matmul kernels: a token's output row is bit-identical
// whether the token is multiplied alone (the decode matvec), or as one row of
// a batch of 2, 5, 16 or 33 tokens at any position (token tiles of 4 and 8,
// their remainders, packed groups of 16 weight rows), on one thread or split
// over a pool. Every weight type, every SIMD target this binary has and the
// CPU supports (forced in turn); the targets it cannot run are named in the
// output, so a run on a smaller CPU says what it did not check.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ops/hwy_test_util.h"
#include "ops/matmul.h"
#include "ops/matmul_test_util.h"
#include "util/thread_pool.h"

namespace meshnet::ops {
namespace {

constexpr GgmlType kAllTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,   GgmlType::kQ4_0,
    GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kQ2_K,
    GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,   GgmlType::kIQ4_XS};

using testing::MakeWeights;
using testing::Pack;
using testing::RandomActs;
using testing::Weights;

std::vector<float> Multiply(const WeightMatrix& w, const float* x, int64_t n, ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(n * w.rows));
  std::vector<uint8_t> scratch(MatMulScratchBytes(w.type, n, w.cols));
  MatMul(w, x, n, y.data(), scratch.data(), pool);
  return y;
}

// For each token of a 33-token set: its row alone, then inside batches of
// 2, 5, 16 and 33 (other tokens around it), bit for bit.
void CheckInvariant(const WeightMatrix& w, ThreadPool* pool) {
  const char* name = GgmlTypeInfoOf(w.type).name.data();
  constexpr int64_t kTokens = 33;
  const std::vector<float> x =
      RandomActs(kTokens, w.cols, static_cast<uint32_t>(w.rows * 7 + w.cols));
  std::vector<std::vector<float>> solo(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) solo[t] = Multiply(w, x.data() + t * w.cols, 1, nullptr);
  for (int64_t n : {2, 5, 16, 33}) {
    for (int64_t first = 0; first + n <= kTokens; first += (n == kTokens ? n : 7)) {
      const std::vector<float> y = Multiply(w, x.data() + first * w.cols, n, pool);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(0, std::memcmp(y.data() + i * w.rows, solo[first + i].data(),
                                 static_cast<size_t>(w.rows) * sizeof(float)))
            << name << " rows=" << w.rows << " cols=" << w.cols
            << " packed=" << (w.packed != nullptr) << ": token " << first + i << " as row " << i
            << " of " << n << " differs from alone"
            << " (threads " << (pool ? pool->num_threads() : 1) << ")";
      }
    }
  }
}

TEST(BatchInvariance, EveryTypeEveryTargetEveryBatchSize) {
  ThreadPool pool(2);
  ForEachSimdTarget([&] {
    for (GgmlType type : kAllTypes) {
      const int64_t block = GgmlTypeInfoOf(type).block_elems;
      // Rows: a packed group of 16 and a ragged rest (35 = 2 x 16 + 3), and
      // a small odd matrix; columns: a multiple of 64 (packed) and, for the
      // 32-element formats, a ragged group of blocks (352 = 11 blocks).
      std::vector<std::pair<int64_t, int64_t>> shapes = {{35, 768}, {3, 256}};
      if (block == 32) shapes.push_back({19, 352});
      if (block == 1) shapes.push_back({19, 100});  // a ragged vector tail
      for (auto [rows, cols] : shapes) {
        for (bool packed : {false, true}) {
          Weights m = MakeWeights(type, rows, cols, static_cast<uint32_t>(rows + cols));
          std::vector<uint8_t> packed_bytes;
          if (packed) Pack(m, packed_bytes);
          CheckInvariant(m.w, nullptr);
          CheckInvariant(m.w, &pool);
          if (HasFatalFailure()) return;
        }
      }
    }
  });
}

// Float weights at every alignment within 64 bytes: the result must not
// depend on where the row starts relative to a vector (a decode kernel that
// peels to an aligned boundary would otherwise sum in another order than a
// batched tile).
TEST(BatchInvariance, FloatRowsAtEveryAlignment) {
  ForEachSimdTarget([&] {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      const int64_t elem = RowBytes(type, 1);
      const Weights m = MakeWeights(type, 5, 515, 3);
      for (int64_t off = 0; off < 64; off += elem) {
        std::vector<uint8_t> buf(m.bytes.size() + 128);
        uint8_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) + off;
        std::memcpy(base, m.bytes.data(), m.bytes.size());
        CheckInvariant(WeightMatrix{type, base, 5, 515}, nullptr);
        if (HasFatalFailure()) return;
      }
    }
  });
}

// Says which of the x86 targets this binary carries were run and which the
// CPU could not (Highway cannot emulate a wider x86 target on a narrower CPU).
TEST(BatchInvariance, ReportsTheTargetsItRan) {
  std::string ran, skipped;
  const int64_t supported = hwy::SupportedTargets();
  for (int64_t target :
       {int64_t{HWY_AVX3_DL}, int64_t{HWY_AVX3}, int64_t{HWY_AVX2}, int64_t{HWY_SSE4},
        int64_t{HWY_SSSE3}, int64_t{HWY_EMU128}, int64_t{HWY_SCALAR}}) {
    if ((HWY_TARGETS & target) == 0) continue;  // not compiled into this binary
    std::string& into = (supported & target) != 0 ? ran : skipped;
    into += std::string(into.empty() ? "" : " ") + hwy::TargetName(target);
  }
  std::printf("batch invariance checked on: %s\n", ran.c_str());
  if (!skipped.empty()) std::printf("NOT checked (this CPU lacks them): %s\n", skipped.c_str());
  EXPECT_FALSE(ran.empty());
}

}  // namespace
}  // namespace meshnet::ops
