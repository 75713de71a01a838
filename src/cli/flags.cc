#include "cli/flags.h"

#include <charconv>
#include <filesystem>

#include "util/error.h"

namespace meshnet::cli {

CLI::Validator IntRange(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
          return "must be an integer in " + range + ", got '" + text + "'";
        }
        return "";
      },
      "INT in " + range);
}

KvDtype ParseKvDtypeFlag(const std::string& flag, const std::string& s) {
  if (s == "f32" || s == "fp32") return KvDtype::kF32;
  if (s == "f16" || s == "fp16") return KvDtype::kF16;
  if (s == "bf16") return KvDtype::kBF16;
  try {
    return ParseKvDtype(s);
  } catch (const Error&) {
    ThrowInvalidArgument(flag + " must be float32, float16 or bfloat16 (or f32, f16, bf16); got '" +
                         s + "'");
  }
}

std::string DefaultModelPath() {
  const std::filesystem::path local = "models/stories260K.gguf";
  if (std::filesystem::exists(local)) return local.string();
  return std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf";
}

}  // namespace meshnet::cli
