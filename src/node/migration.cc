#include "node/migration.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kv/block_pool.h"
#include "node/identity.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace meshnet::node {

namespace {

[[noreturn]] void Incompatible(const std::string& what, const std::string& theirs,
                               const std::string& mine) {
  throw Error(ErrorKind::kIncompatibleRecipe, "import refused: " + what + " differs (exported " +
                                                  theirs + ", this node " + mine + ")");
}

void CheckSame(const char* what, const std::string& theirs, const std::string& mine) {
  if (theirs != mine) Incompatible(what, theirs, mine);
}

void CheckSame(const char* what, int64_t theirs, int64_t mine) {
  if (theirs != mine) Incompatible(what, std::to_string(theirs), std::to_string(mine));
}

// The model, range and KV layout must be this node's.
void CheckIdentity(const SessionExportHeader& h, const SessionExportHeader& self) {
  CheckSame("model id", h.model_id, self.model_id);
  CheckSame("architecture", h.architecture, self.architecture);
  CheckSame("start layer", h.start_layer, self.start_layer);
  CheckSame("end layer", h.end_layer, self.end_layer);
  CheckSame("total layers", h.total_layers, self.total_layers);
  CheckSame("KV recipe fingerprint", h.recipe_fingerprint, self.recipe_fingerprint);
  CheckSame("KV dtype", std::string(KvDtypeName(h.kv_dtype)),
            std::string(KvDtypeName(self.kv_dtype)));
  CheckSame("KV heads", h.n_kv_heads, self.n_kv_heads);
  CheckSame("head dim", h.head_dim, self.head_dim);
  CheckSame("bytes per token", h.bytes_per_token, self.bytes_per_token);
}

void CheckShape(const SessionExportHeader& h, const ImportLimits& limits) {
  if (!IsSessionId(h.session_id)) ThrowInvalidArgument("import refused: malformed session id");
  if (h.secret_sha256.size() != 32) {
    ThrowInvalidArgument("import refused: the secret binding is not a 32-byte SHA-256");
  }
  if (h.route_epoch < 0) ThrowInvalidArgument("import refused: negative route epoch");
  if (h.seq_len < 1 || h.seq_len > limits.max_tokens) {
    ThrowInvalidArgument("import refused: seq_len " + std::to_string(h.seq_len) + " outside 1.." +
                         std::to_string(limits.max_tokens));
  }
  if (h.positions_per_chunk < 1 || h.positions_per_chunk > h.seq_len ||
      h.n_chunks != (h.seq_len + h.positions_per_chunk - 1) / h.positions_per_chunk) {
    ThrowInvalidArgument("import refused: inconsistent chunking (" +
                         std::to_string(h.positions_per_chunk) + " positions per chunk, " +
                         std::to_string(h.n_chunks) + " chunks for " + std::to_string(h.seq_len) +
                         " positions)");
  }
  if (h.seq_len * h.bytes_per_token > limits.budget_bytes) {
    throw Error(ErrorKind::kBudgetExceeded,
                "import refused: " + std::to_string(h.seq_len * h.bytes_per_token) +
                    " bytes of KV exceed this node's budget of " +
                    std::to_string(limits.budget_bytes));
  }
}

}  // namespace

SessionDigest::SessionDigest(const SessionExportHeader& h) {
  auto mix = [this](const void* p, size_t n) { crc_ = Crc32cExtend(crc_, p, n); };
  const std::string text = h.model_id + '\0' + h.architecture + '\0' + h.recipe_fingerprint + '\0' +
                           h.session_id + '\0' + h.secret_sha256;
  mix(text.data(), text.size());
  const int64_t nums[] = {
      h.start_layer,         h.end_layer, h.total_layers,   static_cast<int64_t>(h.kv_dtype),
      h.n_kv_heads,          h.head_dim,  h.route_epoch,    h.seq_len,
      h.positions_per_chunk, h.n_chunks,  h.bytes_per_token};
  mix(nums, sizeof nums);
}

void SessionDigest::AddChunk(uint32_t chunk_crc) {
  crc_ = Crc32cExtend(crc_, &chunk_crc, sizeof chunk_crc);
}

int64_t CorruptExportIndexFromEnv() {
  const char* v = std::getenv("MESHNET_TEST_CORRUPT_EXPORT");
  if (v == nullptr || *v == '\0') return -1;
  return std::strtoll(v, nullptr, 10);
}

// --- SessionExporter -----------------------------------------------------------

namespace {
SessionExportHeader WithChunking(SessionExportHeader h, int64_t seq_len) {
  h.seq_len = seq_len;
  h.positions_per_chunk =
      std::clamp<int64_t>(kChunkTargetBytes / std::max<int64_t>(h.bytes_per_token, 1), 1,
                          std::max<int64_t>(seq_len, 1));
  h.n_chunks = (seq_len + h.positions_per_chunk - 1) / h.positions_per_chunk;
  return h;
}
}  // namespace

SessionExporter::SessionExporter(kv::SessionHandle handle, SessionExportHeader header, bool corrupt,
                                 std::function<void()> on_done)
    : handle_(std::move(handle)),
      header_(WithChunking(std::move(header), handle_.seq_len())),
      corrupt_(corrupt),
      on_done_(std::move(on_done)),
      digest_(header_) {
  for (int l = header_.start_layer; l <= header_.end_layer; ++l) {
    layers_.push_back(handle_.Layer(l));
  }
}

SessionExporter::~SessionExporter() {
  handle_ = kv::SessionHandle();  // unpin before the claim goes
  if (on_done_) on_done_();
}

