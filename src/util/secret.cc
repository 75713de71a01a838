#include "util/secret.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "util/error.h"

namespace meshnet {

std::string SecretDigest(std::string_view secret) {
  std::string out(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
         reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

bool DigestEquals(std::string_view a, std::string_view b) {
  if (a.size() != SHA256_DIGEST_LENGTH || b.size() != SHA256_DIGEST_LENGTH) return false;
  return CRYPTO_memcmp(a.data(), b.data(), SHA256_DIGEST_LENGTH) == 0;
}

std::string HmacSha256(std::string_view key, std::string_view message) {
  std::string out(SHA256_DIGEST_LENGTH, '\0');
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       reinterpret_cast<unsigned char*>(out.data()), &n);
  return out;
}

std::string RandomBytes16() {
  std::string out(16, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), 16) != 1) {
    throw Error(ErrorKind::kUnavailable, "RAND_bytes failed");
  }
  return out;
}

}  // namespace meshnet
