// Kernel benchmarks for ops/: decode matvec per weight type against the
// machine's read bandwidth (the roofline for a memory-bound matvec), and
// prefill matmul against the naive strategy of one matvec per token.
//
// Baselines measured in the same run, before the benchmarks:
//   read_bw[threads]  vectorized sum over a buffer far larger than the caches
//   memcpy_bw         memcpy of such a buffer (read + write bytes)
//   compute_scaling_2t  2-thread speedup of a pure FMA loop (what 2 threads can gain now)
//   int8_peak / fma_peak  (x86 AVX2) multiply-adds per CPU-second of one thread
//                 (int8_peak: the higher of the AVX2 and, where the CPU has
//                 it, the AVX512-VNNI loop, int8_vnni_GMACps)
//                 in the tightest loops the kernels' inner steps allow: the
//                 GGML-style 32-block int8 dot (vpmaddubsw, vpmaddwd, convert,
//                 FMA by the block scale) and f32 FMAs, 8 independent
//                 accumulators each, no memory traffic: the compute roofline
//   vnni_issue_GMACps  (AVX512-VNNI) vpdpbusd alone, 16 independent chains:
//                 the instruction's issue rate x 64, a ceiling above
//                 int8_peak that no kernel reaches (a block also needs its
//                 convert, scale, FMA and loads; the packed tiles amortize
//                 these over 16 rows, so they exceed int8_peak)
// Counters:
//   weights_GBps  weight bytes streamed per second
//   roofline      weight bytes/s divided by read_bw with the same thread count
//   *_cpu         (1 thread) the same in thread CPU time, robust to a busy machine
//   attainable_cpu (1 thread) weight bytes/s over min(read_bw_cpu, the compute
//                 roofline's bytes/s: peak MACs/s x bytes per weight), i.e.
//                 the share of what either limit allows
//   of_compute_peak (prefill, 1 thread) multiply-adds per CPU-second over
//                 int8_peak (quantized types) or fma_peak (F32/F16/BF16)
//   of_vnni_issue (prefill, 1 thread, quantized) the same over vnni_issue_GMACps
//   vs_llama_style (Q8_0) our time / a llama.cpp-style q8_0 x q8_0 kernel's
//                 (one row at a time, int8 sign trick, f16 activation scales),
//                 re-implemented here with AVX2 intrinsics, on the same data
//   speedup       (prefill / batch) time of n single-token MatMul calls / one
//                 n-token call, i.e. tokens/s over n repeated matvecs (best of
//                 5 alternating passes; thread CPU time with 1 thread)
//
// Weights are cycled over a ring of copies totalling kRingBytes so every
// matvec streams from DRAM, not from the caches.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops_bench.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// After foreach_target.h.
#include "hwy/highway.h"

#ifndef MESHNET_OPS_BENCH_ONCE
#define MESHNET_OPS_BENCH_ONCE
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "hwy/aligned_allocator.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops/matmul.h"
#include "ops/nn.h"
#include "ops/quantize.h"
#include "ops/simd_targets.h"
#include "util/dtype.h"
#include "util/thread_pool.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace meshnet::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of n floats with 4 independent accumulators (pure streaming reads).
float StreamSumImpl(const float* p, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t l = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * l <= n; i += 4 * l) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + l));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * l));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * l));
  }
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += p[i];
  return s;
}

}  // namespace meshnet::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace meshnet::bench {
HWY_EXPORT(StreamSumImpl);

