// llama.cpp's default CPU attention over an F16 KV cache (no flash
// attention: llm_build_kqv's mul_mat -> soft_max_ext -> mul_mat), reproduced
// rounding step for rounding step (AttentionConfig::ggml_f16 in nn.h).
// Derived by reading ggml-cpu (c392e50, x86 AVX2 + F16C + FMA build) and
// checked against llama.cpp's greedy text (tests/data/quant). Per query row:
//   Q is rounded to f16 (mul_mat converts src1 to F16, F16's vec_dot_type);
//   s_p = f32 dot(K_p, Q) over head_dim: a single-token step runs
//     ggml_vec_dot_f16 (4 x 8-lane f32 FMA accumulators over blocks of 32,
//     reduced pairwise, the rest added in double); a step of >= 2 tokens
//     runs llamafile's tinyBLAS (one 8-lane FMA accumulator, then a
//     horizontal sum) when head_dim % 8 == 0;
//   w_p = s_p * scale; positions after the row's own are masked (-inf);
//   softmax: M = max w; e_p = ggml_v_expf(w_p - M) (ARM's optimized-routines
//     polynomial, not libm); S = sum over 8-position groups (each summed in
//     f32 as a tree) accumulated in double; P_p = e_p * float(1 / S);
//   P is rounded to f16 and out_i = dot(V_i, P) over positions, V read as the
//     transposed cache: the KV length is padded to a multiple of 32 (zero
//     probabilities), so ggml_vec_dot_f16 keeps position p in lane p % 32,
//     and tinyBLAS (>= 2 tokens, head_dim % 4 == 0) in lane p % 8.
// Scalar: every rounding step is the point; SIMD would have to keep ggml's
// lane assignment and the per-lane exp special cases. nn_test checks the lane
// orders and the exp on hand-built cases, and closeness to the reference.
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

// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)): the 256-bit horizontal
// sum of tinyBLAS and of ggml_vec_soft_max_f32.
float HSum8(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// ggml_vec_dot_f16's final reduction of its 4 x 8 lanes (acc[j * 8 + k]).
float Reduce32(const float* acc) {
  float t[4];
  for (int k = 0; k < 4; ++k) {
    const float r0 = (acc[k] + acc[16 + k]) + (acc[8 + k] + acc[24 + k]);
    const float r4 = (acc[4 + k] + acc[20 + k]) + (acc[12 + k] + acc[28 + k]);
    t[k] = r0 + r4;
  }
  return (t[0] + t[1]) + (t[2] + t[3]);
}

uint32_t Bits(float f) { return FloatBits(f); }
float FromBits(uint32_t b) { return BitsFloat(b); }

}  // namespace

// ggml_vec_dot_f16 (AVX2 lane structure, see above).
float GgmlDotF16(const uint16_t* x, const uint16_t* y, int n) {
  constexpr int kStep = 32;
  const int np = n & ~(kStep - 1);
  double sum = 0.0;
  if (np > 0) {
    float acc[kStep] = {};
    for (int i = 0; i < np; i += kStep) {
      for (int e = 0; e < kStep; ++e) acc[e] = std::fma(H2F(x[i + e]), H2F(y[i + e]), acc[e]);
    }
    sum = static_cast<double>(Reduce32(acc));
  }
  for (int i = np; i < n; ++i) sum += static_cast<double>(H2F(x[i]) * H2F(y[i]));
  return static_cast<float>(sum);
}

// tinyBLAS's F16 dot (n % 8 == 0): one 8-lane FMA accumulator.
float TinyBlasDotF16(const uint16_t* x, const uint16_t* y, int n) {
  float acc[8] = {};
  for (int i = 0; i < n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] = std::fma(H2F(x[i + k]), H2F(y[i + k]), acc[k]);
  }
  return HSum8(acc);
}

// ggml_v_expf, one lane: exp(x) = 2^n * (1 + j) with n = round(x / ln 2)
// (by the 1.5 * 2^23 shift), b = x - n ln 2 in two parts, j a degree-5
// polynomial in b; |n| > 126 scales in two steps, |n| > 192 saturates.
float GgmlExpf(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = Bits(z) << 23;
  const float k = FromBits(e + Bits(1.0f));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, 0x1.ffffecp-1f * b);
  const float an = std::fabs(n);
  if (!(an > 126.0f)) return std::fma(k, j, k);
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = FromBits(g + 0x7f000000u);
  const float s2 = FromBits(e - g);
  if (an > 192.0f) return s1 * s1;
  return std::fma(s2, j, s2) * s1;
}

