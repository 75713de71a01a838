// CacheMiss: the explicit, benign "state is gone, re-prefill from token zero"
// answer. A value, not an exception, wherever the reference returns one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/error.h"

namespace meshnet::kv {

enum class CacheMissReason {
  kUnknownSession,
  kEvictedTtl,
  kEvictedLru,
  kReleased,
  kSupersededEpoch,
  kSeqLenMismatch,
  // The session's KV moved to another node (CacheMiss::moved_to); answered by
  // a node that drained or handed it over, never by the KV manager itself.
  kMoved,
  // Evicted while active for a session that arrived before it, the budget
  // being full of active sessions (HotKvStateConfig::active_seconds): the
  // node is full, as "busy" says; clients re-prefill without counting it as
  // a failure. Never in a reference trace.
  kPreempted,
};
inline constexpr int kNumCacheMissReasons = 8;

// "unknown-session", "evicted-ttl", "evicted-lru", "released",
// "superseded-epoch", "seq-len-mismatch", "moved", "preempted".
std::string_view CacheMissReasonName(CacheMissReason r);

// The first 8 characters (code points) of a session id, as the reference's
// messages print it (session_id[:8]).
std::string ShortSessionId(std::string_view session_id);

struct CacheMiss {
  std::string session_id;
  int64_t route_epoch = 0;
  CacheMissReason reason = CacheMissReason::kUnknownSession;
  std::string detail;
  std::string moved_to{};  // kMoved: "host:port" of the node that holds it now
  // "cache miss for session <first 8 chars> epoch E (reason)[: detail]"
  std::string ToString() const;
};

// Thrown by the strict accessors (Get, Append) where the reference raises
// KvCacheMissError.
class CacheMissError : public Error {
 public:
  explicit CacheMissError(CacheMiss miss)
      : Error(ErrorKind::kCacheMiss, miss.ToString()), miss_(std::move(miss)) {}
  const CacheMiss& miss() const { return miss_; }

 private:
  CacheMiss miss_;
};

}  // namespace meshnet::kv
