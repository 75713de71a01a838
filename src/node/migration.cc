#include "node/migration.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

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
  // The dtype first: a q8_0 session offered to an f16 node is refused by name
  // (its fingerprint differs too).
  CheckSame("KV dtype", std::string(KvDtypeName(h.kv_dtype)),
            std::string(KvDtypeName(self.kv_dtype)));
  CheckSame("KV recipe fingerprint", h.recipe_fingerprint, self.recipe_fingerprint);
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
  chunk->index = next_;
  chunk->first_position = p0;
  chunk->n_positions = n;
  chunk->data.resize(static_cast<size_t>(n * header_.bytes_per_token));
  char* dst = chunk->data.data();
  // Each run (one paged block's rows) is checksummed right after its copy,
  // while it is in cache (one pass instead of two; the same CRC as over the
  // whole chunk).
  uint32_t crc = 0;
  ForEachRowRun(layers_, p0, n, [&](const uint8_t* src, size_t len) {
    std::memcpy(dst, src, len);
    crc = Crc32cExtend(crc, dst, len);
    dst += len;
  });
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

bool SessionExporter::NextRuns(ChunkMeta* meta,
                               std::vector<std::pair<const uint8_t*, size_t>>* runs) {
  if (next_ >= header_.n_chunks) return false;
  const int64_t p0 = next_ * header_.positions_per_chunk;
  const int64_t n = std::min(header_.positions_per_chunk, header_.seq_len - p0);
  runs->clear();
  uint32_t crc = 0;
  ForEachRowRun(layers_, p0, n, [&](const uint8_t* src, size_t len) {
    crc = Crc32cExtend(crc, src, len);
    runs->emplace_back(src, len);
  });
  *meta = ChunkMeta{next_, p0, n, n * header_.bytes_per_token, crc};
  digest_.AddChunk(crc);
  total_bytes_ += meta->bytes;
  if (corrupt_ && next_ == header_.n_chunks / 2) {
    // The rows are never written: flip a byte of a copy of the middle run.
    auto& run = (*runs)[runs->size() / 2];
    corrupted_run_.assign(reinterpret_cast<const char*>(run.first), run.second);
    corrupted_run_[corrupted_run_.size() / 2] ^= 0x01;
    run.first = reinterpret_cast<const uint8_t*>(corrupted_run_.data());
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
  if (!abandon_) return;
  step_.Rollback();  // before the session it reserves in is released
  abandon_();
}

void SessionImporter::Reserve(kv::KvStep step, std::function<void()> abandon,
                              std::function<void()> publish) {
  step_ = std::move(step);
  abandon_ = std::move(abandon);
  publish_ = std::move(publish);
  layers_.clear();
  for (int l = header_.start_layer; l <= header_.end_layer; ++l) layers_.push_back(step_.Layer(l));
}

void SessionImporter::Publish() {
  abandon_ = nullptr;
  if (publish_) std::exchange(publish_, nullptr)();
}

std::pair<int64_t, int64_t> SessionImporter::CheckNext(const ChunkMeta& c) const {
  if (finished_) ThrowInvalidArgument("import refused: a chunk after the trailer");
  if (!step_.valid()) ThrowInvalidArgument("import refused: no rows reserved");
  const int64_t p0 = next_ * header_.positions_per_chunk;
  const int64_t n = std::min(header_.positions_per_chunk, header_.seq_len - p0);
  if (next_ >= header_.n_chunks || c.index != next_ || c.first_position != p0 ||
      c.n_positions != n) {
    ThrowInvalidArgument("import refused: chunk " + std::to_string(c.index) + " (positions " +
                         std::to_string(c.first_position) + "+" + std::to_string(c.n_positions) +
                         ") out of order; expected chunk " + std::to_string(next_));
  }
  if (c.bytes != n * header_.bytes_per_token) {
    ThrowInvalidArgument("import refused: chunk " + std::to_string(c.index) + " holds " +
                         std::to_string(c.bytes) + " bytes, expected " +
                         std::to_string(n * header_.bytes_per_token));
  }
  return {p0, n};
}

void SessionImporter::Accept(const ChunkMeta& c, uint32_t crc) {
  // A mismatch throws with the step still uncommitted: it is rolled back.
  if (crc != c.crc32c) {
    ThrowInvalidArgument("import refused: CRC32C mismatch in chunk " + std::to_string(c.index) +
                         " (corrupted in transfer); nothing loaded");
  }
  digest_.AddChunk(c.crc32c);
  staged_bytes_ += c.bytes;
  ++next_;
}

void SessionImporter::Add(const KvChunk& c) {
  const ChunkMeta meta{c.index, c.first_position, c.n_positions,
                       static_cast<int64_t>(c.data.size()), c.crc32c};
  const auto [p0, n] = CheckNext(meta);
  // Each run (one paged block's rows) is checksummed right after its copy,
  // while it is in cache; the CRC covers the bytes as they will be read.
  uint32_t crc = 0;
  size_t off = 0;
  ForEachRowRun(layers_, p0, n, [&](uint8_t* dst, size_t len) {
    std::memcpy(dst, c.data.data() + off, len);
    crc = Crc32cExtend(crc, dst, len);
    off += len;
  });
  Accept(meta, crc);
}

void SessionImporter::AddDirect(const ChunkMeta& meta,
                                const std::function<void(const std::vector<Run>&)>& read) {
  const auto [p0, n] = CheckNext(meta);
  runs_.clear();
  ForEachRowRun(layers_, p0, n, [&](uint8_t* dst, size_t len) { runs_.emplace_back(dst, len); });
  read(runs_);
  uint32_t crc = 0;
  for (const auto& [p, len] : runs_) crc = Crc32cExtend(crc, p, len);
  Accept(meta, crc);
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

}  // namespace meshnet::node
