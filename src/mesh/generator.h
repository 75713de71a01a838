// The generation loop: drives one session across a route of shard endpoints,
// with cache-miss recovery and failover.
//
//   * prefill: the whole token history goes through the route (prefill=true,
//     which opens a fresh context on every hop at the current route epoch);
//     with prefill_chunk, a long history goes in pipelined pieces, the first
//     opening the context and the others appending to it;
//   * decode: one token per step, expected_seq_len = tokens already held;
//   * a CacheMiss from any hop: re-prefill from token zero on the same route;
//   * a dead or timed-out hop (Error kUnavailable): mark it dead, re-plan,
//     bump the route epoch, re-prefill. Older-epoch state on surviving hops is
//     superseded (freed) by the newer epoch's open.
//   Recoveries are bounded (max_recoveries) with exponential backoff between
//   failovers. The head keeps the token history, so nothing is lost.
//   * a busy hop (Error kResourceExhausted): wait (backoff with jitter) and
//     send the step again, for up to busy_retry_s; not a recovery.
//   * a preempted session (CacheMiss kPreempted: a hop's KV budget is full of
//     active sessions and an earlier one needed the room): re-prefill at once
//     (the hop holds the prefill until there is room), for up to busy_retry_s
//     since the start; not a recovery.
//   * a hop answering "moved to ADDR" (CacheMiss kMoved, its node drained):
//     the same step goes to ADDR (RouteProvider::EndpointFor), which holds
//     the session's verified KV, and the route keeps ADDR for that hop: no
//     re-prefill, not a recovery. Unknown ADDR: re-prefill as for a miss.
//   * every exit (done, error, cancelled) releases the session on every hop
//     that may hold it.
//
// Thread-safety: Generate() may run concurrently for different sessions when
// the provider and endpoints are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mesh/endpoint.h"
#include "shard/boundary.h"
#include "shard/logit_adjustments.h"

namespace meshnet::mesh {

class CohortCarrier;
class DraftSource;

struct Route {
  std::vector<std::shared_ptr<ShardEndpoint>> hops;  // head first
  std::string Describe() const;                      // "a[0-1] -> b[2-3] -> c[4-4]"
};

class RouteProvider {
 public:
  virtual ~RouteProvider() = default;
  // A route covering layers 0..L-1 that avoids endpoints marked dead. Throws
  // Error(kUnavailable) naming the uncovered layers when none exists.
  virtual Route Plan() = 0;
  virtual void MarkDead(const ShardEndpoint& endpoint) = 0;
  // The endpoint for a node a hop said the session moved to (a drain handed
  // its KV over), or nullptr: then the client re-prefills. Only nodes the
  // provider already knows qualify, so a node cannot redirect a client (and
  // its session secret) to an arbitrary address.
  virtual std::shared_ptr<ShardEndpoint> EndpointFor(const std::string& /*address*/) {
    return nullptr;
  }
  // The carrier of this provider's routes' decode steps (mesh/cohort_carrier.h),
  // or nullptr: each session's step goes hop by hop on its own thread.
  virtual CohortCarrier* carrier() { return nullptr; }
};

// A provider over a fixed route (in-process shards): Plan() returns it until
// a hop is marked dead, then fails. Safe for concurrent sessions.
class FixedRouteProvider final : public RouteProvider {
 public:
  explicit FixedRouteProvider(Route route) : route_(std::move(route)) {}
  Route Plan() override;
  void MarkDead(const ShardEndpoint& endpoint) override;

