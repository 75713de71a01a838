// One step of one session through every hop of a route, for the generation
// loop (mesh/generator.cc): the plain step (one request per hop, in order) and
// the pipelined prefill of a long prompt in chunks.
//
// Chunked prefill (GenerateOptions::prefill_chunk): a prompt of more than
// `chunk` tokens goes through the route as pieces of at most `chunk` tokens.
// The first piece opens a fresh context on every hop (prefill); the others
// append to it (expected_seq_len = the positions before them), each with its
// own step id. Hop i runs piece k while hop i+1 runs piece k-1, so on a route
// of nodes with cores of their own the prompt takes about one pass plus a
// piece per extra hop rather than one pass per hop, and no message carries
// more than `chunk` rows of activations. Sampling is keyed by position, so the
// output equals the unchunked prefill's. The first failure (a miss, a dead or
// busy hop, an error) stops every hop after its current piece; the caller
// re-prefills from token zero as after any failed prefill.
//
// Threads: hop 0 runs on the caller's thread, each further hop on a thread of
// its own for the prefill (hops - 1 threads per chunked prefill, none per
// token), handing bundles on through queues of at most two pieces.
//
// Thread-safety: the endpoints and the provider must be thread-safe (they are
// for concurrent sessions already); the route's hops are replaced only by the
// thread that runs that hop (a "moved to" answer).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/cache_miss.h"
#include "mesh/generator.h"

namespace meshnet::mesh {

// The outcome of pushing one step through every hop of the route.
struct StepOutcome {
  std::optional<int32_t> token;             // the tail's sample
  std::vector<int32_t> row_tokens;          // a verify step: the tail's sample after each row
  std::vector<float> logits;                // the tail's logits
  std::optional<kv::CacheMiss> miss;        // some hop lost its state
  const ShardEndpoint* dead_hop = nullptr;  // some hop is unreachable
  std::string dead_reason;
  int moves = 0;                            // hops that followed a "moved to"
  const ShardEndpoint* busy_hop = nullptr;  // some hop refused it for now (admission)
  std::string busy_reason;
  bool interrupted = false;  // a chunked prefill stopped by `stop` between pieces
  // Every hop's compute time as the hops said (a chain's answer), -1: not said.
  int64_t route_compute_micros = -1;
};

// What every request of a session's step carries.
struct StepHead {
  std::string_view session;
  std::string_view secret;
  int64_t epoch = 0;
  const shard::SamplingContract* sampling = nullptr;
  int hops = 0;              // the route's length, told to every node (StepRequest::route_hops)
  bool want_logits = false;  // StepRequest::want_logits (such steps are not carried in cohorts)
  // A decode step of speculative decoding (StepRequest::rewind / verify).
  bool rewind = false;
  bool verify = false;
};

// One step (`prefill`: open a fresh context) of `tokens` through every hop.
StepOutcome RunRouteStep(Route& route, RouteProvider& provider, const StepHead& head,
                         uint64_t step_id, bool prefill, std::span<const int32_t> tokens,
                         std::optional<int64_t> expected);

// The prefill of `tokens` in pieces of at most `chunk` tokens (step ids
// first_step_id, first_step_id + 1, ...; ChunkCount of them), pipelined over
// the hops. `stop` is asked before each piece enters the route; when it says
// true the outcome is `interrupted` (the prefill is incomplete). Errors other
// than the outcomes above are rethrown after every hop's thread has ended.
StepOutcome RunChunkedPrefill(Route& route, RouteProvider& provider, const StepHead& head,
                              uint64_t first_step_id, std::span<const int32_t> tokens,
                              int64_t chunk, const std::function<bool()>& stop);

// Pieces of at most `chunk` (> 0) in `n_tokens`.
int64_t ChunkCount(int64_t n_tokens, int64_t chunk);

}  // namespace meshnet::mesh