bool SessionExporter::Next(KvChunk* chunk) {
  if (next_ >= header_.n_chunks) return false;
  const int64_t p0 = next_ * header_.positions_per_chunk;
  const int64_t n = std::min(header_.positions_per_chunk, header_.seq_len - p0);
  const size_t row = static_cast<size_t>(header_.row_bytes());
  chunk->index = next_;
  chunk->first_position = p0;
  chunk->n_positions = n;
  chunk->data.resize(static_cast<size_t>(n * header_.bytes_per_token));
  char* dst = chunk->data.data();
  // Each row is checksummed right after its copy, while it is in L1 (one
  // pass over the chunk instead of two; same CRC as over the whole chunk).
  uint32_t crc = 0;
  auto copy = [&](const void* src) {
    std::memcpy(dst, src, row);
    crc = Crc32cExtend(crc, dst, row);
    dst += row;
  };
  for (const ops::PagedKvLayer& v : layers_) {
    for (int64_t p = p0; p < p0 + n; ++p) copy(v.KRow(p));
    for (int64_t p = p0; p < p0 + n; ++p) copy(v.VRow(p));
  }
  chunk->crc32c = crc;
  digest_.AddChunk(chunk->crc32c);
  total_bytes_ += static_cast<int64_t>(chunk->data.size());
  if (corrupt_ && next_ == header_.n_chunks / 2) {
    chunk->data[chunk->data.size() / 2] ^= 0x01;
    corrupt_ = false;  // one corrupted transfer
  }
  ++next_;
  return true;
}

void SessionExporter::Rewind() {
  next_ = 0;
  total_bytes_ = 0;
  digest_ = SessionDigest(header_);
}

// --- SessionImporter -----------------------------------------------------------

SessionImporter::SessionImporter(SessionExportHeader header, const ImportLimits& limits)
    : header_((CheckIdentity(header, limits.self), CheckShape(header, limits), std::move(header))),
      digest_(header_) {}

SessionImporter::~SessionImporter() {
  if (staging_ != nullptr) munmap(staging_, staging_mapped_);
}

void SessionImporter::Add(const KvChunk& c) {
  if (finished_) ThrowInvalidArgument("import refused: a chunk after the trailer");
  const int64_t p0 = next_ * header_.positions_per_chunk;
  const int64_t n = std::min(header_.positions_per_chunk, header_.seq_len - p0);
  if (next_ >= header_.n_chunks || c.index != next_ || c.first_position != p0 ||
      c.n_positions != n) {
    ThrowInvalidArgument("import refused: chunk " + std::to_string(c.index) + " (positions " +
                         std::to_string(c.first_position) + "+" + std::to_string(c.n_positions) +
                         ") out of order; expected chunk " + std::to_string(next_));
  }
  if (static_cast<int64_t>(c.data.size()) != n * header_.bytes_per_token) {
    ThrowInvalidArgument("import refused: chunk " + std::to_string(c.index) + " holds " +
                         std::to_string(c.data.size()) + " bytes, expected " +
                         std::to_string(n * header_.bytes_per_token));
  }
  if (staging_ == nullptr) {  // bounded by the budget (CheckShape)
    staging_ = kv::MapAnonymous(static_cast<size_t>(header_.seq_len * header_.bytes_per_token),
                                &staging_mapped_);
  }
  // Copy and checksum in one pass over the chunk: each piece is checksummed
  // right after its copy, while it is in cache, and the CRC covers the bytes
  // as staged (what WriteInto loads).
  constexpr size_t kPiece = size_t{64} << 10;
  uint8_t* dst = staging_ + p0 * header_.bytes_per_token;
  uint32_t crc = 0;
  for (size_t off = 0; off < c.data.size(); off += kPiece) {
    const size_t len = std::min(kPiece, c.data.size() - off);
    std::memcpy(dst + off, c.data.data() + off, len);
    crc = Crc32cExtend(crc, dst + off, len);
  }
  if (crc != c.crc32c) {
    ThrowInvalidArgument("import refused: CRC32C mismatch in chunk " + std::to_string(c.index) +
                         " (corrupted in transfer); nothing loaded");
  }
  digest_.AddChunk(c.crc32c);
  staged_bytes_ += static_cast<int64_t>(c.data.size());
  ++next_;
}

void SessionImporter::Finish(const ExportTrailer& t) {
  if (next_ != header_.n_chunks) {
    ThrowInvalidArgument("import refused: " + std::to_string(next_) + " of " +
                         std::to_string(header_.n_chunks) + " chunks arrived");
  }
  if (t.session_digest != digest_.value() || t.total_bytes != bytes()) {
    ThrowInvalidArgument(
        "import refused: the session digest does not match the header and "
        "chunks; nothing loaded");
  }
  finished_ = true;
}

void SessionImporter::WriteInto(const kv::KvStep& step) const {
  if (!finished_) ThrowInvalidArgument("import not verified");
  const size_t row = static_cast<size_t>(header_.row_bytes());
  const uint8_t* src = staging_;  // chunk after chunk, each K then V per layer
  for (int64_t i = 0; i < next_; ++i) {
    const int64_t p0 = i * header_.positions_per_chunk;
    const int64_t n = std::min(header_.positions_per_chunk, header_.seq_len - p0);
    for (int l = header_.start_layer; l <= header_.end_layer; ++l) {
      const ops::PagedKvLayer v = step.Layer(l);
      for (int64_t p = p0; p < p0 + n; ++p, src += row) std::memcpy(v.KRow(p), src, row);
      for (int64_t p = p0; p < p0 + n; ++p, src += row) std::memcpy(v.VRow(p), src, row);
    }
  }
}

}  // namespace meshnet::node