namespace {

using ops::WeightMatrix;
constexpr size_t kRingBytes = size_t{384} << 20;
constexpr size_t kBandwidthBytes = size_t{512} << 20;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

ThreadPool& Pool(int threads) {
  static ThreadPool one(1), two(2);
  return threads == 1 ? one : two;
}

// ---------------------------------------------------------------- baselines

struct Baselines {
  double read_bw[3] = {0, 0, 0};  // bytes/s with 1 and 2 threads
  double memcpy_bw = 0;           // (read + write) bytes/s, 1 thread
  double read_bw_cpu = 0;         // bytes per second of thread CPU time, 1 thread
  double compute_scaling = 0;     // 2-thread speedup of an embarrassingly parallel FMA loop
  double int8_peak = 0;           // int8 MACs per CPU-second (0: no AVX2 probe here)
  double int8_vnni_peak = 0;      // the same with AVX512-VNNI (0: not on this CPU)
  double vnni_issue_peak = 0;     // vpdpbusd alone: its issue rate x 64 MACs (0: no VNNI)
  double fma_peak = 0;            // f32 MACs per CPU-second (0: no AVX2 probe here)
};

#if defined(__x86_64__)
// The compute roofline's probes (see the file comment): `n` rounds of 8
// independent accumulator chains, written as inline assembly because a
// compiler folds or hoists such loops (constant inputs) or keeps the
// accumulators in memory.
#define MESHNET_INT8_DOT(A)                \
  "vpmaddubsw %[x], %[w], %%ymm15\n\t"     \
  "vpmaddwd %[ones], %%ymm15, %%ymm15\n\t" \
  "vcvtdq2ps %%ymm15, %%ymm15\n\t"         \
  "vfmadd231ps %[s], %%ymm15, %[" A "]\n\t"
__attribute__((target("avx2,fma"), noinline)) float Int8DotLoop(int64_t n) {
  __m256 a0{}, a1{}, a2{}, a3{}, a4{}, a5{}, a6{}, a7{};
  const __m256i w = _mm256_set1_epi8(5), x = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  const __m256 s = _mm256_set1_ps(1e-9f);
  for (int64_t k = 0; k < n; ++k) {
    __asm__ volatile(MESHNET_INT8_DOT("a0") MESHNET_INT8_DOT("a1") MESHNET_INT8_DOT("a2")
                         MESHNET_INT8_DOT("a3") MESHNET_INT8_DOT("a4") MESHNET_INT8_DOT("a5")
                             MESHNET_INT8_DOT("a6") MESHNET_INT8_DOT("a7")
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                       [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7)
                     : [w] "x"(w), [x] "x"(x), [ones] "x"(ones), [s] "x"(s)
                     : "xmm15");
  }
  return _mm256_cvtss_f32(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))));
}

// The same for two 32-blocks per 512-bit vector with AVX512-VNNI (the
// kernels' AVX3_DL path): vpdpbusd into a zeroed register, convert, FMA by
// the scales.
#define MESHNET_INT8_VNNI(A)             \
  "vpxord %%zmm15, %%zmm15, %%zmm15\n\t" \
  "vpdpbusd %[x], %[w], %%zmm15\n\t"     \
  "vcvtdq2ps %%zmm15, %%zmm15\n\t"       \
  "vfmadd231ps %[s], %%zmm15, %[" A "]\n\t"
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) float Int8VnniLoop(int64_t n) {
  __m512 a0{}, a1{}, a2{}, a3{}, a4{}, a5{}, a6{}, a7{};
  const __m512i w = _mm512_set1_epi8(5), x = _mm512_set1_epi8(3);
  const __m512 s = _mm512_set1_ps(1e-9f);
  for (int64_t k = 0; k < n; ++k) {
    __asm__ volatile(MESHNET_INT8_VNNI("a0") MESHNET_INT8_VNNI("a1") MESHNET_INT8_VNNI("a2")
                         MESHNET_INT8_VNNI("a3") MESHNET_INT8_VNNI("a4") MESHNET_INT8_VNNI("a5")
                             MESHNET_INT8_VNNI("a6") MESHNET_INT8_VNNI("a7")
                     : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4),
                       [a5] "+v"(a5), [a6] "+v"(a6), [a7] "+v"(a7)
                     : [w] "v"(w), [x] "v"(x), [s] "v"(s)
                     : "xmm15");
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))));
}
#undef MESHNET_INT8_DOT

// vpdpbusd alone, 16 independent accumulators (Zen 5: 4-cycle latency, 2 per
// cycle): the instruction's issue rate, a ceiling no kernel reaches (each
// block also needs its convert, scale and FMA, and its loads).
#define MESHNET_DPBUSD(A) "vpdpbusd %[x], %[w], %[" A "]\n\t"
#define MESHNET_DPBUSD8 \
  MESHNET_DPBUSD("a0")  \
  MESHNET_DPBUSD("a1")  \
  MESHNET_DPBUSD("a2")  \
  MESHNET_DPBUSD("a3")  \
  MESHNET_DPBUSD("a4") MESHNET_DPBUSD("a5") MESHNET_DPBUSD("a6") MESHNET_DPBUSD("a7")
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) int Int8VnniIssueLoop(int64_t n) {
  __m512i a0{}, a1{}, a2{}, a3{}, a4{}, a5{}, a6{}, a7{};
  __m512i b0{}, b1{}, b2{}, b3{}, b4{}, b5{}, b6{}, b7{};
  const __m512i w = _mm512_set1_epi8(5), x = _mm512_set1_epi8(3);
  for (int64_t k = 0; k < n; ++k) {  // two asm blocks: at most 30 operands each
    __asm__ volatile(MESHNET_DPBUSD8
                     : [a0] "+v"(a0), [a1] "+v"(a1), [a2] "+v"(a2), [a3] "+v"(a3), [a4] "+v"(a4),
                       [a5] "+v"(a5), [a6] "+v"(a6), [a7] "+v"(a7)
                     : [w] "v"(w), [x] "v"(x));
    __asm__ volatile(MESHNET_DPBUSD8
                     : [a0] "+v"(b0), [a1] "+v"(b1), [a2] "+v"(b2), [a3] "+v"(b3), [a4] "+v"(b4),
                       [a5] "+v"(b5), [a6] "+v"(b6), [a7] "+v"(b7)
                     : [w] "v"(w), [x] "v"(x));
  }
  const __m512i s = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(b0, b1), _mm512_add_epi32(b2, b3)),
                       _mm512_add_epi32(_mm512_add_epi32(b4, b5), _mm512_add_epi32(b6, b7))));
  return _mm512_reduce_add_epi32(s);
}
#undef MESHNET_DPBUSD8
#undef MESHNET_DPBUSD

