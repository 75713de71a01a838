// Credentials on the wire: the cluster token's metadata value and the PEM
// files of TLS. Secrets themselves are hashed and compared in util/secret.h.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace meshnet::rpc {

// The value of the "authorization" metadata for a cluster token.
std::string BearerValue(std::string_view token);

// Reads a whole (PEM) file; Error(kInvalidArgument) naming it if unreadable or
// not PEM. `what` names the file's role ("TLS CA").
std::string ReadPemFile(const std::string& path, const char* what);

}  // namespace meshnet::rpc
