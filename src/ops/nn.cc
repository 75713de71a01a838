// Wrappers over the dispatched kernels (nn_kernels.cc), plus RoPE (angles in
// double, a per-token cos/sin table on the stack applied to every head) and
// the embedding lookup.
#include "ops/nn.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/kv_quant.h"
#include "ops/nn_kernels.h"
#include "ops/quantize.h"
#include "util/error.h"

namespace meshnet::ops {

void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out) {
  internal::RmsNormKernel(x, weight, n_rows, dim, eps, out);
}

void RopeAngles(const RopeConfig& cfg, int64_t start_pos, int64_t n_tokens, float* cs, float* sn) {
  const int half = cfg.rope_dims / 2;
  double inv_freq[kMaxHeadDim / 2];
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<double>(cfg.freq_scale) *
                  std::pow(static_cast<double>(cfg.freq_base), -2.0 * i / cfg.rope_dims);
    if (cfg.freq_factors != nullptr) inv_freq[i] /= static_cast<double>(cfg.freq_factors[i]);
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto pos = static_cast<double>(start_pos + t);
    for (int i = 0; i < half; ++i) {
      const double theta = pos * inv_freq[i];
      cs[t * half + i] = static_cast<float>(std::cos(theta));
      sn[t * half + i] = static_cast<float>(std::sin(theta));
    }
  }
}

void RopeRotate(float* x, int64_t n_tokens, int n_heads, int head_dim, const RopeConfig& cfg,
                const float* cs, const float* sn) {
  const int half = cfg.rope_dims / 2;
  // Element offsets of pair i's two members.
  const int stride = cfg.neox ? 1 : 2;
  const int second = cfg.neox ? half : 1;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = cs + t * half;
    const float* s = sn + t * half;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * static_cast<int64_t>(head_dim);
      for (int i = 0; i < half; ++i) {
        float* a = v + stride * i;
        const float x0 = a[0], x1 = a[second];
        a[0] = x0 * c[i] - x1 * s[i];
        a[second] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

void Softmax(float* x, int64_t n) { internal::SoftmaxKernel(x, n); }

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  internal::SwiGluKernel(gate, up, n, out);
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  internal::AddKernel(a, b, n, out);
}

float Sum(const float* x, int64_t n) { return internal::SumKernel(x, n); }

void EmbeddingLookup(const WeightMatrix& table, const int32_t* tokens, int64_t n_tokens,
                     float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (tokens[t] < 0 || tokens[t] >= table.rows) {
      ThrowInvalidArgument("token id " + std::to_string(tokens[t]) +
                           " outside the vocabulary [0, " + std::to_string(table.rows) + ")");
    }
  }
  const int64_t row_bytes = RowBytes(table.type, table.cols);
  for (int64_t t = 0; t < n_tokens; ++t) {
    DequantizeRow(table.type, static_cast<const uint8_t*>(table.data) + tokens[t] * row_bytes,
                  table.cols, out + t * table.cols);
  }
}

void StoreKvRow(const PagedKvLayer& kv, bool key, int64_t pos, const float* row) {
  uint8_t* dst = key ? kv.KRow(pos) : kv.VRow(pos);
  if (IsQuantizedKv(kv.dtype)) return QuantizeKvRow(kv.dtype, row, kv.n_kv_heads, kv.head_dim, dst);
  internal::StoreKvRowKernel(dst, kv.dtype, row, static_cast<int64_t>(kv.n_kv_heads) * kv.head_dim);
}

void Attention(const float* q, int64_t n_tokens, int64_t start_pos, const PagedKvLayer& kv,
               const AttentionConfig& cfg, float* out, ThreadPool* pool) {
  internal::AttentionArgs a;
  a.q = q;
  a.n_tokens = n_tokens;
  a.start_pos = start_pos;
  a.kv = &kv;
  a.n_heads = cfg.n_heads;
  a.head_dim = cfg.head_dim;
  a.scale = cfg.scale != 0.0f ? cfg.scale : static_cast<float>(1.0 / std::sqrt(cfg.head_dim));
  if (cfg.ggml_f16) {
    if (kv.dtype != KvDtype::kF16) ThrowInvalidArgument("ggml_f16 attention needs an F16 KV cache");
    if (cfg.scale == 0.0f) a.scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  }
  a.out = out;
  const auto run = cfg.ggml_f16 ? internal::AttentionItemsGgmlF16 : internal::AttentionItems;
  const int64_t items = n_tokens * kv.n_kv_heads;
  ParallelForOrInline(pool, items, [&](int64_t b, int64_t e) { run(a, b, e); });
}

void AttentionBatch(const AttentionSeq* seqs, int64_t n_seqs, const AttentionConfig& cfg,
                    ThreadPool* pool) {
  int64_t total = 0;
  for (int64_t i = 0; i < n_seqs; ++i) total += seqs[i].n_tokens * seqs[i].kv->n_kv_heads;
  float scale = cfg.scale != 0.0f ? cfg.scale : static_cast<float>(1.0 / std::sqrt(cfg.head_dim));
  if (cfg.ggml_f16) {
    for (int64_t i = 0; i < n_seqs; ++i) {
      if (seqs[i].kv->dtype != KvDtype::kF16) {
        ThrowInvalidArgument("ggml_f16 attention needs an F16 KV cache");
      }
    }
    if (cfg.scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  }
  const auto items_fn = cfg.ggml_f16 ? internal::AttentionItemsGgmlF16 : internal::AttentionItems;
  // Items [begin, end) of the concatenated item space, sequence by sequence.
  auto run = [&](int64_t begin, int64_t end) {
    int64_t base = 0;
    for (int64_t i = 0; i < n_seqs && base < end; ++i) {
      const AttentionSeq& s = seqs[i];
      const int64_t items = s.n_tokens * s.kv->n_kv_heads;
      const int64_t b = std::max(begin, base), e = std::min(end, base + items);
      if (b < e) {
        internal::AttentionArgs a;
        a.q = s.q;
        a.n_tokens = s.n_tokens;
        a.start_pos = s.start_pos;
        a.kv = s.kv;
        a.n_heads = cfg.n_heads;
        a.head_dim = cfg.head_dim;
        a.scale = scale;
        a.out = s.out;
        items_fn(a, b - base, e - base);
      }
      base += items;
    }
  };
  ParallelForOrInline(pool, total, run);
}

}  // namespace meshnet::ops