#define MESHNET_FMA(A) "vfmadd231ps %[s], %[w], %[" A "]\n\t"
__attribute__((target("avx2,fma"), noinline)) float FmaLoop(int64_t n) {
  __m256 a0{}, a1{}, a2{}, a3{}, a4{}, a5{}, a6{}, a7{};
  const __m256 w = _mm256_set1_ps(0.999f), s = _mm256_set1_ps(1e-9f);
  for (int64_t k = 0; k < n; ++k) {
    __asm__ volatile(MESHNET_FMA("a0") MESHNET_FMA("a1") MESHNET_FMA("a2") MESHNET_FMA("a3")
                         MESHNET_FMA("a4") MESHNET_FMA("a5") MESHNET_FMA("a6") MESHNET_FMA("a7")
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                       [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7)
                     : [w] "x"(w), [s] "x"(s));
  }
  return _mm256_cvtss_f32(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))));
}
#undef MESHNET_FMA
#endif

// A latency-bound FMA loop with no memory traffic: the control for what two
// threads can gain on this machine right now (shared or oversubscribed vCPUs
// show ~1.0 here, and then no 2-thread kernel figure can exceed its 1-thread one).
__attribute__((noinline)) float FmaChains(int64_t n) {
  float a = 1, b = 1, c = 1, d = 1;
  for (int64_t i = 0; i < n; ++i) {
    a = a * 1.0000001f + 1e-7f;
    b = b * 0.9999999f + 1e-7f;
    c = c * 1.0000001f - 1e-7f;
    d = d * 0.9999999f - 1e-7f;
  }
  return a + b + c + d;
}

// CPU time of the calling thread: on a shared, oversubscribed machine the
// single-thread figures are measured in it too (time spent descheduled is not
// the kernel's), and reported next to the wall-clock ones.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double TimeBestCpu(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = ThreadCpuSeconds();
    fn();
    best = std::min(best, ThreadCpuSeconds() - t0);
  }
  return best;
}

double TimeBest(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, Seconds(std::chrono::steady_clock::now() - t0));
  }
  return best;
}

const Baselines& GetBaselines() {
  static const Baselines b = [] {
    Baselines out;
    const size_t n = kBandwidthBytes / sizeof(float);
    // 64-byte aligned (the probe's best case, so the roofline ratios are conservative).
    auto src_buf = hwy::AllocateAligned<float>(n), dst_buf = hwy::AllocateAligned<float>(n);
    float* src = src_buf.get();
    float* dst = dst_buf.get();
    std::fill(src, src + n, 1.0f);
    std::fill(dst, dst + n, 0.0f);
    volatile float sink = 0;
    for (int threads : {1, 2}) {
      ThreadPool& pool = Pool(threads);
      const double t = TimeBest(5, [&] {
        float parts[2] = {0, 0};
        pool.ParallelFor(threads, [&](int64_t b0, int64_t b1) {
          for (int64_t k = b0; k < b1; ++k) {
            const size_t lo = n / threads * k, hi = k + 1 == threads ? n : n / threads * (k + 1);
            parts[k] = HWY_DYNAMIC_DISPATCH(StreamSumImpl)(src + lo, hi - lo);
          }
        });
        sink = sink + parts[0] + parts[1];
      });
      out.read_bw[threads] = static_cast<double>(kBandwidthBytes) / t;
    }
    out.read_bw_cpu = static_cast<double>(kBandwidthBytes) / TimeBestCpu(5, [&] {
                        sink = sink + HWY_DYNAMIC_DISPATCH(StreamSumImpl)(src, n);
                      });
    const double t = TimeBest(3, [&] { std::memcpy(dst, src, kBandwidthBytes); });
    constexpr int64_t kFmaIters = 50'000'000;
    const double one = TimeBest(3, [&] { sink = sink + FmaChains(kFmaIters); });
    const double two = TimeBest(3, [&] {
      float parts[2] = {0, 0};
      Pool(2).ParallelFor(2, [&](int64_t b0, int64_t b1) {
        for (int64_t k = b0; k < b1; ++k) parts[k] = FmaChains(kFmaIters);
      });
      sink = sink + parts[0] + parts[1];
    });
    out.compute_scaling = 2.0 * one / two;
    out.memcpy_bw = 2.0 * static_cast<double>(kBandwidthBytes) / t;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      constexpr int64_t kRounds = 20'000'000;                         // 160 M block dots: ~0.3 s
      const double macs = 8.0 * 32.0 * static_cast<double>(kRounds);  // = FmaLoop(4 * kRounds)'s
      out.int8_peak = macs / TimeBestCpu(3, [&] { sink = sink + Int8DotLoop(kRounds); });
      out.fma_peak = macs / TimeBestCpu(3, [&] { sink = sink + FmaLoop(4 * kRounds); });
    }
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) {
      constexpr int64_t kRounds = 10'000'000;  // 64 MACs per step, 8 steps per round
      const double macs = 8.0 * 64.0 * static_cast<double>(kRounds);
      out.int8_vnni_peak = macs / TimeBestCpu(3, [&] { sink = sink + Int8VnniLoop(kRounds); });
      out.int8_peak = std::max(out.int8_peak, out.int8_vnni_peak);
      out.vnni_issue_peak = 16.0 * 64.0 * static_cast<double>(kRounds) /
                            TimeBestCpu(3, [&] { sink = sink + Int8VnniIssueLoop(kRounds); });
    }
