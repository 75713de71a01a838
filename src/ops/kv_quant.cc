// Scalar q8_0 / q4_0 KV quantizers (see kv_quant.h). Scalar on purpose: a
// K/V row is quantized once per token and layer, a few hundred values beside
// the matmuls that produced them, and one plain implementation is what every
// SIMD target's attention kernel and the tests read back.
#include "ops/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/half_inline.h"

namespace meshnet::ops {

namespace {

// Bytes of a full 32-value block: every block but a head's last is full.
constexpr int FullBlockBytes(KvDtype dt) { return dt == KvDtype::kQ8_0 ? 34 : 18; }

int BlockValues(int head_dim, int b) {
  return std::min(kKvQuantBlock, head_dim - kKvQuantBlock * b);
}

// Round to nearest, ties to even (the default FP environment).
int RoundEven(float v) { return static_cast<int>(std::nearbyint(v)); }

void QuantizeQ8Block(const float* x, int n, uint8_t* dst) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const uint16_t d = FloatToHalfFast(amax / 127.0f);
  std::memcpy(dst, &d, 2);
  const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; ++i) {
    dst[2 + i] =
        static_cast<uint8_t>(static_cast<int8_t>(std::clamp(RoundEven(x[i] * inv), -127, 127)));
  }
}

void QuantizeQ4Block(const float* x, int n, uint8_t* dst) {
  float mx = 0.0f, mn = 0.0f;
  for (int i = 0; i < n; ++i) {
    mx = std::max(mx, x[i]);
    mn = std::min(mn, x[i]);
  }
  const float m = -mn > mx ? mn : mx;
  const uint16_t d = FloatToHalfFast(m != 0.0f ? m / -8.0f : 0.0f);  // not -0
  std::memcpy(dst, &d, 2);
  const float inv = m != 0.0f ? -8.0f / m : 0.0f;
  const int h = (n + 1) / 2;
  auto code = [&](int i) { return i < n ? std::clamp(RoundEven(x[i] * inv) + 8, 0, 15) : 8; };
  for (int j = 0; j < h; ++j) dst[2 + j] = static_cast<uint8_t>(code(j) | (code(j + h) << 4));
}

}  // namespace

float KvBlockCodes(KvDtype dt, const uint8_t* head, int head_dim, int b, int8_t* out) {
  const uint8_t* blk = head + static_cast<size_t>(b) * FullBlockBytes(dt);
  const int n = BlockValues(head_dim, b);
  uint16_t d;
  std::memcpy(&d, blk, 2);
  if (dt == KvDtype::kQ8_0) {
    std::memcpy(out, blk + 2, static_cast<size_t>(n));
  } else {
    const int h = (n + 1) / 2;
    for (int i = 0; i < n; ++i) {
      const uint8_t byte = blk[2 + (i < h ? i : i - h)];
      out[i] = static_cast<int8_t>((i < h ? byte & 0xF : byte >> 4) - 8);
    }
  }
  return HalfToFloatFast(d);
}

void QuantizeKvHead(KvDtype dt, const float* x, int head_dim, uint8_t* dst) {
  for (int b = 0; b < KvBlocks(head_dim); ++b) {
    const float* xb = x + kKvQuantBlock * b;
    uint8_t* db = dst + static_cast<size_t>(b) * FullBlockBytes(dt);
    if (dt == KvDtype::kQ8_0) {
      QuantizeQ8Block(xb, BlockValues(head_dim, b), db);
    } else {
      QuantizeQ4Block(xb, BlockValues(head_dim, b), db);
    }
  }
}

void DequantizeKvHead(KvDtype dt, const uint8_t* src, int head_dim, float* out) {
  int8_t codes[kKvQuantBlock];
  for (int b = 0; b < KvBlocks(head_dim); ++b) {
    const float d = KvBlockCodes(dt, src, head_dim, b, codes);
    const int n = BlockValues(head_dim, b);
    for (int i = 0; i < n; ++i) out[kKvQuantBlock * b + i] = static_cast<float>(codes[i]) * d;
  }
}

void QuantizeKvRow(KvDtype dt, const float* x, int n_heads, int head_dim, uint8_t* dst) {
  const int64_t head_bytes = KvHeadBytes(dt, head_dim);
  for (int h = 0; h < n_heads; ++h) {
    QuantizeKvHead(dt, x + static_cast<int64_t>(h) * head_dim, head_dim, dst + h * head_bytes);
  }
}

void DequantizeKvRow(KvDtype dt, const uint8_t* src, int n_heads, int head_dim, float* out) {
  const int64_t head_bytes = KvHeadBytes(dt, head_dim);
  for (int h = 0; h < n_heads; ++h) {
    DequantizeKvHead(dt, src + h * head_bytes, head_dim, out + static_cast<int64_t>(h) * head_dim);
  }
}

void QuantizeQueryHead(const float* x, int head_dim, float mul, int16_t* codes, float* scales) {
  for (int b = 0; b < KvBlocks(head_dim); ++b) {
    const float* xb = x + kKvQuantBlock * b;
    const int n = BlockValues(head_dim, b);
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    int16_t* cb = codes + kKvQuantBlock * b;
    for (int i = 0; i < kKvQuantBlock; ++i) {
      cb[i] = i < n ? static_cast<int16_t>(std::clamp(RoundEven(xb[i] * inv), -127, 127)) : 0;
    }
    scales[b] = mul * (amax / 127.0f);
  }
}

}  // namespace meshnet::ops