 private:
  Route route_;
  std::atomic<bool> dead_{false};
};

struct GenerateOptions {
  int max_tokens = 64;
  shard::SamplingContract sampling;
  std::optional<int32_t> eos_id;  // stop when sampled (not emitted)
  std::vector<int32_t> stop_ids;  // also stop on any of these (the tokenizer's EOG ids)
  int max_recoveries = 8;         // re-prefills + failovers per Generate call
  double backoff_initial_s = 0.02;
  double backoff_max_s = 1.0;
  int64_t initial_epoch = 0;
  std::string session_id;      // empty: a fresh random 128-bit id
  std::string session_secret;  // empty: a fresh random 128-bit secret
  bool release_at_end = true;
  // The model's context length (0: unknown). A prompt longer than it is
  // refused (kInvalidArgument); generation stops when it is full
  // (stop_reason "context_length").
  int64_t context_length = 0;
  // A hop answering "busy" (kResourceExhausted: admission control, per-peer
  // limits) is retried with backoff for up to this long in total; such waits
  // are not recoveries.
  double busy_retry_s = 120.0;
  // Polled between steps (e.g. Ctrl-C): when true, Generate releases the
  // session and throws Error(kUnavailable, "cancelled").
  std::function<bool()> cancelled;
  // A prefill longer than this many tokens goes through a route of several
  // hops in pieces of at most this many, pipelined over the hops
  // (mesh/route_step.h); 0: in one step, as on a route of one hop. Bounds
  // every message's activations and, on nodes with cores of their own,
  // overlaps the hops' work on a long prompt.
  int64_t prefill_chunk = 0;
  // Teacher forcing (scoring a text): generated token i is forced_ids[i]
  // whatever the tail sampled (on_logits still sees the logits of that step,
  // on_token and generated_ids the forced token); past the end, sampling as
  // usual. EOS and stop ids end generation as when sampled.
  std::vector<int32_t> forced_ids;
  // Penalties and logit bias (shard/logit_adjustments.h): when active, every
  // step asks the tail for its logits row, and the token is sampled here
  // from the adjusted row with `sampling` at the same position the tail
  // would use. Inactive: the tail's own sample, as without them.
  shard::LogitAdjustments adjustments;
  // Ask the tail for its logits row on every step (for on_logits, e.g.
  // logprobs) even where the transport leaves it out by default.
  bool want_logits = false;
  // A prefix cache hit: the route's hops already hold the first
  // `resume_length` tokens of the prompt (or more) for session_id /
  // session_secret at initial_epoch, from an earlier generation kept with
  // release_at_end = false. Each hop is truncated to it, and only the rest
  // of the prompt is computed (one step). If any hop no longer holds it (or
  // cannot truncate), the whole prompt is prefilled as without it: never a
  // wrong token. 0: a fresh session. Must be less than the prompt's length.
  int64_t resume_length = 0;
  // Speculative decoding: up to this many draft tokens per step (0: off),
  // proposed by prompt lookup (the tokens that followed the latest earlier
  // occurrence of the text's last 3, 2 or 1 tokens; no draft model). The
  // route computes the last token and the drafts in one pass; the tail
  // samples after every row with the sampling contract at that row's
  // position, so the drafts the client keeps are exactly the tokens plain
  // decoding would give (greedy or seeded sampling alike), and the next step
  // has the hops drop the rejected ones. Not with adjustments, forced ids,
  // want_logits or an on_logits event (their steps decode one token at a
  // time: a verify step answers only its last row's logits).
  int speculate = 0;
  // The drafts' source (with speculate > 0): a small model of the same
  // vocabulary run in this process (mesh/draft.h); null: prompt lookup.
  std::shared_ptr<DraftSource> draft;
};

struct GenerateEvents {
  std::function<void(int32_t token)> on_token;          // each generated token, in order
  std::function<void(const std::string&)> on_recovery;  // a human line per recovery
  // The tail's logits for each sampled token (including one that is EOS).
  std::function<void(std::span<const float> logits)> on_logits;
  // Asked before every step: true ends the generation there (the state is
  // still released when release_at_end). A client that went away or a stop
  // sequence that matched stops within one token this way.
  std::function<bool()> stop_requested;
};

struct GenerateResult {
  std::vector<int32_t> generated_ids;
  int re_prefills = 0;  // after a CacheMiss (preemptions included)
  int preemptions = 0;  // of them, after a CacheMiss kPreempted
  int failovers = 0;    // after a dead hop
  int64_t final_epoch = 0;
  std::string final_route;
  bool stopped = false;     // ended by events.stop_requested
  int busy_retries = 0;     // steps re-sent after a hop was busy
  int moves = 0;            // hops that continued on the node the session moved to
  std::string stop_reason;  // "max_tokens", "eos", "context_length" or "stopped"
  // Prompt positions the hops already held (options.resume_length when the
  // resume worked, else 0).
  int64_t cached_tokens = 0;
  // The tokens whose KV the final route's hops hold at the end: the prompt
  // and the generated tokens fed back so far (a prefix of prompt +
  // generated_ids), and those hops. What a caller keeps to resume from.
  std::vector<int32_t> kv_tokens;
  std::vector<std::shared_ptr<ShardEndpoint>> final_hops;
  // Speculation: steps that carried drafts, drafts sent, drafts accepted.
  int64_t verify_steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  // Passes through the route (prefills, decode and verify steps, failed ones
  // included) and their wall time on this client. Of them, those whose
  // answer said every hop's compute time (chain forwarding): their wall time
  // and that compute; the rest of their time is links (and queues).
  int64_t route_passes = 0;
  double route_seconds = 0;
  int64_t measured_passes = 0;
  double measured_seconds = 0;
  double measured_compute_seconds = 0;
};

GenerateResult Generate(RouteProvider& provider, std::span<const int32_t> prompt_ids,
                        const GenerateOptions& options, const GenerateEvents& events = {});

}  // namespace meshnet::mesh
