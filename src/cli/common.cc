#include "cli/common.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "util/error.h"

namespace meshnet::cli {

std::string DefaultModelPath() {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("models") / "stories260K.gguf";
  if (fs::exists(rel)) return rel.string();
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
      for (const fs::path& candidate : {dir / rel, dir / "share" / "meshnet" / rel}) {
        if (fs::exists(candidate, ec)) return candidate.string();
      }
      if (dir == dir.root_path()) break;
    }
  }
  return rel.string();
}

KvDtype ParseKvDtypeFlag(const std::string& s) {
  if (s == "f32" || s == "fp32") return KvDtype::kF32;
  if (s == "f16" || s == "fp16") return KvDtype::kF16;
  if (s == "bf16") return KvDtype::kBF16;
  try {
    return ParseKvDtype(s);
  } catch (const Error&) {
    ThrowInvalidArgument(
        "--kv-dtype must be float32, float16, bfloat16, q8_0 or q4_0 (or f32, f16, bf16); got '" +
        s + "'");
  }
}

std::string AuthTokenOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("MESHNET_AUTH_TOKEN");
  return env != nullptr ? env : "";
}

std::string AdminTokenOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("MESHNET_ADMIN_TOKEN");
  return env != nullptr ? env : "";
}

}  // namespace meshnet::cli