#endif
    return out;
  }();
  return b;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const Baselines& b = GetBaselines();
  for (auto _ : state) benchmark::DoNotOptimize(b.read_bw[1]);
  state.counters["read_GBps_1t"] = b.read_bw[1] / 1e9;
  state.counters["read_GBps_2t"] = b.read_bw[2] / 1e9;
  state.counters["read_GBps_1t_cpu"] = b.read_bw_cpu / 1e9;
  state.counters["memcpy_GBps"] = b.memcpy_bw / 1e9;
  state.counters["read_vs_memcpy"] = b.read_bw[1] / b.memcpy_bw;
  state.counters["compute_scaling_2t"] = b.compute_scaling;
  if (b.int8_vnni_peak > 0) state.counters["int8_vnni_GMACps"] = b.int8_vnni_peak / 1e9;
  if (b.vnni_issue_peak > 0) state.counters["vnni_issue_GMACps"] = b.vnni_issue_peak / 1e9;
  if (b.int8_peak > 0) {
    state.counters["int8_peak_GMACps"] = b.int8_peak / 1e9;
    state.counters["fma_peak_GMACps"] = b.fma_peak / 1e9;
  }
}
BENCHMARK(BM_ReadBandwidth)->Iterations(1);

// ---------------------------------------------------------------- matrices

// Copies start 32 bytes past a 64-byte boundary, like GGUF tensor data
// (general.alignment defaults to 32).
// --ops_packed: matrices also carry ops::PackWeights' layout where this
// machine has one (the counters still count the unpacked bytes).
bool g_packed = false;

struct Ring {
  std::vector<uint8_t> storage;
  std::vector<uint8_t> packed;
  uint8_t* bytes = nullptr;
  std::vector<WeightMatrix> mats;
};

// A ring of identical copies of one quantized random matrix (rows, cols).
const Ring& GetRing(GgmlType type, int64_t rows, int64_t cols) {
  static std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<Ring>> cache;
  auto& slot = cache[{static_cast<int>(type), rows, cols}];
  if (slot) return *slot;
  slot = std::make_unique<Ring>();
  const int64_t row_bytes = ops::RowBytes(type, cols);
  const size_t mat_bytes = static_cast<size_t>(row_bytes * rows);
  std::vector<uint8_t> one(mat_bytes);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = dist(rng);
    ops::QuantizeRow(type, row.data(), cols, one.data() + r * row_bytes);
  }
  const size_t copies = std::max<size_t>(2, kRingBytes / mat_bytes);
  slot->storage.resize(copies * mat_bytes + 128);
  uint8_t* raw = slot->storage.data();
  slot->bytes = raw + (64 - reinterpret_cast<uintptr_t>(raw) % 64) % 64 + 32;
  for (size_t c = 0; c < copies; ++c)
    std::memcpy(slot->bytes + c * mat_bytes, one.data(), mat_bytes);
  for (size_t c = 0; c < copies; ++c) {
    slot->mats.push_back(WeightMatrix{type, slot->bytes + c * mat_bytes, rows, cols});
  }
  const size_t packed_bytes = g_packed ? ops::PackedWeightBytes(slot->mats[0]) : 0;
  if (packed_bytes > 0) {
    slot->packed.resize(copies * packed_bytes + 64);
    uint8_t* at =
        slot->packed.data() + (64 - reinterpret_cast<uintptr_t>(slot->packed.data()) % 64);
    ops::PackWeights(slot->mats[0], at);
    for (size_t c = 0; c < copies; ++c) {
      if (c > 0) std::memcpy(at + c * packed_bytes, at, packed_bytes);
      slot->mats[c].packed = at + c * packed_bytes;
    }
  }
  return *slot;
}

