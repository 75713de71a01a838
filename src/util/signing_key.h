// SigningKey: an Ed25519 key pair (OpenSSL), the long-lived identity of a
// node. A node signs what it claims about itself (its registry record, its
// answer to a challenge) with it; anyone holding the 32-byte public key can
// check such a claim and so tell the node from a host that only replays its
// words.
//
//   SigningKey key = SigningKey::LoadOrCreate("node.key");  // PEM, mode 0600
//   std::string sig = key.Sign("message");                   // 64 bytes
//   bool ok = VerifySignature(key.public_key(), "message", sig);
//
// Thread-safety: a SigningKey is immutable after construction; Sign and the
// free functions may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace meshnet {

inline constexpr size_t kPublicKeyBytes = 32;
inline constexpr size_t kSignatureBytes = 64;

class SigningKey {
 public:
  // A fresh key from the OS CSPRNG.
  static SigningKey Generate();
  // The PEM (PKCS#8) private key at `path`; when no file is there, a fresh key
  // is written to it first (mode 0600). Error(kInvalidArgument) for a file
  // that is not an Ed25519 private key, kUnavailable when it cannot be written.
  static SigningKey LoadOrCreate(const std::string& path);

  SigningKey(SigningKey&&) noexcept;
  SigningKey& operator=(SigningKey&&) noexcept;
  ~SigningKey();

  // 32 raw bytes.
  const std::string& public_key() const { return public_key_; }
  // 64 raw bytes.
  std::string Sign(std::string_view message) const;

 private:
  struct Pkey;
  explicit SigningKey(std::unique_ptr<Pkey> key);
  std::unique_ptr<Pkey> key_;
  std::string public_key_;
};

// Whether `signature` is `public_key`'s Ed25519 signature of `message`
// (false for keys or signatures of the wrong size).
bool VerifySignature(std::string_view public_key, std::string_view message,
                     std::string_view signature);

// Lowercase hex of raw bytes, and back (Error(kInvalidArgument) for odd
// lengths or non-hex characters).
std::string ToHex(std::string_view bytes);
std::string FromHex(std::string_view hex);

}  // namespace meshnet
