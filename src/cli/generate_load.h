// `meshnet generate --sessions N`: the load mode. N concurrent sessions of
// the same prompt through one client process (mesh::MultiSessionDriver), then
// per-session output and aggregate throughput and latency figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/generator.h"
#include "model/tokenizer.h"

namespace meshnet::cli {

inline constexpr int kMaxLoadSessions = 1024;  // --sessions

// Throws kInvalidArgument (exit 2) for a count outside 1..kMaxLoadSessions.
void CheckLoadSessions(int sessions);

// Runs the load; prints one line per session (text mode: its token count,
// time to first token, a digest of its token ids and its text; json: one
// object) and the aggregate. Returns the exit code: 0, 2 when a session
// failed, 128 + signal when `interrupted()` reports a signal number.
int RunGenerateSessions(mesh::RouteProvider& provider, const model::Tokenizer& tokenizer,
                        const std::vector<int32_t>& prompt_ids,
                        const mesh::GenerateOptions& options, int sessions, bool json,
                        int (*interrupted)());

}  // namespace meshnet::cli
