#include "util/error.h"

namespace meshnet {

std::string_view ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid-argument";
    case ErrorKind::kStaleEpoch:
      return "stale-epoch";
    case ErrorKind::kIncompatibleRecipe:
      return "incompatible-recipe";
    case ErrorKind::kBudgetExceeded:
      return "budget-exceeded";
    case ErrorKind::kCacheMiss:
      return "cache-miss";
    case ErrorKind::kSessionBusy:
      return "session-busy";
    case ErrorKind::kBoundaryContract:
      return "boundary-contract";
    case ErrorKind::kMalformedFile:
      return "malformed-file";
    case ErrorKind::kUnavailable:
      return "unavailable";
    case ErrorKind::kPermissionDenied:
      return "permission-denied";
    case ErrorKind::kResourceExhausted:
      return "resource-exhausted";
  }
  return "unknown";
}

}  // namespace meshnet
