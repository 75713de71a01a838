// Many sessions from one client process at once: the multi-session driver
// behind `meshnet generate --sessions N`, the benchmarks, and a library API for
// a gateway.
//
//   mesh::MultiSessionDriver driver(provider, {.max_in_flight = 64});
//   mesh::MultiSessionReport r = driver.Run(prompts, gen_options);
//   r.sessions[i].result.generated_ids;  r.TokensPerSecond();  r.InterTokenPercentile(0.99);
//
// How it keeps every hop busy: each session runs the ordinary generation loop
// (mesh::Generate: the same miss recovery, failover, busy retries and release
// on every exit path as a solo run) on one of a bounded set of worker threads
// (max_in_flight; the calling thread is one of them). All sessions share the
// provider and so its endpoints: over gRPC one channel per node for every
// session. Sessions are independent, so while session A's step runs on hop 2,
// session B's runs on hop 1: a route of H hops has up to H steps computing at
// once (pipelining), and a node that batches (node/ scheduler) sees up to
// max_in_flight steps to batch. No thread is started per token or per step;
// a session beyond max_in_flight waits for a worker (first come, first
// served), so with max_in_flight >= the number of sessions all of them are live
// at once.
//
// Why threads and not the gRPC async API: ShardEndpoint::Step is synchronous
// (in-process hops compute on the calling thread), and the generation loop's
// recovery logic is shared with solo runs; a worker blocked in a step costs a
// stack, not a core.
//
// Thread-safety: the provider and its endpoints must be safe for concurrent
// sessions (FixedRouteProvider, RemoteRouteProvider and the in-process and
// remote endpoints are). Run() may be called from one thread at a time per
// driver; it returns after every session has ended and every worker is joined.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mesh/generator.h"
#include "util/error.h"

namespace meshnet::mesh {

struct MultiSessionOptions {
  // Sessions generating at once (worker threads, the caller included);
  // 0: every session at once. Bounded by kMaxInFlight.
  int max_in_flight = 0;
  static constexpr int kMaxInFlight = 1024;
};

struct MultiSessionEvents {
  // Each generated token of session `session` (called on that session's
  // worker thread, so calls for different sessions may run concurrently).
  std::function<void(int session, int32_t token)> on_token;
  // Asked before each step of session `session`: true ends it there (as
  // GenerateEvents::stop_requested; the outcome is ok, stop_reason "stopped").
  std::function<bool(int session)> stop_requested;
};

// What happened to one session. Times are seconds since Run() started.
struct SessionOutcome {
  GenerateResult result;  // meaningful when ok
  bool ok = false;
  std::optional<ErrorKind> error_kind;  // when !ok and it was a meshnet::Error
  std::string error;                    // the exception's message when !ok
  double started_s = 0;
  double finished_s = 0;
  std::vector<double> token_times_s;  // one per generated token

  // First token minus start (-1 without tokens).
  double TimeToFirstToken() const;
};

struct MultiSessionReport {
  std::vector<SessionOutcome> sessions;  // parallel to the prompts
  double wall_s = 0;

  int64_t TotalTokens() const;
  int failed() const;
  double TokensPerSecond() const;  // all generated tokens / wall time
  // Every gap between consecutive tokens of a session, over all sessions.
  std::vector<double> InterTokenGaps() const;
  std::vector<double> TimesToFirstToken() const;
};

// The q-quantile (0..1, nearest rank) of `values` (0 when empty).
double Percentile(std::vector<double> values, double q);

class MultiSessionDriver {
 public:
  // `provider` must outlive the driver. Throws kInvalidArgument for a bad
  // max_in_flight.
  MultiSessionDriver(RouteProvider& provider, MultiSessionOptions options);

  // One session per prompt, each with `options` (a fresh session id and
  // secret each; options.session_id/secret must be empty). A session that
  // fails (bad prompt, unreachable route, cancelled) is reported in its
  // outcome and does not stop the others. If the OS refuses worker threads,
  // fewer sessions run at once (the caller's thread always runs them).
  MultiSessionReport Run(std::span<const std::vector<int32_t>> prompts,
                         const GenerateOptions& options, const MultiSessionEvents& events = {});

 private:
  RouteProvider& provider_;
  MultiSessionOptions options_;
};

}  // namespace meshnet::mesh
