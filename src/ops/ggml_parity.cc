// The elementwise ops of llama.cpp's CPU graph in ggml's arithmetic (see
// ops/nn.h, "llama.cpp parity"): derived from ggml-cpu c392e50 (x86 AVX2 +
// FMA, GCC's default floating-point contraction) and checked tensor by tensor
// against llama.cpp's intermediate values for the presets in tests/data/quant.
// Scalar on purpose: each differs from the SIMD kernels only in rounding.
#include <cmath>

#include "ops/nn.h"
#include "ops/nn_kernels.h"

namespace meshnet::ops {

void RmsNormGgml(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
                 float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    double sum = 0.0;  // products rounded to f32, summed in double
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const auto mean = static_cast<float>(sum / static_cast<double>(dim));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * scale) * weight[i];
  }
}

void RopeGgml(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
              int64_t start_pos) {
  const int half = cfg.rope_dims / 2;
  const float theta_scale = std::pow(cfg.freq_base, -2.0f / static_cast<float>(cfg.rope_dims));
  const int stride = cfg.neox ? 1 : 2;
  const int second = cfg.neox ? half : 1;
  float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
  for (int64_t t = 0; t < n_tokens; ++t) {
    float theta = static_cast<float>(start_pos + t);  // times theta_scale per pair, in f32
    for (int i = 0; i < half; ++i) {
      const float ff = cfg.freq_factors != nullptr ? cfg.freq_factors[i] : 1.0f;
      const float th = cfg.freq_scale * (theta / ff);
      cs[i] = std::cos(th);
      sn[i] = std::sin(th);
      theta *= theta_scale;
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * static_cast<int64_t>(head_dim);
      for (int i = 0; i < half; ++i) {
        float* a = v + stride * i;
        const float x0 = a[0], x1 = a[second];
        a[0] = std::fma(x0, cs[i], -(x1 * sn[i]));  // GCC contracts x0*c - x1*s so
        a[second] = std::fma(x0, sn[i], x1 * cs[i]);
      }
    }
  }
}

void SwiGluGgml(const float* gate, const float* up, int64_t n_rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* g = gate + r * dim;
    const float* u = up + r * dim;
    float* o = out + r * dim;
    const int64_t simd = dim & ~int64_t{7};  // ggml_v_silu on groups of 8, libm expf after
    for (int64_t i = 0; i < dim; ++i) {
      const float e = i < simd ? internal::GgmlExpf(0.0f - g[i]) : std::exp(-g[i]);
      o[i] = (g[i] / (1.0f + e)) * u[i];
    }
  }
}

}  // namespace meshnet::ops
