// The in-process route of `generate` and `api`: the model split into shards in
// this process (mesh::InProcessMesh) on one compute pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cli/flags.h"
#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "util/thread_pool.h"

namespace meshnet::cli {

// The flags that shape an in-process route (as given on the command line).
struct InProcessRouteFlags {
  int shards = 3;
  std::string split;  // "0-1,2-3,..." (overrides shards)
  std::string kv_budget;
  std::string kv_dtype;
  bool ggml_parity = false;
  int threads = 0;           // 0: one per hardware thread
  int64_t min_sessions = 0;  // every shard's session cap is at least this
  BatchFlags batch;
};

struct InProcessRoute {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<mesh::InProcessMesh> mesh;
};

// Throws kInvalidArgument for a bad split, size, dtype or batch option.
InProcessRoute MakeInProcessRoute(std::shared_ptr<const gguf::GgufFile> file,
                                  const InProcessRouteFlags& f);

}  // namespace meshnet::cli
