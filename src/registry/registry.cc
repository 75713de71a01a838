#include "registry/registry.h"

#include <algorithm>

namespace meshnet::registry {

std::vector<NodeRecord> FindReplicas(Registry& registry, const NodeRecord& self,
                                     int64_t min_kv_bytes_free) {
  std::vector<NodeRecord> out;
  for (NodeRecord& r : registry.List(self.model_id).nodes) {
    if (r.address == self.address || r.draining) continue;
    if (r.start_layer != self.start_layer || r.end_layer != self.end_layer) continue;
    if (r.recipe_fingerprint != self.recipe_fingerprint) continue;
    if (r.kv_bytes_free < min_kv_bytes_free || r.sessions_free <= 0) continue;
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const NodeRecord& a, const NodeRecord& b) {
    return a.kv_bytes_free > b.kv_bytes_free;
  });
  return out;
}

}  // namespace meshnet::registry
