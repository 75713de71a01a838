#include "kv/cache_miss.h"

#include <string>

namespace meshnet::kv {

std::string_view CacheMissReasonName(CacheMissReason r) {
  switch (r) {
    case CacheMissReason::kUnknownSession:
      return "unknown-session";
    case CacheMissReason::kEvictedTtl:
      return "evicted-ttl";
    case CacheMissReason::kEvictedLru:
      return "evicted-lru";
    case CacheMissReason::kReleased:
      return "released";
    case CacheMissReason::kSupersededEpoch:
      return "superseded-epoch";
    case CacheMissReason::kSeqLenMismatch:
      return "seq-len-mismatch";
    case CacheMissReason::kMoved:
      return "moved";
    case CacheMissReason::kPreempted:
      return "preempted";
  }
  return "unknown";
}

namespace {

// The first `n` code points of UTF-8 text (Python's s[:n]); bytes that are not
// valid UTF-8 lead bytes count as one character each.
std::string_view Utf8Prefix(std::string_view s, size_t n) {
  size_t i = 0;
  for (size_t chars = 0; i < s.size() && chars < n; ++chars) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 1;
    i += len;
  }
  return s.substr(0, i < s.size() ? i : s.size());
}

}  // namespace

std::string ShortSessionId(std::string_view session_id) {
  return std::string(Utf8Prefix(session_id, 8));
}

std::string CacheMiss::ToString() const {
  std::string out = "cache miss for session ";
  out += Utf8Prefix(session_id, 8);
  out += " epoch " + std::to_string(route_epoch) + " (";
  out += CacheMissReasonName(reason);
  out += ")";
  if (!detail.empty()) out += ": " + detail;
  if (!moved_to.empty() && detail.find(moved_to) == std::string::npos) {
    out += " (moved to " + moved_to + ")";
  }
  return out;
}

}  // namespace meshnet::kv
