// Test helpers shared by the kv tests: the spec's K/V content formula
// (spec/kv-trace.md "Appended K/V"), owned append buffers and the checksum.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv/cache_miss.h"
#include "kv/hot_kv_state.h"
#include "util/error.h"
#include "util/hash.h"

namespace meshnet::kv::testing {

// "ok", "<error kind>" or "cache-miss:<reason>".
inline std::string Outcome(const std::function<void()>& f) {
  try {
    f();
  } catch (const CacheMissError& e) {
    return "cache-miss:" + std::string(CacheMissReasonName(e.miss().reason));
  } catch (const Error& e) {
    return std::string(ErrorKindName(e.kind()));
  }
  return "ok";
}

inline KvCacheRecipe MiniRecipe(KvDtype dtype = KvDtype::kF32) {
  KvCacheRecipe r;
  r.architecture_adapter = "llama";
  r.kv_dtype = dtype;
  r.n_kv_heads = 1;
  r.head_dim = 2;
  r.total_layers = 4;
  r.start_layer = 2;
  r.end_layer = 3;
  return r;
}

// K = ((fnv1a32(session) + 31*epoch + 131*L + 17*p + 7*h + d) % 1000) / 1000.
inline double SpecK(const std::string& session, int64_t epoch, int layer, int64_t pos, int h,
                    int d) {
  const int64_t x =
      int64_t{Fnv1a32(session)} + 31 * epoch + 131 * int64_t{layer} + 17 * pos + 7 * int64_t{h} + d;
  return static_cast<double>(x % 1000) / 1000.0;
}

// Owned buffers for one Append of rows [start, start + n).
struct AppendBuffers {
  std::vector<std::vector<float>> k, v;
  std::vector<LayerKv> layers;
};

inline AppendBuffers SpecRows(const KvCacheRecipe& r, const std::string& session, int64_t epoch,
                              int64_t start, int64_t n) {
  AppendBuffers b;
  const int nl = r.num_owned_layers();
  b.k.resize(nl);
  b.v.resize(nl);
  for (int i = 0; i < nl; ++i) {
    const int layer = r.start_layer + i;
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < r.n_kv_heads; ++h)
        for (int d = 0; d < r.head_dim; ++d) {
          const double k = SpecK(session, epoch, layer, start + t, h, d);
          b.k[i].push_back(static_cast<float>(k));
          b.v[i].push_back(static_cast<float>(-k));
        }
  }
  for (int i = 0; i < nl; ++i) b.layers.push_back({r.start_layer + i, n, b.k[i], b.v[i]});
  return b;
}

// The spec checksum: sha256 over owned layers of float32 keys then values; 16 hex.
inline std::string Checksum(const SessionHandle& h, const KvCacheRecipe& r) {
  Sha256 sha;
  for (int layer = r.start_layer; layer <= r.end_layer; ++layer) {
    const std::vector<float> k = h.ReadKeys(layer);
    const std::vector<float> v = h.ReadValues(layer);
    sha.Update(k.data(), k.size() * sizeof(float));
    sha.Update(v.data(), v.size() * sizeof(float));
  }
  return sha.HexDigest().substr(0, 16);
}

}  // namespace meshnet::kv::testing
