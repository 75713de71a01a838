#include "cli/in_process_route.h"

#include <algorithm>
#include <thread>

#include "cli/common.h"
#include "model/hparams.h"
#include "node/admission.h"
#include "node/layer_range.h"
#include "util/sizes.h"

namespace meshnet::cli {

InProcessRoute MakeInProcessRoute(std::shared_ptr<const gguf::GgufFile> file,
                                  const InProcessRouteFlags& f) {
  const int n_layers = model::LlamaHParams::FromGguf(*file).n_layers;
  mesh::InProcessMeshOptions mo;
  mo.split =
      f.split.empty() ? node::EvenSplit(f.shards, n_layers) : node::ParseSplit(f.split, n_layers);
  mo.kv_dtype = ParseKvDtypeFlag(f.kv_dtype);
  mo.ggml_parity = f.ggml_parity;
  mo.kv_config.budget_bytes = ParseByteSize(f.kv_budget);
  mo.kv_config.max_sessions = std::max<int64_t>(mo.kv_config.max_sessions, f.min_sessions);
  // Generating sessions keep their KV room against later ones (kv/
  // hot_kv_state.h, active_seconds), within `serve`'s default --active-window.
  mo.kv_config.active_seconds = node::AdmissionOptions{}.active_window_s;
  mo.kv_config.Validate();
  mo.batch = BatchOptionsFrom(f.batch);
  const int threads =
      f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
  InProcessRoute r;
  r.pool = std::make_unique<ThreadPool>(threads);
  r.mesh = std::make_unique<mesh::InProcessMesh>(std::move(file), mo, r.pool.get());
  return r;
}

}  // namespace meshnet::cli
