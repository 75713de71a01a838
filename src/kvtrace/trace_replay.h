// The KV trace replayer behind `meshnet kv replay`.
//
// Contract: ../../../shared/spec/kv-trace.md. Each trace line (one JSON op)
// drives one HotKvStateManager on a FakeClock and yields one compact JSON
// result line, byte-identical to the reference replayer seed_replay.py
// (json.dumps with separators (",", ":") and ensure_ascii=False). Blank lines
// (Python's `not line.strip()`) yield nothing. Lines the reference would crash
// on before touching any state (invalid JSON or UTF-8, a value that is not an
// object, a "t" that float() refuses) yield {"error":"invalid-argument"} and
// change nothing, as the spec requires.
//
// Python typing is mirrored wherever a trace can reach it: a bool is not an
// int for epoch / tokens / layer indices; a float epoch is invalid;
// expected_seq_len is compared with `!=` (true == 1, 2.0 == 2, "2" != 2);
// truncate's length uses int() after the live lookup; config may re-create
// the manager (a failed config keeps the old one); a non-str session id on a
// lookup misses, with Python's key equality (1 == 1.0 == true); the recipe
// fingerprint hashes the trace's values as Python would print them.
//
// Divergences from the reference (documented in `meshnet kv replay --help`):
//  * block_tokens: the reference takes only 1; any int >= 1 is accepted and
//    passed to HotKvStateConfig (byte accounting then counts reserved blocks);
//  * kv_dtype: float32 and float16 and their numpy aliases ("f4", "<f4",
//    "single", "e", "half", ...) as in the reference, plus "bfloat16" (ours);
//    other numpy dtypes (float64, int8, null, ...) are invalid-argument;
//  * values the reference accepts but a C++ manager cannot hold are
//    invalid-argument: ints beyond int64 for epochs and tokens, beyond int32
//    for recipe fields, non-integral float head counts / head dims in config;
//  * the manager's latest-epoch memory is bounded (HotKvStateConfig::
//    epoch_history ids without live state; the reference keeps every id);
//  * where the reference crashes instead of answering (MemoryError on huge
//    appends, int(inf) in truncate, writing a lone surrogate) we answer:
//    invalid-argument, invalid-argument after the lookup, a \udxxx escape.
//
// Thread-safety: a TraceReplayer is single-threaded (one per thread).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

namespace meshnet::kv {

// How `append` ops reach the manager. Both must give identical results.
enum class ReplayAppendPath {
  kAppend,  // HotKvStateManager::Append with float32 LayerKv rows (the reference API)
  kStep,    // BeginStep, rows written in place through KvStep::Layer, Commit
};

class TraceReplayer {
 public:
  explicit TraceReplayer(ReplayAppendPath path = ReplayAppendPath::kAppend);
  ~TraceReplayer();
  TraceReplayer(const TraceReplayer&) = delete;
  TraceReplayer& operator=(const TraceReplayer&) = delete;

  // The result of one trace line (without its line terminator), or "" for a
  // blank line.
  std::string Step(std::string_view line);
  // Appends the result and '\n' to *out, or returns false (appending nothing)
  // for a blank line. Reuses internal buffers: no per-op allocation on the
  // replay's own side once they have grown.
  bool StepInto(std::string_view line, std::string* out);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Longest trace line read; a longer one is answered {"error":"invalid-argument"}
// without being held in memory, and the replay goes on with the next line.
inline constexpr size_t kMaxTraceLineBytes = size_t{1} << 20;

// Replays a whole trace: lines split as Python's text mode does (\n, \r\n and
// \r all end a line). Returns 0, or 1 if reading or writing failed.
int ReplayStream(std::istream& in, std::ostream& out,
                 ReplayAppendPath path = ReplayAppendPath::kAppend);

}  // namespace meshnet::kv
