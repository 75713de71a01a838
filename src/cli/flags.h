// Flag helpers shared by the subcommands: bounds of count flags, the KV
// dtype spellings, the default model path.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "util/dtype.h"

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

// float32, float16, bfloat16 and the short forms f32/fp32, f16/fp16, bf16.
KvDtype ParseKvDtypeFlag(const std::string& flag, const std::string& value);

// models/stories260K.gguf in the working directory, else in the source tree.
std::string DefaultModelPath();

}  // namespace meshnet::cli
