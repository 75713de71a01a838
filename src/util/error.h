// One error model for the whole project.
//
// Protocol violations are typed errors that mirror the reference module
// (stale epoch, incompatible recipe, budget exceeded, cache miss, invalid
// argument). A cache miss is normally a *value* (kv::CacheMiss); the error
// kind exists for the strict accessors that the reference also has. Only
// rpc/ converts these to gRPC status codes.
//
// Thread-safety: value types, safe to copy across threads.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace meshnet {

enum class ErrorKind {
  kInvalidArgument,     // bad input of any kind (the reference's ValueError)
  kStaleEpoch,          // route epoch older than the session's latest
  kIncompatibleRecipe,  // KV layout of the request differs from the shard's
  kBudgetExceeded,      // one session alone cannot fit the KV byte budget
  kCacheMiss,           // strict accessor found no live state
  kSessionBusy,         // a second concurrent step on one session
  kBoundaryContract,    // shard boundary contract violated (a kind of invalid argument)
  kMalformedFile,       // a GGUF (or other) file that fails validation
  kUnavailable,         // a peer could not be reached
  kPermissionDenied,    // wrong session secret or cluster token (rpc)
  kResourceExhausted,   // the node is busy (admission, per-peer limits): retry later
};

// The wire/trace spelling of a kind: "invalid-argument", "stale-epoch", ...
std::string_view ErrorKindName(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void ThrowInvalidArgument(const std::string& message) {
  throw Error(ErrorKind::kInvalidArgument, message);
}

}  // namespace meshnet
