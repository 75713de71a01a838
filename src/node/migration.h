// Session migration: one session's hot KV state as a verified, chunked
// transfer between two nodes of the same model, layer range and KV recipe.
//
// An export is a header (identity, range, recipe fingerprint, dtype, shapes,
// session id, the SHA-256 binding of its secret — never the secret itself —,
// epoch, seq_len), then chunks in position order, then a trailer. Chunk i holds
// positions [first_position, first_position + n_positions) of every owned
// layer: per owned layer, the K rows then the V rows, in the recipe's KV dtype,
// with a CRC32C of its bytes. The trailer carries a session digest: CRC32C over
// the header's canonical fields and every chunk's CRC32C in order, so a
// dropped, repeated or reordered chunk fails it (CRC32C rather than SHA-256:
// hardware-fast, and the transfer runs over the cluster's authenticated
// channel; the checksums catch corruption, the token/TLS keep out forgers).
//
// SessionExporter reads a pinned session (NodeCore::BeginExport). It never
// writes. SessionImporter verifies the header against this node at creation,
// each chunk as it arrives into a staging buffer, and the trailer at the end;
// only then does NodeCore::CommitImport load the rows into the KV manager.
//
// Thread-safety: an exporter or importer is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kv/hot_kv_state.h"
#include "node/step.h"
#include "util/dtype.h"

namespace meshnet::node {

struct SessionExportHeader {
  std::string model_id;
  std::string architecture;
  int start_layer = 0;
  int end_layer = 0;
  int total_layers = 0;
  std::string recipe_fingerprint;
  KvDtype kv_dtype = KvDtype::kF32;
  int n_kv_heads = 0;
  int head_dim = 0;
  std::string session_id;
  std::string secret_sha256;  // 32 raw bytes
  int64_t route_epoch = 0;
  int64_t seq_len = 0;
  int64_t positions_per_chunk = 0;
  int64_t n_chunks = 0;
  int64_t bytes_per_token = 0;

  int num_layers() const { return end_layer - start_layer + 1; }
  int64_t row_bytes() const { return int64_t{n_kv_heads} * head_dim * KvDtypeSize(kv_dtype); }
};

struct KvChunk {
  int64_t index = 0;
  int64_t first_position = 0;
  int64_t n_positions = 0;
  std::string data;
  uint32_t crc32c = 0;
};

struct ExportTrailer {
  uint32_t session_digest = 0;
  int64_t total_bytes = 0;
};

// The running session digest: header fields, then each chunk's CRC32C.
class SessionDigest {
 public:
  explicit SessionDigest(const SessionExportHeader& h);
  void AddChunk(uint32_t chunk_crc);
  uint32_t value() const { return crc_; }

 private:
  uint32_t crc_ = 0;
};

// Bytes of KV a chunk target aims at (the last chunk may be smaller).
inline constexpr int64_t kChunkTargetBytes = int64_t{1} << 20;

// A test hook: when set (env MESHNET_TEST_CORRUPT_EXPORT=K on a node), the
// K-th export of the process (0-based) flips one byte of one chunk after its
// checksum was taken, as a corrupting network would.
int64_t CorruptExportIndexFromEnv();

class SessionExporter {
 public:
  // `handle` pins the session; `header` describes it (seq_len and chunking
  // filled in here from the handle). `on_done` runs at destruction (the
  // NodeCore releases its claim on the session).
  SessionExporter(kv::SessionHandle handle, SessionExportHeader header, bool corrupt,
                  std::function<void()> on_done);
  ~SessionExporter();
  SessionExporter(const SessionExporter&) = delete;
  SessionExporter& operator=(const SessionExporter&) = delete;

  const SessionExportHeader& header() const { return header_; }
  // Fills the next chunk (reusing `chunk`'s buffer); false after the last.
  bool Next(KvChunk* chunk);
  // Starts over from the first chunk (another target after a refusal).
  void Rewind();
  // Valid after Next returned false.
  ExportTrailer trailer() const { return {digest_.value(), total_bytes_}; }

 private:
  kv::SessionHandle handle_;
  SessionExportHeader header_;
  bool corrupt_;
  std::function<void()> on_done_;
  std::vector<ops::PagedKvLayer> layers_;
  SessionDigest digest_;
  int64_t next_ = 0;
  int64_t total_bytes_ = 0;
};

// What this node accepts: its own identity, range and recipe.
struct ImportLimits {
  SessionExportHeader self;  // session fields unused
  int64_t max_tokens = 0;    // the model's context length
  int64_t budget_bytes = 0;  // the node's whole KV budget
};

class SessionImporter {
 public:
  // Verifies `header` against `limits` (Error kIncompatibleRecipe for another
  // model, range, recipe, dtype or shape; kInvalidArgument for a malformed
  // header; kBudgetExceeded for a session larger than the budget).
  SessionImporter(SessionExportHeader header, const ImportLimits& limits);
  ~SessionImporter();
  SessionImporter(const SessionImporter&) = delete;
  SessionImporter& operator=(const SessionImporter&) = delete;

  const SessionExportHeader& header() const { return header_; }
  // Verifies the chunk (index, positions, size, CRC32C of the bytes as
  // staged) and stages its bytes (a copy: the caller keeps its buffer).
  // Error(kInvalidArgument) naming the problem.
  void Add(const KvChunk& chunk);
  // Verifies that every chunk came and the digest and byte count match.
  void Finish(const ExportTrailer& trailer);
  bool finished() const { return finished_; }
  int64_t chunks() const { return next_; }
  int64_t bytes() const { return staged_bytes_; }
  // Copies the staged rows into a step reserving [0, seq_len) (after Finish).
  void WriteInto(const kv::KvStep& step) const;

 private:
  SessionExportHeader header_;
  SessionDigest digest_;
  // The session's bytes in chunk order, mapped at the first chunk (one
  // anonymous mapping of seq_len * bytes_per_token, transparent huge pages:
  // ~37 first-touch faults for a 1,000-token 768-dim session instead of
  // ~18,000 for that many 1 MiB heap buffers); unmapped on destruction.
  uint8_t* staging_ = nullptr;
  size_t staging_mapped_ = 0;
  int64_t staged_bytes_ = 0;
  int64_t next_ = 0;
  bool finished_ = false;
};

}  // namespace meshnet::node
