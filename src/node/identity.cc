#include "node/identity.h"

#include <openssl/rand.h>

#include "util/error.h"
#include "util/hash.h"

namespace meshnet::node {

std::string ModelIdentity(const gguf::GgufFile& file) {
  // The header, metadata and tensor table (everything before the tensor data)
  // plus the file size: hashing the weights would page in every layer, which a
  // shard must not do. make-model records its seed in the metadata, so random
  // models of equal shape still differ.
  Sha256 h;
  const auto& t = file.tensors();
  const uint64_t size = file.file_size();
  h.Update(&size, sizeof size);
  for (const auto& e : file.metadata()) {
    h.Update(e.key.data(), e.key.size());
    const std::string v = e.value.ToString(1u << 20);
    h.Update(v.data(), v.size());
  }
  for (const auto& ti : t) {
    h.Update(ti.name.data(), ti.name.size());
    h.Update(&ti.type, sizeof ti.type);
    h.Update(ti.ne.data(), sizeof(int64_t) * ti.ne.size());
    h.Update(&ti.offset, sizeof ti.offset);
  }
  return h.HexDigest();
}

std::string RandomId128() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    throw Error(ErrorKind::kUnavailable, "RAND_bytes failed");
  static const char* kHex = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = kHex[bytes[i] >> 4];
    out[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return out;
}

bool IsSessionId(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void ValidateSessionKey(const std::string& session_id, const std::string& secret,
                        int64_t route_epoch) {
  if (!IsSessionId(session_id)) {
    ThrowInvalidArgument("session id must be 32 lowercase hex characters (128 random bits)");
  }
  if (secret.empty() || secret.size() > 256) {
    ThrowInvalidArgument("session secret must hold 1..256 bytes");
  }
  if (route_epoch < 0) ThrowInvalidArgument("route epoch must be >= 0");
}

}  // namespace meshnet::node