std::vector<float> RandomActs(int64_t n) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

// ---------------------------------------------------------------- llama.cpp-style q8_0

#if defined(__x86_64__)
struct LlamaQ8Block {
  uint16_t d;
  int8_t qs[32];
};

// Activation quantization as llama.cpp's quantize_row_q8_0 (f16 scale).
void LlamaStyleQuantize(const float* x, int64_t n, LlamaQ8Block* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    out[b].d = FloatToHalf(d);
    for (int i = 0; i < 32; ++i)
      out[b].qs[i] = static_cast<int8_t>(std::roundf(x[b * 32 + i] * id));
  }
}

__attribute__((target("avx2,fma,f16c"))) float LlamaStyleDot(const uint8_t* w,
                                                             const LlamaQ8Block* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * 34;
    uint16_t wd;
    std::memcpy(&wd, blk, 2);
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(wd) * _cvtsh_ss(x[b].d));
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i ax = _mm256_sign_epi8(qw, qw);
    const __m256i sy = _mm256_sign_epi8(qx, qw);
    const __m256i dot16 = _mm256_maddubs_epi16(ax, sy);
    const __m256i dot32 = _mm256_madd_epi16(dot16, _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot32), acc);
  }
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

void LlamaStyleMatVec(const WeightMatrix& w, const float* x, LlamaQ8Block* xq, float* y,
                      ThreadPool& pool) {
  LlamaStyleQuantize(x, w.cols, xq);
  const int64_t row_bytes = ops::RowBytes(GgmlType::kQ8_0, w.cols);
  const int threads = pool.num_threads();
  // Static contiguous split of rows across threads, one row at a time.
  pool.ParallelFor(threads, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = w.rows * k / threads, r1 = w.rows * (k + 1) / threads;
      for (int64_t r = r0; r < r1; ++r) {
        y[r] = LlamaStyleDot(static_cast<const uint8_t*>(w.data) + r * row_bytes, xq, w.cols / 32);
      }
    }
  });
}
#endif

// ---------------------------------------------------------------- decode matvec

