// Bounds of count flags, shared by the subcommands (see also cli/common.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

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

}  // namespace meshnet::cli
