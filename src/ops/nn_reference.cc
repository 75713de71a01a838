// Scalar references for ops/nn.h: straightforward formulas in double, used by
// the tests as ground truth for the SIMD kernels.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/kv_quant.h"
#include "ops/nn.h"

namespace meshnet::ops {

void RmsNormReference(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
                      float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      out[r * dim + i] = static_cast<float>(x[r * dim + i] * scale * weight[i]);
    }
  }
}

void RopeReference(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
                   int64_t start_pos) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * static_cast<int64_t>(head_dim);
      const int half = cfg.rope_dims / 2;
      for (int i = 0; i < half; ++i) {
        double theta = static_cast<double>(start_pos + t) * cfg.freq_scale *
                       std::pow(static_cast<double>(cfg.freq_base),
                                -2.0 * i / static_cast<double>(cfg.rope_dims));
        if (cfg.freq_factors != nullptr) theta /= cfg.freq_factors[i];
        // Normal: adjacent pairs; NeoX: element i with element i + half.
        const int j0 = cfg.neox ? i : 2 * i;
        const int j1 = cfg.neox ? i + half : 2 * i + 1;
        const double x0 = v[j0], x1 = v[j1];
        v[j0] = static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
        v[j1] = static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
      }
    }
  }
}

void SoftmaxReference(float* x, int64_t n) {
  if (n <= 0) return;
  const double mx = *std::max_element(x, x + n);
  double sum = 0;
  std::vector<double> e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sum += e[i] = std::exp(x[i] - mx);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(e[i] / sum);
}

void SwiGluReference(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

namespace {

// q8_0 / q4_0: the fused kernels' arithmetic, summed in double: the query
// head quantized as they do it (kv_quant.h), exact integer dots per block
// times the two scales, softmax, and V dequantized.
void QuantAttentionReference(const float* q, int64_t n_tokens, int64_t start_pos,
                             const PagedKvLayer& kv, const AttentionConfig& cfg, float* out) {
  const int hd = cfg.head_dim;
  const int group = cfg.n_heads / kv.n_kv_heads;
  const int nb = KvBlocks(hd);
  const double scale = cfg.scale != 0.0f ? cfg.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const int64_t head_bytes = KvHeadBytes(kv.dtype, hd);
  std::vector<int16_t> qc(static_cast<size_t>(nb) * kKvQuantBlock);
  std::vector<float> qs(static_cast<size_t>(nb)), v(static_cast<size_t>(hd));
  int8_t kc[kKvQuantBlock];
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t n_pos = start_pos + t + 1;
    std::vector<double> w(static_cast<size_t>(n_pos));
    for (int h = 0; h < cfg.n_heads; ++h) {
      const int64_t off = (h / group) * head_bytes;
      QuantizeQueryHead(q + (t * cfg.n_heads + h) * static_cast<int64_t>(hd), hd, 1.0f, qc.data(),
                        qs.data());
      double mx = -INFINITY;
      for (int64_t p = 0; p < n_pos; ++p) {
        double s = 0;
        for (int b = 0; b < nb; ++b) {
          std::fill(kc, kc + kKvQuantBlock, 0);
          const double d = KvBlockCodes(kv.dtype, kv.KRow(p) + off, hd, b, kc);
          int64_t isum = 0;
          for (int i = 0; i < kKvQuantBlock; ++i) isum += qc[b * kKvQuantBlock + i] * kc[i];
          s += static_cast<double>(qs[b]) * d * static_cast<double>(isum);
        }
        w[p] = s * scale;
        mx = std::max(mx, w[p]);
      }
      double sum = 0;
      for (int64_t p = 0; p < n_pos; ++p) sum += w[p] = std::exp(w[p] - mx);
      std::vector<double> acc(static_cast<size_t>(hd), 0.0);
      for (int64_t p = 0; p < n_pos; ++p) {
        DequantizeKvHead(kv.dtype, kv.VRow(p) + off, hd, v.data());
        for (int i = 0; i < hd; ++i) acc[i] += w[p] * v[i];
      }
      float* o = out + (t * cfg.n_heads + h) * static_cast<int64_t>(hd);
      for (int i = 0; i < hd; ++i) o[i] = static_cast<float>(acc[i] / sum);
    }
  }
}

}  // namespace

void AttentionReference(const float* q, int64_t n_tokens, int64_t start_pos, const PagedKvLayer& kv,
                        const AttentionConfig& cfg, float* out) {
  if (IsQuantizedKv(kv.dtype)) return QuantAttentionReference(q, n_tokens, start_pos, kv, cfg, out);
  const int hd = cfg.head_dim;
  const int group = cfg.n_heads / kv.n_kv_heads;
  const double scale = cfg.scale != 0.0f ? cfg.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const int es = KvDtypeSize(kv.dtype);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t n_pos = start_pos + t + 1;
    std::vector<double> w(static_cast<size_t>(n_pos));
    for (int h = 0; h < cfg.n_heads; ++h) {
      const int g = h / group;
      const float* qh = q + (t * cfg.n_heads + h) * static_cast<int64_t>(hd);
      double mx = -INFINITY;
      for (int64_t p = 0; p < n_pos; ++p) {
        const uint8_t* k = kv.KRow(p) + static_cast<size_t>(g) * hd * es;
        double s = 0;
        for (int i = 0; i < hd; ++i) s += qh[i] * static_cast<double>(LoadAs(kv.dtype, k + i * es));
        w[p] = s * scale;
        mx = std::max(mx, w[p]);
      }
      double sum = 0;
      for (int64_t p = 0; p < n_pos; ++p) sum += w[p] = std::exp(w[p] - mx);
      float* o = out + (t * cfg.n_heads + h) * static_cast<int64_t>(hd);
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < n_pos; ++p) {
          const uint8_t* v = kv.VRow(p) + static_cast<size_t>(g) * hd * es;
          acc += w[p] * LoadAs(kv.dtype, v + i * es);
        }
        o[i] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace meshnet::ops
