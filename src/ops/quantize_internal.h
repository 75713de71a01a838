// Internal: the per-format row quantizers and dequantizers behind
// ops/quantize.h's QuantizeRow / DequantizeRow, and the scale-fitting helpers
// they share. Not a public API.
#pragma once

#include <cstdint>

#include "ops/quantize.h"

namespace meshnet::ops::internal {

// Fits x[i] ~= scale * q[i] - min with integer q in [0, nmax], min >= 0
// (count <= 32). Writes the best scale and min; returns the squared error.
float FitAsymmetric(const float* x, int count, int nmax, float* scale, float* min);
// Fits x[i] ~= scale * q[i] with integer q in [-nmax, nmax - 1] (count <= 32);
// returns the (signed) scale. The 13 candidates put the element of largest
// magnitude near code -nmax, nmax + step_size * {-6..6} away.
float FitSymmetric(const float* x, int count, int nmax, float step_size);
// Fits x[i] ~= scale * kIq4NlValues[k[i]] (count <= 32); returns the scale.
float FitIq4(const float* x, int count);
// Index of the IQ4_NL level nearest to v.
int NearestIq4(float v);
int NearestInt(float v);
// Packs 8 six-bit scales and 8 six-bit mins as Q4_K and Q5_K store them in
// their 12 bytes (the layout Q4KScaleMin reads).
void PackQ4KScales(const uint8_t ls[8], const uint8_t lm[8], uint8_t scales[12]);

// 32-element formats (quantize_small.cc).
void QuantizeQ4_1(const float* x, int64_t n, BlockQ4_1* y);
void DequantizeQ4_1(const BlockQ4_1* x, int64_t n, float* y);
void QuantizeQ5_0(const float* x, int64_t n, BlockQ5_0* y);
void DequantizeQ5_0(const BlockQ5_0* x, int64_t n, float* y);
void QuantizeQ5_1(const float* x, int64_t n, BlockQ5_1* y);
void DequantizeQ5_1(const BlockQ5_1* x, int64_t n, float* y);
void QuantizeIQ4_NL(const float* x, int64_t n, BlockIQ4_NL* y);
void DequantizeIQ4_NL(const BlockIQ4_NL* x, int64_t n, float* y);

// 256-element formats (quantize_kquant.cc).
void QuantizeQ2_K(const float* x, int64_t n, BlockQ2_K* y);
void DequantizeQ2_K(const BlockQ2_K* x, int64_t n, float* y);
void QuantizeQ3_K(const float* x, int64_t n, BlockQ3_K* y);
void DequantizeQ3_K(const BlockQ3_K* x, int64_t n, float* y);
void QuantizeQ5_K(const float* x, int64_t n, BlockQ5_K* y);
void DequantizeQ5_K(const BlockQ5_K* x, int64_t n, float* y);
void QuantizeIQ4_XS(const float* x, int64_t n, BlockIQ4_XS* y);
void DequantizeIQ4_XS(const BlockIQ4_XS* x, int64_t n, float* y);

}  // namespace meshnet::ops::internal