bool IsFloatType(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// The compute roofline of `type` in MACs per CPU-second of one thread (0: unknown).
double PeakMacs(const Baselines& b, GgmlType type) {
  return IsFloatType(type) ? b.fma_peak : b.int8_peak;
}

void BM_MatVec(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const Baselines& base = GetBaselines();
  const Ring& ring = GetRing(type, rows, cols);
  ThreadPool& pool = Pool(threads);
  const std::vector<float> x = RandomActs(cols);
  std::vector<float> y(static_cast<size_t>(rows));
  std::vector<uint8_t> scratch(ops::MatMulScratchBytes(type, 1, cols));
  const size_t mat_bytes = static_cast<size_t>(ops::RowBytes(type, cols) * rows);
  size_t k = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ThreadCpuSeconds();
  for (auto _ : state) {
    ops::MatMul(ring.mats[k], x.data(), 1, y.data(), scratch.data(), &pool);
    benchmark::DoNotOptimize(y.data());
    k = (k + 1) % ring.mats.size();
  }
  const double elapsed = Seconds(std::chrono::steady_clock::now() - start);
  const double bytes = static_cast<double>(mat_bytes) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["weights_GBps"] = bytes / elapsed / 1e9;
  state.counters["roofline"] = bytes / elapsed / base.read_bw[threads];
  if (threads == 1) {
    const double cpu = ThreadCpuSeconds() - cpu_start;
    state.counters["weights_GBps_cpu"] = bytes / cpu / 1e9;
    state.counters["roofline_cpu"] = bytes / cpu / base.read_bw_cpu;
    if (PeakMacs(base, type) > 0) {
      const double bytes_per_weight =
          static_cast<double>(ops::RowBytes(type, cols)) / static_cast<double>(cols);
      const double compute_bw = PeakMacs(base, type) * bytes_per_weight;
      state.counters["attainable_cpu"] = bytes / cpu / std::min(base.read_bw_cpu, compute_bw);
    }
  }
#if defined(__x86_64__)
  // Every AVX2 CPU this runs on has F16C (Highway's AVX2 target requires it);
  // clang 14's __builtin_cpu_supports does not know the "f16c" name.
  if (type == GgmlType::kQ8_0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    // Same ring and thread count; the two kernels alternate over 5 passes of
    // the ring and each keeps its best pass, so both see the same conditions.
    std::vector<LlamaQ8Block> xq(static_cast<size_t>(cols / 32));
    std::vector<float> y2(static_cast<size_t>(rows));
    const size_t n = ring.mats.size();
    double llama_s = 1e30, ours_s = 1e30;
    auto time_once = [&](const std::function<void()>& fn) {
      return threads == 1 ? TimeBestCpu(1, fn) : TimeBest(1, fn);  // CPU time for 1 thread
    };
    for (int pass = 0; pass < 5; ++pass) {
      llama_s = std::min(llama_s, time_once([&] {
                                    for (size_t i = 0; i < n; ++i) {
                                      LlamaStyleMatVec(ring.mats[i], x.data(), xq.data(), y2.data(),
                                                       pool);
                                    }
                                  }) / static_cast<double>(n));
      ours_s = std::min(ours_s, time_once([&] {
                                  for (size_t i = 0; i < n; ++i) {
                                    ops::MatMul(ring.mats[i], x.data(), 1, y.data(), scratch.data(),
                                                &pool);
                                  }
                                }) / static_cast<double>(n));
    }
    state.counters["llama_style_GBps"] = static_cast<double>(mat_bytes) / llama_s / 1e9;
    state.counters["ours_best_GBps"] = static_cast<double>(mat_bytes) / ours_s / 1e9;
    state.counters["speedup_vs_llama_style"] = llama_s / ours_s;
  }
#endif
}

void MatVecArgs(benchmark::internal::Benchmark* b) {
  for (GgmlType t :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
        GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kQ2_K,
        GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    for (int threads : {1, 2}) {
      b->Args({static_cast<int64_t>(t), 2048, 768, threads});
      b->Args({static_cast<int64_t>(t), 768, 2048, threads});
    }
  }
  b->ArgNames({"type", "rows", "cols", "threads"});
}
BENCHMARK(BM_MatVec)->Apply(MatVecArgs)->UseRealTime()->MinTime(0.3);

// ---------------------------------------------------------------- prefill

void BM_Prefill(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n_tokens = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const Ring& ring = GetRing(type, rows, cols);
  ThreadPool& pool = Pool(threads);
  const std::vector<float> x = RandomActs(n_tokens * cols);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));
  std::vector<uint8_t> scratch(ops::MatMulScratchBytes(type, n_tokens, cols));
  // Naive baseline: one matvec per token. Token t reads ring copy t, so the
  // weights come from DRAM each time as in a real model, where all the other
  // layers' weights pass through the caches between two tokens.
  const size_t n = ring.mats.size();
  auto naive = [&] {
    for (int64_t t = 0; t < n_tokens; ++t) {
      ops::MatMul(ring.mats[static_cast<size_t>(t) % n], x.data() + t * cols, 1,
                  y.data() + t * rows, scratch.data(), &pool);
    }
  };
  size_t k = 0;
  auto batched = [&] {
    ops::MatMul(ring.mats[k], x.data(), n_tokens, y.data(), scratch.data(), &pool);
    k = (k + 1) % n;
  };
  auto time_once = [&](const std::function<void()>& fn) {
    return threads == 1 ? TimeBestCpu(1, fn) : TimeBest(1, fn);  // CPU time for 1 thread
  };
  double naive_s = 1e30, batched_s = 1e30;
  for (auto _ : state) {  // each iteration: one naive and one batched pass, best kept
    naive_s = std::min(naive_s, time_once(naive));
    batched_s = std::min(batched_s, time_once(batched));
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["tokens_per_s"] = static_cast<double>(n_tokens) / batched_s;
  state.counters["GFLOPs"] = 2.0 * static_cast<double>(rows * cols * n_tokens) / batched_s / 1e9;
  state.counters["naive_tokens_per_s"] = static_cast<double>(n_tokens) / naive_s;
  state.counters["speedup"] = naive_s / batched_s;  // batched tokens/s over naive tokens/s
  const double peak = PeakMacs(GetBaselines(), type);
  if (threads == 1 && peak > 0) {
    state.counters["of_compute_peak"] =
        static_cast<double>(rows * cols * n_tokens) / batched_s / peak;
  }
  if (threads == 1 && !IsFloatType(type) && GetBaselines().vnni_issue_peak > 0) {
    state.counters["of_vnni_issue"] =
        static_cast<double>(rows * cols * n_tokens) / batched_s / GetBaselines().vnni_issue_peak;
  }
}

