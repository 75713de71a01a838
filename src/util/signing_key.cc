#include "util/signing_key.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "util/error.h"

namespace meshnet {

struct SigningKey::Pkey {
  EVP_PKEY* p = nullptr;
  ~Pkey() { EVP_PKEY_free(p); }
};

namespace {

std::string RawPublicKey(EVP_PKEY* p) {
  std::string out(kPublicKeyBytes, '\0');
  size_t n = out.size();
  if (EVP_PKEY_get_raw_public_key(p, reinterpret_cast<unsigned char*>(out.data()), &n) != 1 ||
      n != kPublicKeyBytes) {
    throw Error(ErrorKind::kInvalidArgument, "not an Ed25519 key");
  }
  return out;
}

}  // namespace

SigningKey::SigningKey(std::unique_ptr<Pkey> key)
    : key_(std::move(key)), public_key_(RawPublicKey(key_->p)) {}
SigningKey::SigningKey(SigningKey&&) noexcept = default;
SigningKey& SigningKey::operator=(SigningKey&&) noexcept = default;
SigningKey::~SigningKey() = default;

SigningKey SigningKey::Generate() {
  auto key = std::make_unique<Pkey>();
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  const bool ok =
      ctx != nullptr && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key->p) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok) throw Error(ErrorKind::kUnavailable, "Ed25519 key generation failed");
  return SigningKey(std::move(key));
}

SigningKey SigningKey::LoadOrCreate(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    auto key = std::make_unique<Pkey>();
    key->p = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    if (key->p == nullptr || EVP_PKEY_id(key->p) != EVP_PKEY_ED25519) {
      ThrowInvalidArgument("node key '" + path + "' is not a PEM Ed25519 private key");
    }
    return SigningKey(std::move(key));
  }
  SigningKey fresh = Generate();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  FILE* f = fd < 0 ? nullptr : fdopen(fd, "wb");
  const bool ok = f != nullptr && PEM_write_PrivateKey(f, fresh.key_->p, nullptr, nullptr, 0,
                                                       nullptr, nullptr) == 1;
  const std::string why = std::strerror(errno);
  if (f != nullptr) std::fclose(f);
  if (!ok) throw Error(ErrorKind::kUnavailable, "cannot write node key '" + path + "': " + why);
  return fresh;
}

std::string SigningKey::Sign(std::string_view message) const {
  std::string sig(kSignatureBytes, '\0');
  size_t n = sig.size();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok =
      ctx != nullptr && EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key_->p) == 1 &&
      EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &n,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  if (!ok || n != kSignatureBytes) throw Error(ErrorKind::kUnavailable, "Ed25519 signing failed");
  return sig;
}

bool VerifySignature(std::string_view public_key, std::string_view message,
                     std::string_view signature) {
  if (public_key.size() != kPublicKeyBytes || signature.size() != kSignatureBytes) return false;
  EVP_PKEY* p = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_key.data()),
      public_key.size());
  if (p == nullptr) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok =
      ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, p) == 1 &&
      EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(p);
  return ok;
}

std::string ToHex(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::string FromHex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) ThrowInvalidArgument("hex string of odd length");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) ThrowInvalidArgument("not a hex string");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace meshnet
