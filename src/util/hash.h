// Hashes used across the project.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshnet {

// SHA-256 (OpenSSL) of bytes, as 64 lowercase hex characters.
std::string Sha256Hex(std::string_view bytes);

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t n);
  std::string HexDigest();  // finalizes

 private:
  void* ctx_;
};

// FNV-1a 32-bit over bytes (offset 0x811C9DC5, prime 0x01000193).
uint32_t Fnv1a32(std::string_view bytes);

}  // namespace meshnet
