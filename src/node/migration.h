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
// writes. SessionImporter verifies the header against this node at creation;
// NodeCore::BeginImport then reserves the session's rows in the KV manager
// (an uncommitted step: invisible, counted against the budget). Each chunk is
// written into those rows as it arrives and checked, the trailer at the end;
// only NodeCore::CommitImport publishes the rows. Anything short of that
// rolls the step back: nothing unverified is ever loaded.
//
// Thread-safety: an exporter or importer is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
  int64_t row_bytes() const { return KvRowBytes(kv_dtype, n_kv_heads, head_dim); }
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

// What a chunk says of itself; its bytes come with it (Add) or are read
// straight into the session's rows (AddDirect).
struct ChunkMeta {
  int64_t index = 0;
  int64_t first_position = 0;
  int64_t n_positions = 0;
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Calls fn(pointer, bytes) over the rows of positions [p0, p0 + n) of every
// layer in `layers`, in wire order (per layer its K rows, then its V rows),
// merging rows that lie back to back in memory (one paged block's) into one
// run.
template <typename Fn>
void ForEachRowRun(const std::vector<ops::PagedKvLayer>& layers, int64_t p0, int64_t n, Fn&& fn) {
  uint8_t* run = nullptr;
  size_t len = 0;
  auto add = [&](uint8_t* row, size_t bytes) {
    if (run != nullptr && run + len == row) {
      len += bytes;
      return;
    }
    if (run != nullptr) fn(run, len);
    run = row;
    len = bytes;
  };
  for (const ops::PagedKvLayer& v : layers) {
    for (int64_t p = p0; p < p0 + n; ++p) add(v.KRow(p), v.row_bytes);
    for (int64_t p = p0; p < p0 + n; ++p) add(v.VRow(p), v.row_bytes);
  }
  if (run != nullptr) fn(run, len);
}

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
  // The next chunk without a copy: its bytes as runs of the session's rows
  // (wire order), valid while the exporter lives; false after the last. Use
  // either this or Next for one pass.
  bool NextRuns(ChunkMeta* meta, std::vector<std::pair<const uint8_t*, size_t>>* runs);
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
  std::string corrupted_run_;  // NextRuns' copy of the run the test hook flips
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
  // Rolls the step back and runs the abandon hook unless Publish() ran.
  ~SessionImporter();
  SessionImporter(const SessionImporter&) = delete;
  SessionImporter& operator=(const SessionImporter&) = delete;

  const SessionExportHeader& header() const { return header_; }
  // NodeCore::BeginImport: the rows [0, seq_len) reserved for the session
  // (nothing is visible until the step commits), what undoes the claim if the
  // import does not complete, and what ends it once the step is committed.
  void Reserve(kv::KvStep step, std::function<void()> abandon, std::function<void()> publish);
  // Verifies the chunk (index, positions, size, CRC32C of the bytes as
  // written) and writes its bytes into the reserved rows (a copy: the caller
  // keeps its buffer). Error(kInvalidArgument) naming the problem. A failed
  // import leaves nothing: the step is rolled back with the importer.
  void Add(const KvChunk& chunk);
  // A row run: where in the reserved rows, how many bytes.
  using Run = std::pair<uint8_t*, size_t>;
  // The same for a chunk whose bytes `read` fills into the rows' runs, in
  // wire order (one scattered socket read straight into the rows; `read`
  // throws if the bytes do not come).
  void AddDirect(const ChunkMeta& meta, const std::function<void(const std::vector<Run>&)>& read);
  // Verifies that every chunk came and the digest and byte count match.
  void Finish(const ExportTrailer& trailer);
  bool finished() const { return finished_; }
  int64_t chunks() const { return next_; }
  int64_t bytes() const { return staged_bytes_; }
  // NodeCore::CommitImport: the reserved step (after Finish); Publish runs
  // the publish hook once the step is committed (the abandon hook will not
  // run then).
  kv::KvStep& step() { return step_; }
  void Publish();

 private:
  // Checks `meta` against the next expected chunk; its first position and
  // position count.
  std::pair<int64_t, int64_t> CheckNext(const ChunkMeta& meta) const;
  // Checks the CRC of the rows as written and takes the chunk.
  void Accept(const ChunkMeta& meta, uint32_t crc);

  SessionExportHeader header_;
  SessionDigest digest_;
  kv::KvStep step_;
  std::vector<ops::PagedKvLayer> layers_;  // step_'s rows, one view per owned layer
  std::function<void()> abandon_;
  std::function<void()> publish_;
  std::vector<Run> runs_;  // AddDirect's runs of the current chunk
  int64_t staged_bytes_ = 0;
  int64_t next_ = 0;
  bool finished_ = false;
};

}  // namespace meshnet::node
