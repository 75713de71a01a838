#include "ops/ggml_type.h"

#include <cctype>
#include <string>

namespace meshnet {

namespace {
constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},   {GgmlType::kQ8_0, "Q8_0", 32, 34},
    {GgmlType::kQ4_K, "Q4_K", 256, 144}, {GgmlType::kQ6_K, "Q6_K", 256, 210},
    {GgmlType::kBF16, "BF16", 1, 2},
};
}  // namespace

std::optional<GgmlTypeInfo> GgmlTypeInfoFor(uint32_t type_id) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  }
  return std::nullopt;
}

GgmlTypeInfo GgmlTypeInfoOf(GgmlType t) { return *GgmlTypeInfoFor(static_cast<uint32_t>(t)); }

std::optional<GgmlType> ParseGgmlType(std::string_view name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& t : kTypes) {
    if (t.name == upper) return t.type;
  }
  return std::nullopt;
}

}  // namespace meshnet
