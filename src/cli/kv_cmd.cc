// meshnet kv replay: replays a KV trace (../../shared/spec/kv-trace.md) through
// one HotKvStateManager on a fake clock, one JSON result line per op.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "kvtrace/trace_replay.h"
#include "util/error.h"

namespace meshnet::cli {
namespace {

constexpr const char* kReplayHelp = R"(
Reads a KV trace (JSON Lines, one op a line; the first op is `config`) and
writes one compact JSON result per op, in order, byte-identical to the
reference replayer seed_replay.py (contract: spec/kv-trace.md):

  config    {"ok":true,"fingerprint":HEX,"bytes_per_token":N}
  open      {"ok":true,"seq_len":0}
  append    {"ok":true,"seq_len":N}         truncate  {"ok":true,"seq_len":N}
  release   {"ok":true,"released":BOOL}
  resolve   {"ok":true,"seq_len":N,"checksum":C} or {"miss":REASON}
  get       like resolve; a miss is {"error":"cache-miss","reason":REASON}
  stats     {"ok":true,"sessions":N,"total_bytes":B,"keys":[[ID,EPOCH],...]}
  errors    {"error":"stale-epoch"|"incompatible-recipe"|"budget-exceeded"|
                     "invalid-argument"}

Blank lines are skipped. A line that is longer than 1 MiB, is not valid JSON
(or UTF-8), is not an object, lacks a required field, or has a "t" that
Python's float() refuses yields {"error":"invalid-argument"} and the replay
goes on; such a line changes nothing (not even the clock). Python's typing is mirrored (a bool is not an
int for epoch/tokens, a float epoch is invalid, expected_seq_len is compared
with Python's `!=`, a second config re-creates the manager).

Where this replayer knowingly differs from the reference:
  * block_tokens: the reference accepts only 1; any int >= 1 is accepted and
    given to the manager, which then counts reserved blocks (results are no
    longer expected to match the reference byte for byte);
  * kv_dtype: float32/float16 and their numpy aliases, plus bfloat16, q8_0
    and q4_0 (ours); other numpy dtypes (float64, int8, null, ...) are
    invalid-argument. q8_0 / q4_0 need int n_kv_heads and head_dim; their
    bytes_per_token is 2 * n_kv_heads * head_bytes * owned layers, head_bytes
    = 2 * ceil(head_dim / 32) + head_dim (q8_0) or + the 4-bit codes' bytes,
    ceil(n / 2) per block of n (q4_0); appended rows are the float32 values
    quantized per head and the checksum is over their dequantized values;
  * values a C++ manager cannot hold are invalid-argument: epochs or tokens
    beyond int64, recipe fields beyond int32, non-integral float n_kv_heads /
    head_dim in config;
  * "t" must not decrease (spec); the manager clamps its clock to the largest
    value seen, the reference would go back in time;
  * the manager remembers the latest epoch of at most 65536 session ids
    without live state (the reference remembers every id forever): a trace
    with more distinct idle ids may see an old id's lower epoch accepted
    where the reference answers stale-epoch;
  * where the reference crashes instead of answering (MemoryError on a huge
    append, int(inf) as a truncate length, a lone surrogate id in stats), this
    replayer answers (invalid-argument; invalid-argument after the lookup; a
    \udxxx escape).

Exit status: 0 after replaying the whole trace (error results included),
1 if reading or writing failed midway, 2 for a bad command line or an input
that cannot be opened or is a directory.)";

void SetupKv(CLI::App* kv, int* exit_code) {
  kv->require_subcommand(1);
  CLI::App* replay = kv->add_subcommand(
      "replay", "Replay a KV trace (JSONL on stdin) through a HotKvStateManager on a fake clock");
  struct Flags {
    std::string input = "-";
    std::string output = "-";
    std::string append_path = "append";
  };
  auto flags = std::make_shared<Flags>();
  replay->add_option("-i,--input", flags->input, "Trace file to read ('-' = stdin)")
      ->capture_default_str();
  replay->add_option("-o,--output", flags->output, "Where to write results ('-' = stdout)")
      ->capture_default_str();
  replay
      ->add_option("--append-path", flags->append_path,
                   "How appends reach the manager: 'append' (Append with float32 rows, "
                   "the reference API) or 'step' (BeginStep, rows written in place, Commit); "
                   "both give identical results")
      ->check(CLI::IsMember({"append", "step"}))
      ->capture_default_str();
  replay->footer(kReplayHelp);
  replay->callback([flags, exit_code] {
    const kv::ReplayAppendPath path =
        flags->append_path == "step" ? kv::ReplayAppendPath::kStep : kv::ReplayAppendPath::kAppend;
    std::ios::sync_with_stdio(false);
    std::ifstream in_file;
    std::istream* in = &std::cin;
    if (flags->input != "-") {
      // A directory opens as a stream that fails on the first read (exit 1);
      // it is an unreadable file, exit 2 like any other.
      std::error_code ec;
      if (std::filesystem::is_directory(flags->input, ec)) {
        throw Error(ErrorKind::kInvalidArgument, "cannot read " + flags->input + ": a directory");
      }
      in_file.open(flags->input, std::ios::binary);
      if (!in_file) throw Error(ErrorKind::kInvalidArgument, "cannot open " + flags->input);
      in = &in_file;
    }
    std::ofstream out_file;
    std::ostream* out = &std::cout;
    if (flags->output != "-") {
      out_file.open(flags->output, std::ios::binary | std::ios::trunc);
      if (!out_file) throw Error(ErrorKind::kInvalidArgument, "cannot write " + flags->output);
      out = &out_file;
    }
    *exit_code = kv::ReplayStream(*in, *out, path);
    if (*exit_code != 0) std::cerr << "meshnet kv replay: I/O error\n";
  });
}

const CommandRegistrar kKvCommand({"kv", "Hot KV state tools: `kv replay` replays a KV trace",
                                   SetupKv});

}  // namespace
}  // namespace meshnet::cli
