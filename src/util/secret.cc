#include "util/secret.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

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

}  // namespace meshnet
