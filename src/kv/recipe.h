// KvCacheRecipe: the identity of a shard's KV layout, used to refuse
// incompatible reuse (reference: KvCacheRecipe / kv_recipe_for).
//
// Thread-safety: immutable value type.
#pragma once

#include <cstdint>
#include <string>

#include "util/dtype.h"

namespace meshnet::kv {

struct KvCacheRecipe {
  std::string architecture_adapter;  // a certified name or alias
  KvDtype kv_dtype = KvDtype::kF32;
  int n_kv_heads = 0;
  int head_dim = 0;
  int total_layers = 0;
  int start_layer = 0;
  int end_layer = 0;
  int boundary_schema_version = 1;

  // Validates like the reference's __post_init__: certified architecture,
  // n_kv_heads > 0, head_dim > 0, 0 <= start <= end <= total-1, schema >= 1.
  // Throws Error(kInvalidArgument) (an uncertified architecture is reported as
  // invalid argument too, as the reference's ValueError subclass is).
  void Validate() const;

  int num_owned_layers() const { return end_layer - start_layer + 1; }
  // 2 * n_kv_heads * head_dim * itemsize * owned layers; for q8_0 / q4_0,
  // 2 * n_kv_heads * KvHeadBytes(kv_dtype, head_dim) * owned layers.
  int64_t BytesPerToken() const;
  // sha256 hex of the canonical JSON (sorted keys, "," and ":" separators) of
  // {architecture_adapter (canonical), boundary_schema_version, end_layer,
  //  head_dim, kind:"hot-kv-recipe", kv_dtype, n_kv_heads, start_layer, total_layers}.
  std::string Fingerprint() const;
  bool IsCompatible(const KvCacheRecipe& other) const {
    return *this == other || Fingerprint() == other.Fingerprint();
  }
  // Field by field: equal recipes have equal fingerprints (recipes that differ
  // only in an alias of the architecture's name are compatible, not equal).
  friend bool operator==(const KvCacheRecipe&, const KvCacheRecipe&) = default;
};

}  // namespace meshnet::kv
