// Highway kernels for ops/nn.h (dynamic dispatch). Wrappers, RoPE and the
// threading live in nn.cc; the scalar references in nn_reference.cc; the
// attention kernels in attention_kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/nn_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#ifndef MESHNET_OPS_NN_KERNELS_ONCE
#define MESHNET_OPS_NN_KERNELS_ONCE
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/nn.h"
#include "ops/nn_kernels.h"
#include "util/dtype.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace meshnet::ops::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// ---------------------------------------------------------------- elementwise

float SumImpl(const float* x, int64_t n) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * l <= n; i += 4 * l) {
    a0 = hn::Add(a0, hn::LoadU(d, x + i));
    a1 = hn::Add(a1, hn::LoadU(d, x + i + l));
    a2 = hn::Add(a2, hn::LoadU(d, x + i + 2 * l));
    a3 = hn::Add(a3, hn::LoadU(d, x + i + 3 * l));
  }
  for (; i + l <= n; i += l) a0 = hn::Add(a0, hn::LoadU(d, x + i));
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += x[i];
  return s;
}

void AddImpl(const float* a, const float* b, int64_t n, float* out) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + l <= n; i += l)
    hn::StoreU(hn::Add(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

void RmsNormImpl(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps,
                 float* out) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    auto a0 = hn::Zero(d), a1 = hn::Zero(d);
    int64_t i = 0;
    for (; i + 2 * l <= dim; i += 2 * l) {
      const auto v0 = hn::LoadU(d, xr + i), v1 = hn::LoadU(d, xr + i + l);
      a0 = hn::MulAdd(v0, v0, a0);
      a1 = hn::MulAdd(v1, v1, a1);
    }
    for (; i + l <= dim; i += l) {
      const auto v = hn::LoadU(d, xr + i);
      a0 = hn::MulAdd(v, v, a0);
    }
    double ss = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
    for (; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(
        1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(eps)));
    const auto vs = hn::Set(d, scale);
    i = 0;
    for (; i + l <= dim; i += l) {
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, xr + i), vs), hn::LoadU(d, w + i)), d, yr + i);
    }
    for (; i < dim; ++i) yr[i] = (xr[i] * scale) * w[i];
  }
}

void SoftmaxImpl(float* x, int64_t n) {
  if (n <= 0) return;
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  auto vmax = hn::Set(d, x[0]);
  int64_t i = 0;
  for (; i + l <= n; i += l) vmax = hn::Max(vmax, hn::LoadU(d, x + i));
  float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const auto vm = hn::Set(d, mx);
  auto vsum = hn::Zero(d);
  i = 0;
  for (; i + l <= n; i += l) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    vsum = hn::Add(vsum, e);
    hn::StoreU(e, d, x + i);
  }
  double sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  const auto vinv = hn::Set(d, inv);
  i = 0;
  for (; i + l <= n; i += l) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vinv), d, x + i);
  for (; i < n; ++i) x[i] *= inv;
}

void SwiGluImpl(const float* gate, const float* up, int64_t n, float* out) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  const auto cap = hn::Set(d, 88.0f);  // exp(-g) stays finite; silu(g) ~ 0 there anyway
  int64_t i = 0;
  for (; i + l <= n; i += l) {
    const auto g = hn::LoadU(d, gate + i);
    const auto e = hn::Exp(d, hn::Min(hn::Neg(g), cap));
    const auto silu = hn::Div(g, hn::Add(one, e));
    hn::StoreU(hn::Mul(silu, hn::LoadU(d, up + i)), d, out + i);
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(std::min(-g, 88.0f))) * up[i];
  }
}

// ---------------------------------------------------------------- KV rows

void StoreKvRowImpl(uint8_t* dst, KvDtype dtype, const float* row, int64_t n) {
  const DF d;
  const int64_t l = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, row, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvDtype::kF16: {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
      // F16C rounds to nearest even like FloatToHalf; older targets emulate
      // the conversion without subnormals, so they take the scalar path.
      const hn::Rebind<hwy::float16_t, DF> dh;
      auto* out = reinterpret_cast<hwy::float16_t*>(dst);
      for (; i + l <= n; i += l) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, row + i)), dh, out + i);
#endif
      for (; i < n; ++i) StoreAs(KvDtype::kF16, dst + 2 * i, row[i]);
      return;
    }
    case KvDtype::kBF16: {
      // Round to nearest even on the bits (Highway's DemoteTo may truncate).
      const hn::RebindToUnsigned<DF> du;
      const hn::RebindToSigned<DF> di;
      const hn::Rebind<uint16_t, DF> d16;
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (; i + l <= n; i += l) {
        const auto bits = hn::BitCast(du, hn::LoadU(d, row + i));
        const auto is_nan =
            hn::Gt(hn::And(bits, hn::Set(du, 0x7fffffffu)), hn::Set(du, 0x7f800000u));
        const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
        const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(lsb, hn::Set(du, 0x7fffu))));
        const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
        const auto res = hn::IfThenElse(is_nan, quiet, rounded);
        hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, res)), d16, out + i);
      }
      for (; i < n; ++i) StoreAs(KvDtype::kBF16, dst + 2 * i, row[i]);
      return;
    }
    case KvDtype::kQ8_0:  // quantized rows are written by ops/kv_quant.h
    case KvDtype::kQ4_0:
      return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace meshnet::ops::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace meshnet::ops::internal {

HWY_EXPORT(SumImpl);
HWY_EXPORT(AddImpl);
HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(SoftmaxImpl);
HWY_EXPORT(SwiGluImpl);
HWY_EXPORT(StoreKvRowImpl);

float SumKernel(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumImpl)(x, n); }
void AddKernel(const float* a, const float* b, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(AddImpl)(a, b, n, out);
}
void RmsNormKernel(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps,
                   float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, w, n_rows, dim, eps, out);
}
void SoftmaxKernel(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, n); }
void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SwiGluImpl)(gate, up, n, out);
}
void StoreKvRowKernel(uint8_t* dst, KvDtype dtype, const float* row, int64_t n) {
  HWY_DYNAMIC_DISPATCH(StoreKvRowImpl)(dst, dtype, row, n);
}

}  // namespace meshnet::ops::internal
#endif  // HWY_ONCE
