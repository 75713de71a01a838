// MatMulGgml: ggml's CPU vec_dot arithmetic for the weight types of the Q5_K
// presets in tests/data/quant (see ops/matmul.h). Derived from ggml-cpu
// c392e50 (x86 AVX2 + FMA): activations are quantized per 32-block to q8
// (d = amax / 127 rounded to f16, q = nearest-even of x * 127 / amax, q8_1's
// s = f16(d * sum q)) or rounded to f16; a quantized row dot keeps 8 f32
// lanes, lane k taking the exact integer sum of elements 4k..4k+3 of each
// block times the f32 product of the two block scales by FMA, reduced by the
// 256-bit horizontal sum; Q5_1's offsets add m * s in one more FMA chain.
// llamafile's sgemm (prompt steps) computes Q8_0 in the same order. Scalar:
// an oracle for parity, not a fast path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/half_inline.h"
#include "ops/matmul.h"
#include "ops/nn_kernels.h"
#include "ops/quantize.h"
#include "util/thread_pool.h"

namespace meshnet::ops {
namespace {

struct Q8Act {
  std::vector<int8_t> q;
  std::vector<float> d, s;  // per block, f16-rounded
  std::vector<uint16_t> h;  // f16 activations (F16 weights)
};

void QuantizeAct(const float* x, int64_t cols, Q8Act& a) {
  const int64_t nb = cols / 32;
  a.q.resize(static_cast<size_t>(cols));
  a.d.resize(static_cast<size_t>(nb));
  a.s.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(x[b * 32 + i] * id));
      a.q[b * 32 + i] = static_cast<int8_t>(q);
      sum += q;
    }
    a.d[b] = HalfToFloatFast(FloatToHalfFast(d));
    a.s[b] = HalfToFloatFast(FloatToHalfFast(d * static_cast<float>(sum)));
  }
}

float F16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloatFast(h);
}

float HSum8(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// Lane k of one block: the exact sum of products of elements 4k..4k+3.
template <typename T>
void BlockLanes(const T* wq, const int8_t* aq, float scale, float* acc) {
  for (int k = 0; k < 8; ++k) {
    int isum = 0;
    for (int e = 4 * k; e < 4 * k + 4; ++e) isum += static_cast<int>(wq[e]) * aq[e];
    acc[k] = std::fma(static_cast<float>(isum), scale, acc[k]);
  }
}

float DotQ8_0(const uint8_t* row, int64_t nb, const Q8Act& a) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 34;
    const float d = F16At(blk) * a.d[b];
    BlockLanes(reinterpret_cast<const int8_t*>(blk + 2), a.q.data() + b * 32, d, acc);
  }
  return HSum8(acc);
}

float DotQ5_1(const uint8_t* row, int64_t nb, const Q8Act& a) {
  float acc[8] = {};
  float summs = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 24;
    uint32_t qh;
    std::memcpy(&qh, blk + 4, 4);
    uint8_t wq[32];
    for (int j = 0; j < 16; ++j) {
      wq[j] = static_cast<uint8_t>((blk[8 + j] & 0x0f) | (((qh >> j) & 1u) << 4));
      wq[j + 16] = static_cast<uint8_t>((blk[8 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
    summs = std::fma(F16At(blk + 2), a.s[b], summs);
    BlockLanes(wq, a.q.data() + b * 32, F16At(blk) * a.d[b], acc);
  }
  return HSum8(acc) + summs;
}

}  // namespace

bool MatMulGgmlSupports(GgmlType type) {
  return type == GgmlType::kF16 || type == GgmlType::kQ8_0 || type == GgmlType::kQ5_1;
}

void MatMulGgml(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
                ThreadPool* pool) {
  const int64_t row_bytes = RowBytes(w.type, w.cols);
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t t = 0; t < n_tokens; ++t) {
    static thread_local Q8Act tls;  // grows once per thread and shape
    Q8Act& a = tls;                 // (the workers below read this thread's copy)
    const float* xt = x + t * w.cols;
    if (w.type == GgmlType::kF16) {
      a.h.resize(static_cast<size_t>(w.cols));
      for (int64_t i = 0; i < w.cols; ++i) a.h[i] = FloatToHalfFast(xt[i]);
    } else {
      QuantizeAct(xt, w.cols, a);
    }
    auto rows = [&, act = &a](int64_t r0, int64_t r1) {
      const Q8Act& a = *act;
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = base + r * row_bytes;
        float v = 0.0f;
        if (w.type == GgmlType::kF16) {
          v = internal::GgmlDotF16(reinterpret_cast<const uint16_t*>(row), a.h.data(),
                                   static_cast<int>(w.cols));
        } else if (w.type == GgmlType::kQ8_0) {
          v = DotQ8_0(row, w.cols / 32, a);
        } else {
          v = DotQ5_1(row, w.cols / 32, a);
        }
        y[t * w.rows + r] = v;
      }
    };
    ParallelForOrInline(pool, w.rows, rows, 16);
  }
}

}  // namespace meshnet::ops