// Prompt processing (16, 128, 512 tokens) for every type through a 768x768
// and a 2048x768 matrix; the continuous-batching sizes (2..64 tokens) for the
// main types; 2 threads at 16 and 128 tokens.
void PrefillArgs(benchmark::internal::Benchmark* b) {
  const GgmlType all[] = {GgmlType::kF32,    GgmlType::kF16,  GgmlType::kBF16,  GgmlType::kQ8_0,
                          GgmlType::kQ4_0,   GgmlType::kQ4_1, GgmlType::kQ5_0,  GgmlType::kQ5_1,
                          GgmlType::kIQ4_NL, GgmlType::kQ2_K, GgmlType::kQ3_K,  GgmlType::kQ4_K,
                          GgmlType::kQ5_K,   GgmlType::kQ6_K, GgmlType::kIQ4_XS};
  for (GgmlType t : all) {
    for (int64_t rows : {768, 2048}) {
      for (int64_t tokens : {16, 128, 512})
        b->Args({static_cast<int64_t>(t), rows, 768, tokens, 1});
    }
  }
  for (GgmlType t :
       {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    for (int64_t tokens : {2, 4, 8, 32, 64})
      b->Args({static_cast<int64_t>(t), 2048, 768, tokens, 1});
    b->Args({static_cast<int64_t>(t), 2048, 768, 16, 2});  // a 16-session decode step
    b->Args({static_cast<int64_t>(t), 2048, 768, 128, 2});
  }
  b->ArgNames({"type", "rows", "cols", "tokens", "threads"});
}
BENCHMARK(BM_Prefill)->Apply(PrefillArgs)->UseRealTime()->Iterations(5);

// One decode token's attention over an F16 cache of `ctx` positions (8 query
// and 8 KV heads of head_dim, one contiguous block), arg 2: 0 = the f32-
// accumulating kernel, 1 = llama.cpp's arithmetic (AttentionConfig::ggml_f16, the
// --ggml-parity mode).
void BM_AttentionF16(benchmark::State& state) {
  const int hd = static_cast<int>(state.range(0));
  const int64_t ctx = state.range(1);
  const int heads = 8;
  const size_t row_bytes = static_cast<size_t>(heads) * hd * 2;
  std::vector<uint8_t> block(2 * ctx * row_bytes);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i < block.size() / 2; ++i) {
    const uint16_t h = FloatToHalf(dist(rng));
    std::memcpy(block.data() + 2 * i, &h, 2);
  }
  uint8_t* table[1] = {block.data()};
  ops::PagedKvLayer kv;
  kv.blocks = table;
  kv.block_tokens = static_cast<int32_t>(ctx);
  kv.v_offset = ctx * row_bytes;
  kv.row_bytes = row_bytes;
  kv.n_kv_heads = heads;
  kv.head_dim = hd;
  kv.dtype = KvDtype::kF16;
  kv.n_positions = ctx;
  std::vector<float> q(static_cast<size_t>(heads) * hd), out(q.size());
  for (float& v : q) v = dist(rng);
  ops::AttentionConfig cfg{heads, hd, 0.0f};
  cfg.ggml_f16 = state.range(2) != 0;
  for (auto _ : state) {
    ops::Attention(q.data(), 1, ctx - 1, kv, cfg, out.data(), nullptr);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(cfg.ggml_f16 ? "ggml_f16" : "f32 accumulate");
}
BENCHMARK(BM_AttentionF16)->ArgsProduct({{8, 64}, {512}, {0, 1}})->MinTime(0.2);

// One decode token for each of 16 sessions (or 1 with 4,096 positions), batched as a node runs it
// (ops::AttentionBatch): 12 query and 12 KV heads of 64 (768-dim), each
// session reading its own paged cache of `ctx` positions (16-position blocks,
// K plane then V plane, blocks of all sessions interleaved as a shared pool
// hands them out), 12 layers' worth of caches visited in turn so that, as in
// a node, the caches come from DRAM. kv_vs_read_bw: the K and V bytes read per
// second over the read bandwidth of as many threads (the attention's
// roofline at decode; 1.0 would be a pure stream). speed_vs_f16 (q8_0, q4_0):
// the F16 run's time per batch at the same ctx and threads, measured earlier
// in this run, over this one's.
std::map<std::tuple<int64_t, int, int>, double> g_f16_batch_seconds;

void BM_AttentionBatch(benchmark::State& state) {
  const auto dtype = static_cast<KvDtype>(state.range(0));
  const int64_t ctx = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  const int kSessions = static_cast<int>(state.range(3));
  constexpr int kHeads = 12, kHd = 64, kBlock = 16, kLayers = 12;
  const auto row_bytes = static_cast<size_t>(KvRowBytes(dtype, kHeads, kHd));
  const size_t block_bytes = 2 * kBlock * row_bytes;
  const int64_t blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  const size_t n_blocks = static_cast<size_t>(kLayers) * kSessions * blocks_per_seq;
  std::vector<uint8_t> pool_bytes(n_blocks * block_bytes + 64);
  uint8_t* base = pool_bytes.data() + (64 - reinterpret_cast<uintptr_t>(pool_bytes.data()) % 64);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(kHeads) * kHd);
  // tables[layer][session]: block b of a session is pool block
  // (layer * blocks_per_seq + b) * kSessions + session.
  std::vector<std::vector<uint8_t*>> tables(static_cast<size_t>(kLayers) * kSessions);
  std::vector<ops::PagedKvLayer> kvs(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    const size_t layer = i / kSessions, session = i % kSessions;
    for (int64_t b = 0; b < blocks_per_seq; ++b) {
      tables[i].push_back(base +
                          ((layer * blocks_per_seq + b) * kSessions + session) * block_bytes);
    }
    ops::PagedKvLayer& kv = kvs[i];
    kv.blocks = tables[i].data();
    kv.block_tokens = kBlock;
    kv.v_offset = kBlock * row_bytes;
    kv.row_bytes = row_bytes;
    kv.n_kv_heads = kHeads;
    kv.head_dim = kHd;
    kv.dtype = dtype;
    kv.n_positions = ctx;
    for (int64_t p = 0; p < ctx; ++p) {
      for (float& v : row) v = dist(rng);
      ops::StoreKvRow(kv, true, p, row.data());
      for (float& v : row) v = dist(rng);
      ops::StoreKvRow(kv, false, p, row.data());
    }
  }
  std::vector<float> q(static_cast<size_t>(kSessions) * kHeads * kHd), out(q.size());
  for (float& v : q) v = dist(rng);
  std::vector<ops::AttentionSeq> seqs(kSessions);
  const ops::AttentionConfig cfg{kHeads, kHd, 0.0f};
  ThreadPool& pool = Pool(threads);
  int layer = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (int s = 0; s < kSessions; ++s) {
      seqs[s] = {q.data() + s * kHeads * kHd, 1, ctx - 1, &kvs[layer * kSessions + s],
                 out.data() + s * kHeads * kHd};
    }
    ops::AttentionBatch(seqs.data(), kSessions, cfg, &pool);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  const double per_batch =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
      static_cast<double>(state.iterations());
  if (dtype == KvDtype::kF16) g_f16_batch_seconds[{ctx, threads, kSessions}] = per_batch;
  const auto f16 = g_f16_batch_seconds.find({ctx, threads, kSessions});
  if (IsQuantizedKv(dtype) && f16 != g_f16_batch_seconds.end()) {
    state.counters["speed_vs_f16"] = f16->second / per_batch;
  }
  state.SetLabel(std::string(KvDtypeName(dtype)));
  const double bytes = 2.0 * static_cast<double>(row_bytes) * ctx * kSessions;
  state.counters["kv_GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_vs_read_bw"] = benchmark::Counter(
      bytes / GetBaselines().read_bw[threads], benchmark::Counter::kIsIterationInvariantRate);
}
void AttentionBatchArgs(benchmark::internal::Benchmark* b) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kQ4_0}) {
    for (int64_t ctx : {64, 512, 1024}) {
      if (dt == KvDtype::kF32 && ctx > 512) continue;  // 1.2 GB of caches
      for (int64_t threads : {1, 2}) b->Args({static_cast<int64_t>(dt), ctx, threads, 16});
    }
    if (dt == KvDtype::kF32) continue;
    for (int64_t threads : {1, 2})
      b->Args({static_cast<int64_t>(dt), 4096, threads, 1});  // one long
  }
  b->ArgNames({"kv", "ctx", "threads", "sessions"});
}
BENCHMARK(BM_AttentionBatch)->Apply(AttentionBatchArgs)->UseRealTime()->MinTime(0.2);

}  // namespace
}  // namespace meshnet::bench

// --ops_without=NAME[,NAME...]: leave these Highway targets out (names as
// hwy::TargetName prints them, e.g. AVX3_DL), so that one machine measures a
// kernel against the next target down in alternating runs.
int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    constexpr std::string_view kFlag = "--ops_without=";
    if (arg == "--ops_packed") {
      meshnet::bench::g_packed = true;
      continue;
    }
    if (!arg.starts_with(kFlag)) {
      rest.push_back(argv[i]);
      continue;
    }
    try {
      meshnet::ops::DisableSimdTargets(arg.substr(kFlag.size()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ops_bench: --ops_without: %s\n", e.what());
      return 2;
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
#endif  // HWY_ONCE
