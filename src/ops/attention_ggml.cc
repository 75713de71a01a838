// llama.cpp's CPU flash attention over an F16 KV cache, reproduced rounding
// step for rounding step (see AttentionConfig::ggml_f16 in nn.h). Read from
// ggml-cpu's ggml_compute_forward_flash_attn_ext_f16 and vec.h (c392e50, x86
// AVX2 build): per query row,
//   Q is rounded to f16 once;
//   s = f32(ggml_vec_dot_f16(K, Q)) * scale, where the dot keeps 4 x 8-lane
//     f32 FMA accumulators over blocks of 32, reduces them pairwise, and adds
//     the remaining products (exact in f32) in double;
//   keys are visited in order with a running max M (f32) and sum S (f32):
//     s > M: M = s, ms = expf(M_old - M), O = f16(O * ms), vs = 1
//     else:  vs = expf(s - M)
//     O = f16(O + V * vs) elementwise (f32 fused multiply-add, then f16)
//     S = S * ms + vs
//   out = f32(O) * (1 / S).
// Deliberately scalar: the per-step f16 rounding is the point, every step is
// elementwise except the dot, and the mode exists for bit-parity with
// llama.cpp, not speed (head_dim is tiny where it matters). It is therefore
// its own reference; nn_test checks it against an independent derivation.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/half_inline.h"
#include "ops/nn.h"
#include "ops/nn_kernels.h"
#include "util/dtype.h"

namespace meshnet::ops::internal {
namespace {

float H2F(uint16_t h) { return HalfToFloatFast(h); }

}  // namespace

// ggml_vec_dot_f16 (AVX2 lane structure, see above).
float GgmlDotF16(const uint16_t* x, const uint16_t* y, int n) {
  constexpr int kArr = 4, kLanes = 8, kStep = kArr * kLanes;
  const int np = n & ~(kStep - 1);
  double sum = 0.0;
  if (np > 0) {
    float acc[kArr][kLanes] = {};
    for (int i = 0; i < np; i += kStep) {
      for (int j = 0; j < kArr; ++j) {
        for (int k = 0; k < kLanes; ++k) {
          const int e = i + j * kLanes + k;
          acc[j][k] = std::fma(H2F(x[e]), H2F(y[e]), acc[j][k]);
        }
      }
    }
    float r[kLanes];
    for (int k = 0; k < kLanes; ++k) r[k] = (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]);
    float t[4];
    for (int k = 0; k < 4; ++k) t[k] = r[k] + r[k + 4];
    sum = static_cast<double>((t[0] + t[1]) + (t[2] + t[3]));
  }
  for (int i = np; i < n; ++i) sum += static_cast<double>(H2F(x[i]) * H2F(y[i]));
  return static_cast<float>(sum);
}

namespace {

// One query row q (head_dim floats) of KV head `head_off` bytes into each row.
void AttendRow(const AttentionArgs& a, const float* q, size_t head_off, int64_t n_pos, float* out) {
  const int hd = a.head_dim;
  uint16_t qh[kMaxHeadDim], o[kMaxHeadDim];
  for (int i = 0; i < hd; ++i) qh[i] = FloatToHalfFast(q[i]);
  std::fill(o, o + hd, uint16_t{0});
  float m = -INFINITY, s_sum = 0.0f;
  for (int64_t p = 0; p < n_pos; ++p) {
    const auto* k = reinterpret_cast<const uint16_t*>(a.kv->KRow(p) + head_off);
    const auto* v = reinterpret_cast<const uint16_t*>(a.kv->VRow(p) + head_off);
    const float s = GgmlDotF16(k, qh, hd) * a.scale;
    float ms = 1.0f, vs = 1.0f;
    if (s > m) {
      ms = std::exp(m - s);
      m = s;
      for (int i = 0; i < hd; ++i) o[i] = FloatToHalfFast(H2F(o[i]) * ms);
    } else {
      vs = std::exp(s - m);
    }
    for (int i = 0; i < hd; ++i) o[i] = FloatToHalfFast(std::fma(H2F(v[i]), vs, H2F(o[i])));
    s_sum = std::fma(s_sum, ms, vs);
  }
  const float inv = 1.0f / s_sum;
  for (int i = 0; i < hd; ++i) out[i] = H2F(o[i]) * inv;
}

}  // namespace

void AttentionItemsGgmlF16(const AttentionArgs& a, int64_t begin, int64_t end) {
  const int n_kv = a.kv->n_kv_heads;
  const int group = a.n_heads / n_kv;
  const int hd = a.head_dim;
  const int64_t q_stride = static_cast<int64_t>(a.n_heads) * hd;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / n_kv;
    const int g = static_cast<int>(item % n_kv);
    const size_t head_off = static_cast<size_t>(g) * hd * sizeof(uint16_t);
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const int64_t off = t * q_stride + static_cast<int64_t>(h) * hd;
      AttendRow(a, a.q + off, head_off, a.start_pos + t + 1, a.out + off);
    }
  }
}

}  // namespace meshnet::ops::internal
