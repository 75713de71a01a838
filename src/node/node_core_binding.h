// Private to node_core*.cc: a session's binding on a NodeCore.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "node/node_core.h"

namespace meshnet::node {

// Fields other than the immutable session_id are guarded by NodeCore::mu_.
struct NodeCore::Binding {
  std::string session_id;
  std::string secret_digest;  // SHA-256 of the opener's secret
  int64_t latest_epoch = 0;
  bool linked = false;
  std::list<Binding*>::iterator lru_it;
  // The step in flight, if any.
  bool in_flight = false;
  int64_t flight_epoch = 0;
  uint64_t flight_step = 0;
  // The last reply, for retries.
  std::unique_ptr<StepReply> result;
  int64_t result_epoch = 0;
  uint64_t result_step = 0;
  uint32_t result_digest = 0;
  int64_t result_bytes = 0;
  // Migration (node_core_migrate.cc): an export or import holds the session
  // (its steps wait); once moved, steps are answered with a kMoved miss; a
  // session a drain ended is answered with `ended` as the miss detail.
  bool migrating = false;
  std::string moved_to;
  std::string ended;
  bool move_untold = false;  // moved, and no step has been told yet
};

}  // namespace meshnet::node
