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
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
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
// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles = 144 bytes
// Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d = 210 bytes

}  // namespace meshnet
