// MatMul: prepares activations (quantized for Q* weights), then splits the
// weight rows over the pool in groups of 4 (the decode tile height) and calls
// the dispatched per-target kernels in matmul_kernels.cc.
#include "ops/matmul.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/matmul_kernels.h"
#include "ops/quantize.h"

namespace meshnet::ops {

namespace {

constexpr int64_t kRowGroup = 4;
// Below this much weight traffic (bytes x tokens) waking workers costs more
// than it saves (tiny models, tests): run on the calling thread.
constexpr int64_t kMinParallelWork = 64 << 10;
constexpr size_t kAlign = 64;

uint8_t* AlignUp(void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<uint8_t*>((v + kAlign - 1) & ~(uintptr_t{kAlign} - 1));
}

size_t RoundUp(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

template <class Fn>
void ForRows(ThreadPool* pool, int64_t n, Fn&& fn, int64_t min_chunk) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn, min_chunk);
  } else {
    fn(0, n);
  }
}

}  // namespace

bool MatMulQuantizesActivations(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ4_K ||
         type == GgmlType::kQ6_K;
}

size_t MatMulScratchBytes(GgmlType type, int64_t n_tokens, int64_t cols) {
  if (!MatMulQuantizesActivations(type)) return 0;
  const auto nt = static_cast<size_t>(n_tokens);
  const auto nb = static_cast<size_t>(cols / 32);
  return kAlign + RoundUp(nt * static_cast<size_t>(cols) * sizeof(int16_t)) +
         2 * RoundUp(nt * nb * sizeof(float));
}

void MatMul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, void* scratch,
            ThreadPool* pool) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  if (RowBytes(w.type, w.cols) * w.rows * n_tokens < kMinParallelWork) pool = nullptr;
  const int64_t groups = (w.rows + kRowGroup - 1) / kRowGroup;
  // Enough groups per chunk that a chunk streams a few hundred KB in decode.
  const int64_t min_chunk = n_tokens == 1 ? 8 : 1;
  if (!MatMulQuantizesActivations(w.type)) {
    ForRows(
        pool, groups,
        [&](int64_t g0, int64_t g1) {
          internal::MatMulFloatRows(w, g0 * kRowGroup, std::min(w.rows, g1 * kRowGroup), x,
                                    n_tokens, y);
        },
        min_chunk);
    return;
  }
  const auto nt = static_cast<size_t>(n_tokens);
  const auto nb = static_cast<size_t>(w.cols / 32);
  uint8_t* p = AlignUp(scratch);
  auto* q = reinterpret_cast<int16_t*>(p);
  p += RoundUp(nt * static_cast<size_t>(w.cols) * sizeof(int16_t));
  auto* d = reinterpret_cast<float*>(p);
  p += RoundUp(nt * nb * sizeof(float));
  auto* dxs = reinterpret_cast<float*>(p);
  if (n_tokens == 1 || pool == nullptr) {
    internal::QuantizeActs(x, w.cols, 0, n_tokens, q, d, dxs);
  } else {
    pool->ParallelFor(n_tokens, [&](int64_t t0, int64_t t1) {
      internal::QuantizeActs(x, w.cols, t0, t1, q, d, dxs);
    });
  }
  const internal::QuantActs acts{q, d, dxs, w.cols};
  ForRows(
      pool, groups,
      [&](int64_t g0, int64_t g1) {
        internal::MatMulQuantRows(w, g0 * kRowGroup, std::min(w.rows, g1 * kRowGroup), acts,
                                  n_tokens, y);
      },
      min_chunk);
}

// ---------------------------------------------------------------- references

void QuantizeActivationsReference(const float* x, int64_t cols, int16_t* q, float* d) {
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int i = 0; i < 32; ++i) {
      q[b * 32 + i] = static_cast<int16_t>(std::nearbyint(x[b * 32 + i] * inv));
    }
    d[b] = scale;
  }
}

namespace {

void ReferenceImpl(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
                   bool quantized_acts) {
  const int64_t row_bytes = RowBytes(w.type, w.cols);
  std::vector<float> wrow(static_cast<size_t>(w.cols));
  std::vector<double> xs(static_cast<size_t>(n_tokens * w.cols));
  if (quantized_acts && MatMulQuantizesActivations(w.type)) {
    std::vector<int16_t> q(static_cast<size_t>(w.cols));
    std::vector<float> d(static_cast<size_t>(w.cols / 32));
    for (int64_t t = 0; t < n_tokens; ++t) {
      QuantizeActivationsReference(x + t * w.cols, w.cols, q.data(), d.data());
      for (int64_t i = 0; i < w.cols; ++i)
        xs[t * w.cols + i] = static_cast<double>(q[i]) * d[i / 32];
    }
  } else {
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = x[i];
  }
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + r * row_bytes, w.cols, wrow.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0.0;
      for (int64_t i = 0; i < w.cols; ++i) sum += wrow[i] * xs[t * w.cols + i];
      y[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace

void MatMulReference(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  ReferenceImpl(w, x, n_tokens, y, /*quantized_acts=*/false);
}

void MatMulReferenceQuantized(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  ReferenceImpl(w, x, n_tokens, y, /*quantized_acts=*/true);
}

}  // namespace meshnet::ops
