#include "kv/recipe.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "arch/architecture.h"
#include "util/error.h"
#include "util/hash.h"

namespace meshnet::kv {

namespace {

// The canonical adapter name; an uncertified name is the reference's
// BoundaryContractError, a ValueError subclass: kInvalidArgument here.
const CertifiedArchitecture& CanonicalArchitecture(const std::string& name) {
  try {
    return CertifiedArchitectureFor(name);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidArgument, e.what());
  }
}

}  // namespace

void KvCacheRecipe::Validate() const {
  CanonicalArchitecture(architecture_adapter);
  if (n_kv_heads <= 0) ThrowInvalidArgument("n_kv_heads must be positive");
  if (head_dim <= 0) ThrowInvalidArgument("head_dim must be positive");
  switch (kv_dtype) {
    case KvDtype::kF32:
    case KvDtype::kF16:
    case KvDtype::kBF16:
    case KvDtype::kQ8_0:
    case KvDtype::kQ4_0:
      break;
    default:
      ThrowInvalidArgument("invalid kv_dtype");
  }
  // role_for_range: 0 <= start <= end <= total - 1.
  if (!(0 <= start_layer && start_layer <= end_layer && end_layer <= total_layers - 1)) {
    ThrowInvalidArgument("invalid layer range [" + std::to_string(start_layer) + ", " +
                         std::to_string(end_layer) + "] for " + std::to_string(total_layers) +
                         " layers (need 0 <= start <= end <= total - 1)");
  }
  if (boundary_schema_version < 1) ThrowInvalidArgument("boundary_schema_version must be >= 1");
  // Guard the byte arithmetic every user of the recipe does.
  const int64_t row = KvRowBytes(kv_dtype, n_kv_heads, head_dim);
  if (row > std::numeric_limits<int64_t>::max() / 2 / num_owned_layers()) {
    ThrowInvalidArgument("KV geometry overflows 64-bit byte counts");
  }
}

int64_t KvCacheRecipe::BytesPerToken() const {
  const int64_t per_layer = 2 * KvRowBytes(kv_dtype, n_kv_heads, head_dim);
  return per_layer * num_owned_layers();
}

std::string KvCacheRecipe::Fingerprint() const {
  // nlohmann::json objects keep keys sorted and dump() is compact ("," and ":"),
  // which is Python's json.dumps(sort_keys=True, separators=(",", ":")).
  nlohmann::json j;
  j["kind"] = "hot-kv-recipe";
  j["architecture_adapter"] = CanonicalArchitecture(architecture_adapter).adapter;
  j["kv_dtype"] = std::string(KvDtypeName(kv_dtype));
  j["n_kv_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["total_layers"] = total_layers;
  j["start_layer"] = start_layer;
  j["end_layer"] = end_layer;
  j["boundary_schema_version"] = boundary_schema_version;
  return Sha256Hex(j.dump());
}

}  // namespace meshnet::kv
