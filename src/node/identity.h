// Identities: of a model file, of sessions and of node instances.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "gguf/gguf_reader.h"

namespace meshnet::node {

// A stable identity of the model file (hex SHA-256 over its header, metadata,
// tensor table and size; not the weights, which a shard must not page in).
// Nodes of one mesh must report the same one.
std::string ModelIdentity(const gguf::GgufFile& file);

// 128 random bits from the OS CSPRNG (OpenSSL RAND_bytes), as 32 hex chars.
std::string RandomId128();

// True for 32 lowercase hexadecimal characters (what RandomId128 makes).
bool IsSessionId(const std::string& id);

// The key every session operation carries: a session id (IsSessionId), a
// secret of 1..256 bytes and an epoch >= 0. Throws kInvalidArgument naming
// the bad part.
void ValidateSessionKey(const std::string& session_id, const std::string& secret,
                        int64_t route_epoch);

}  // namespace meshnet::node
