#include "ops/ggml_type.h"

#include <cctype>
#include <string>

namespace meshnet {

namespace {
constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},         {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 18},     {GgmlType::kQ4_1, "Q4_1", 32, 20},
    {GgmlType::kQ5_0, "Q5_0", 32, 22},     {GgmlType::kQ5_1, "Q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},     {GgmlType::kQ2_K, "Q2_K", 256, 84},
    {GgmlType::kQ3_K, "Q3_K", 256, 110},   {GgmlType::kQ4_K, "Q4_K", 256, 144},
    {GgmlType::kQ5_K, "Q5_K", 256, 176},   {GgmlType::kQ6_K, "Q6_K", 256, 210},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 18}, {GgmlType::kIQ4_XS, "IQ4_XS", 256, 136},
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