namespace {

constexpr int kScoreCache = 2048;  // scores kept on the stack; later ones recomputed

struct RowCtx {
  const AttentionArgs* a;
  size_t head_off;  // bytes into each K/V row
  bool tiny_k;      // tinyBLAS for Q.K (batched step, head_dim % 8 == 0)
  bool tiny_v;      // tinyBLAS for P.V (batched step, head_dim % 4 == 0)
};

float Score(const RowCtx& c, const uint16_t* qh, int64_t p) {
  const int hd = c.a->head_dim;
  const auto* k = reinterpret_cast<const uint16_t*>(c.a->kv->KRow(p) + c.head_off);
  const float s = c.tiny_k ? TinyBlasDotF16(k, qh, hd) : GgmlDotF16(k, qh, hd);
  return s * c.a->scale;
}

// Softmax numerator sum: 8-position groups (zeros past n_pos) in f32, then double.
double ExpSum(const RowCtx& c, const uint16_t* qh, const float* w, int64_t n_pos, float m) {
  double sum = 0.0;
  for (int64_t p0 = 0; p0 < n_pos; p0 += 8) {
    float e[8] = {};
    for (int64_t p = p0; p < std::min(p0 + 8, n_pos); ++p) {
      e[p - p0] = GgmlExpf((p < kScoreCache ? w[p] : Score(c, qh, p)) - m);
    }
    sum += static_cast<double>(HSum8(e));
  }
  return sum;
}

// One query row q (head_dim floats) over positions [0, n_pos).
void AttendRow(const RowCtx& c, const float* q, int64_t n_pos, float* out) {
  const int hd = c.a->head_dim;
  uint16_t qh[kMaxHeadDim];
  for (int i = 0; i < hd; ++i) qh[i] = FloatToHalfFast(q[i]);
  float w[kScoreCache];
  float m = -INFINITY;
  for (int64_t p = 0; p < n_pos; ++p) {
    const float s = Score(c, qh, p);
    if (p < kScoreCache) w[p] = s;
    m = s > m ? s : m;
  }
  const auto inv = static_cast<float>(1.0 / ExpSum(c, qh, w, n_pos, m));
  const int lanes = c.tiny_v ? 8 : 32;
  float acc[32 * kMaxHeadDim];  // [lane][i]
  std::fill(acc, acc + lanes * hd, 0.0f);
  for (int64_t p = 0; p < n_pos; ++p) {
    const float e = GgmlExpf((p < kScoreCache ? w[p] : Score(c, qh, p)) - m);
    const float ph = H2F(FloatToHalfFast(e * inv));
    const auto* v = reinterpret_cast<const uint16_t*>(c.a->kv->VRow(p) + c.head_off);
    float* lane = acc + (p % lanes) * hd;
    for (int i = 0; i < hd; ++i) lane[i] = std::fma(H2F(v[i]), ph, lane[i]);
  }
  float col[32];
  for (int i = 0; i < hd; ++i) {
    for (int l = 0; l < lanes; ++l) col[l] = acc[l * hd + i];
    out[i] = c.tiny_v ? HSum8(col) : Reduce32(col);
  }
}

}  // namespace

void AttentionItemsGgmlF16(const AttentionArgs& a, int64_t begin, int64_t end) {
  const int n_kv = a.kv->n_kv_heads;
  const int group = a.n_heads / n_kv;
  const int hd = a.head_dim;
  const int64_t q_stride = static_cast<int64_t>(a.n_heads) * hd;
  const bool batched = a.n_tokens >= 2;  // llamafile's sgemm runs only then
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / n_kv;
    const int g = static_cast<int>(item % n_kv);
    const RowCtx c{&a, static_cast<size_t>(g) * hd * sizeof(uint16_t), batched && hd % 8 == 0,
                   batched && hd % 4 == 0};
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const int64_t off = t * q_stride + static_cast<int64_t>(h) * hd;
      AttendRow(c, a.q + off, a.start_pos + t + 1, a.out + off);
    }
  }
}

}  // namespace meshnet::ops::internal
