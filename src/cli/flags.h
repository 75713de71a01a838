// Bounds of count flags, shared by the subcommands (see also cli/common.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "node/batcher.h"

namespace meshnet::cli {

// Bounds of count flags, checked at parse time (a pool of 100000 threads or a
// 2^31-token KV block is a typo, not a configuration).
inline constexpr int kMaxThreads = 256;        // --threads (compute)
inline constexpr int kMaxRpcThreads = 1024;    // --rpc-threads
inline constexpr int kMaxBlockTokens = 65536;  // --block-tokens
inline constexpr int64_t kMaxSessions = 1000000;
inline constexpr int kMaxShards = 1024;
inline constexpr int kMaxGenerateTokens = 1000000;

// CLI11 validator: an integer in [lo, hi], with a message naming the range.
CLI::Validator IntRange(int64_t lo, int64_t hi);

// --max-batch-tokens, --max-batch-sessions, --prefill-chunk, --prefill-share
// (node/batcher.h), for `serve` and the in-process route of `generate` and `api`.
struct BatchFlags {
  int64_t max_batch_tokens = node::BatchOptions{}.max_batch_tokens;
  int64_t max_batch_sessions = node::BatchOptions{}.max_batch_sessions;
  int64_t prefill_chunk = node::BatchOptions{}.prefill_chunk;
  double prefill_share = node::BatchOptions{}.prefill_share;
};
// Adds the four flags to `sub` (`whose`: "this node" or "each in-process
// shard", for the help text); returns them (to see which were given).
std::vector<CLI::Option*> AddBatchFlags(CLI::App* sub, BatchFlags* f, const std::string& whose);
// The options, validated: out of range throws kInvalidArgument (exit 2).
node::BatchOptions BatchOptionsFrom(const BatchFlags& f);

}  // namespace meshnet::cli
