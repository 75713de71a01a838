// Secrets: session secrets on a node and the cluster token.
//
// Secrets are never stored or compared in the clear: a node keeps
// SHA-256(secret) and compares digests with CRYPTO_memcmp, so the comparison
// time depends on neither the secret nor where a guess first differs.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace meshnet {

// SHA-256 of `secret`, 32 raw bytes.
std::string SecretDigest(std::string_view secret);

// Constant-time equality of two 32-byte digests (false if either size differs).
bool DigestEquals(std::string_view a, std::string_view b);

// Constant-time check of a presented secret against a stored digest.
inline bool SecretMatches(std::string_view presented, std::string_view digest) {
  return DigestEquals(SecretDigest(presented), digest);
}

// HMAC-SHA256 of `message` under `key`, 32 raw bytes: proves knowledge of a
// secret (keyed by its digest) without sending it.
std::string HmacSha256(std::string_view key, std::string_view message);

// 16 random bytes from the OS CSPRNG (OpenSSL RAND_bytes), raw.
std::string RandomBytes16();

}  // namespace meshnet
