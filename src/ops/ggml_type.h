// GGML tensor element types that meshnet reads and writes, with their GGUF
// type ids and block geometry. Shared by gguf/ (sizes, validation) and ops/
// (kernels, quantizers).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace meshnet {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // "F32", "Q8_0", ...
  int64_t block_elems;    // elements per block
  int64_t block_bytes;    // bytes per block
};

// nullopt for a type id meshnet does not support.
std::optional<GgmlTypeInfo> GgmlTypeInfoFor(uint32_t type_id);
GgmlTypeInfo GgmlTypeInfoOf(GgmlType t);
// Parses "F32", "f16", "bf16", "q8_0", "Q4_K", ... (case-insensitive); nullopt otherwise.
std::optional<GgmlType> ParseGgmlType(std::string_view name);

// Block constants.
inline constexpr int kQK8_0 = 32;  // Q8_0: f16 scale + 32 x int8 = 34 bytes
inline constexpr int kQK4_0 = 32;  // Q4_0: f16 scale + 16 bytes of nibbles = 18 bytes
inline constexpr int kQK_K = 256;  // K-quants super-block
inline constexpr int kKScaleSize = 12;
// Q4_1: f16 d, f16 m, 16 bytes of nibbles = 20 bytes; Q5_0: f16 d, 4 bytes of high bits,
// 16 bytes of nibbles = 22 bytes; Q5_1: Q5_0 plus an f16 m = 24 bytes.
// IQ4_NL: f16 d + 16 bytes of nibbles indexing kIq4NlValues = 18 bytes.
// Q2_K: 16 bytes of 4-bit scale/min pairs, 64 bytes of 2-bit codes, f16 d, f16 dmin = 84 bytes
// Q3_K: 32 bytes high-bit mask, 64 bytes of 2-bit codes, 12 bytes of 6-bit scales, f16 d = 110
// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles = 144 bytes
// Q5_K: Q4_K plus 32 bytes of high bits = 176 bytes
// Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d = 210 bytes
// IQ4_XS: f16 d, 8 6-bit sub-block scales (u16 high bits, 4 bytes low nibbles), 128 bytes of
// nibbles indexing kIq4NlValues = 136 bytes
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK4_NL = 32;
// The 16 non-uniform levels of IQ4_NL and IQ4_XS codes (GGML's kvalues_iq4nl).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace meshnet
