#include "mesh/route_step.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <limits>
#include <thread>
#include <utility>

#include "mesh/cohort_carrier.h"
#include "util/error.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"
#include "util/transit.h"

namespace meshnet::mesh {

namespace {

// At most this many "moved to" redirects per hop and step (a chain of drains).
constexpr int kMaxMovesPerHop = 4;

// Pieces a hop may have waiting for the next hop (bounds the bundles held).
constexpr size_t kMaxQueuedPieces = 2;

StepRequest MakeRequest(const StepHead& head, uint64_t step_id, bool prefill,
                        std::optional<int64_t> expected) {
  StepRequest req;
  req.session_id = std::string(head.session);
  req.session_secret = std::string(head.secret);
  req.route_epoch = head.epoch;
  req.step_id = step_id;
  req.prefill = prefill;
  req.expected_seq_len = expected;
  req.route_hops = std::min(head.hops, node::kMaxRouteHops);
  if (head.sampling != nullptr) req.sampling = *head.sampling;
  req.want_logits = head.want_logits;
  req.rewind = head.rewind && !prefill;
  req.verify = head.verify && !prefill;
  return req;
}

// Runs `req` on hop i of `route` (or takes `first`, its answer from a
// group call), following "moved to" answers to nodes the provider knows (the
// hop is replaced in `route`). A decode request is kept for the re-send; a
// prefill is not (it is never answered "moved").
StepResult StepHop(Route& route, size_t i, StepRequest req, RouteProvider& provider, int* moves,
                   std::optional<StepResult> first) {
  for (int redirects = 0;; ++redirects) {
    std::optional<StepRequest> again;
    if (!req.prefill) again = req;
    StepResult result = first ? std::move(*first) : route.hops[i]->Step(std::move(req));
    first.reset();
    auto* miss = std::get_if<kv::CacheMiss>(&result);
    if (miss == nullptr || miss->reason != kv::CacheMissReason::kMoved || !again ||
        redirects >= kMaxMovesPerHop) {
      return result;
    }
    std::shared_ptr<ShardEndpoint> next = provider.EndpointFor(miss->moved_to);
    if (!next) return result;
    route.hops[i] = std::move(next);
    ++*moves;
    req = std::move(*again);
  }
}

// What a group call already got for hop i: its answer or its error.
struct Answered {
  std::optional<StepResult> result;
  std::exception_ptr error;
};

// Runs `req` on hop i (or takes `answered`). A busy or unreachable hop is
// recorded in `out` (and nullopt returned); other errors propagate.
// A hop's error as the outcome's busy or dead hop (true); false for any
// other error, which the caller rethrows.
bool NoteHopError(const ShardEndpoint& hop, const Error& e, StepOutcome* out) {
  if (e.kind() == ErrorKind::kResourceExhausted) {
    out->busy_hop = &hop;
    out->busy_reason = e.what();
    return true;
  }
  if (e.kind() != ErrorKind::kUnavailable) return false;
  out->dead_hop = &hop;
  out->dead_reason = e.what();
  return true;
}

std::optional<StepResult> CallHop(Route& route, size_t i, StepRequest req, RouteProvider& provider,
                                  StepOutcome* out, Answered answered = {}) {
  try {
    if (answered.error) std::rethrow_exception(answered.error);
    return StepHop(route, i, std::move(req), provider, &out->moves, std::move(answered.result));
  } catch (const Error& e) {
    if (!NoteHopError(*route.hops[i], e, out)) throw;
    return std::nullopt;
  }
}

// Hop i's answer: a bundle for the next hop (into `bundle`), the tail's token
// (into `out`), or a miss (into `out`; false). A bundle from the last hop or a
// tail output before it break the boundary contract.
bool TakeResult(StepResult result, const Route& route, size_t i, StepOutcome* out,
                std::optional<shard::BoundaryBundle>* bundle) {
  const ShardEndpoint& hop = *route.hops[i];
  const bool last = i + 1 == route.hops.size();
  if (auto* miss = std::get_if<kv::CacheMiss>(&result)) {
    out->miss = std::move(*miss);
    return false;
  }
  if (auto* b = std::get_if<shard::BoundaryBundle>(&result)) {
    if (last) {
      throw Error(ErrorKind::kBoundaryContract,
                  "route ends at " + hop.name() + ", which is not a tail shard");
    }
    *bundle = std::move(*b);
    return true;
  }
  if (!last) {
    throw Error(ErrorKind::kBoundaryContract,
                "hop " + hop.name() + " returned a tail output before the end of the route");
  }
  auto& tail = std::get<shard::TailOutput>(result);
  out->token = tail.token_id;
  out->logits = std::move(tail.logits);
  out->row_tokens = std::move(tail.row_tokens);
  return true;
}

// The pipelined chunked prefill (see route_step.h): hop i's thread runs
// pieces 0..m-1 in order, taking each piece's bundle from queue i.
class PrefillPipeline {
 public:
  PrefillPipeline(Route& route, RouteProvider& provider, const StepHead& head,
                  uint64_t first_step_id, std::span<const int32_t> tokens, int64_t chunk,
                  const std::function<bool()>& stop)
      : route_(route),
        provider_(provider),
        head_(head),
        first_step_id_(first_step_id),
        tokens_(tokens),
        chunk_(chunk),
        pieces_(ChunkCount(static_cast<int64_t>(tokens.size()), chunk)),
        stop_(stop),
        queues_(route.hops.size()),
        moves_(route.hops.size(), 0) {}

  StepOutcome Run() {
    std::vector<std::thread> threads;
    threads.reserve(route_.hops.size());
    try {
      for (size_t i = 1; i < route_.hops.size(); ++i) {
        threads.emplace_back([this, i] { RunHop(i); });
      }
      RunHop(0);
    } catch (...) {  // no thread for a hop: the hops started stop and are joined
      Fail(0, 0, {}, std::current_exception());
    }
    for (auto& t : threads) t.join();
    StepOutcome out;
    {
      MutexLock lock(&mu_);
      if (failed_piece_ != kNone) {
        if (error_) std::rethrow_exception(error_);
        out = std::move(failure_);
      } else {
        out = std::move(final_);
      }
    }
    out.moves = 0;
    for (int m : moves_) out.moves += m;
    // The session now goes on to its first decode step, as after a plain step.
    if (out.token) util::Transit::Get().Mark();
    return out;
  }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

  void RunHop(size_t i) {
    for (int64_t k = 0; k < pieces_; ++k) {
      const int64_t begin = k * chunk_;
      StepRequest req = MakeRequest(head_, first_step_id_ + static_cast<uint64_t>(k), k == 0,
                                    k == 0 ? std::nullopt : std::optional<int64_t>(begin));
      if (i == 0) {
        if (Stopped()) return;
        if (stop_ && stop_()) {
          StepOutcome out;
          out.interrupted = true;
          Fail(k, i, std::move(out), nullptr);
          return;
        }
        const int64_t end = std::min<int64_t>(begin + chunk_, tokens_.size());
        req.token_ids.assign(tokens_.begin() + begin, tokens_.begin() + end);
      } else {
        std::optional<shard::BoundaryBundle> in = Take(i);
        if (!in) return;
        req.bundle = std::move(in);
      }
      if (!RunPiece(i, k, std::move(req))) return;
    }
  }

  // Piece k on hop i; false when the pipeline stops.
  bool RunPiece(size_t i, int64_t k, StepRequest req) {
    StepOutcome out;
    std::optional<shard::BoundaryBundle> bundle;
    try {
      std::optional<StepResult> result = CallHop(route_, i, std::move(req), provider_, &out);
      // This thread does not carry the session on to another hop itself.
      util::Transit::Get().Clear();
      moves_[i] += out.moves;
      if (!result || !TakeResult(std::move(*result), route_, i, &out, &bundle)) {
        Fail(k, i, std::move(out), nullptr);
        return false;
      }
    } catch (...) {
      util::Transit::Get().Clear();
      Fail(k, i, {}, std::current_exception());
      return false;
    }
    if (bundle) return Put(i + 1, std::move(*bundle));
    if (k + 1 == pieces_) {
      MutexLock lock(&mu_);
      final_ = std::move(out);
    }
    return true;
  }

  bool Stopped() {
    MutexLock lock(&mu_);
    return failed_piece_ != kNone;
  }

  // Keeps the failure of the earliest piece (then the earliest hop) and stops
  // every hop.
  void Fail(int64_t piece, size_t hop, StepOutcome out, std::exception_ptr error) {
    MutexLock lock(&mu_);
    if (piece < failed_piece_ || (piece == failed_piece_ && hop < failed_hop_)) {
      failed_piece_ = piece;
      failed_hop_ = hop;
      failure_ = std::move(out);
      error_ = std::move(error);
    }
    changed_.SignalAll();
  }

  std::optional<shard::BoundaryBundle> Take(size_t i) {
    MutexLock lock(&mu_);
    while (failed_piece_ == kNone && queues_[i].empty()) changed_.Wait();
    if (failed_piece_ != kNone) return std::nullopt;
    shard::BoundaryBundle b = std::move(queues_[i].front());
    queues_[i].pop_front();
    changed_.SignalAll();
    return b;
  }

  bool Put(size_t i, shard::BoundaryBundle b) {
    MutexLock lock(&mu_);
    while (failed_piece_ == kNone && queues_[i].size() >= kMaxQueuedPieces) changed_.Wait();
    if (failed_piece_ != kNone) return false;
    queues_[i].push_back(std::move(b));
    changed_.SignalAll();
    return true;
  }

  Route& route_;
  RouteProvider& provider_;
  const StepHead& head_;
  const uint64_t first_step_id_;
  const std::span<const int32_t> tokens_;
  const int64_t chunk_;
  const int64_t pieces_;
  const std::function<bool()>& stop_;
  Mutex mu_;
  CondVar changed_{&mu_};
  std::vector<std::deque<shard::BoundaryBundle>> queues_ GUARDED_BY(mu_);
  int64_t failed_piece_ GUARDED_BY(mu_) = kNone;
  size_t failed_hop_ GUARDED_BY(mu_) = 0;
  StepOutcome failure_ GUARDED_BY(mu_);
  std::exception_ptr error_ GUARDED_BY(mu_);
  StepOutcome final_ GUARDED_BY(mu_);
  std::vector<int> moves_;  // moves_[i]: written by hop i's thread only
};

}  // namespace

int64_t ChunkCount(int64_t n_tokens, int64_t chunk) { return (n_tokens + chunk - 1) / chunk; }

namespace {

// Hops start.. of the route one by one (the client relays), hop `start`
// taking `bundle` (or the prompt's tokens when start is 0).
StepOutcome RunStarFrom(Route& route, RouteProvider& provider, const StepHead& head,
                        uint64_t step_id, bool prefill, std::span<const int32_t> tokens,
                        std::optional<int64_t> expected, size_t start,
                        std::optional<shard::BoundaryBundle> bundle, StepOutcome out) {
  for (size_t i = start; i < route.hops.size(); ++i) {
    StepRequest req = MakeRequest(head, step_id, prefill, expected);
    if (i == 0) {
      req.token_ids.assign(tokens.begin(), tokens.end());
    } else {
      req.bundle = std::move(bundle);
      bundle.reset();
    }
    std::optional<StepResult> result = CallHop(route, i, std::move(req), provider, &out);
    if (!result || !TakeResult(std::move(*result), route, i, &out, &bundle)) return out;
  }
  return out;
}

// The step along the chain (ShardEndpoint::ChainStep): one call to the head.
// A hop that says the session moved is replaced and the step sent again
// (the hops before it answer from their idempotency caches); a hop that
// answered a bundle instead of forwarding it (a node without chain
// forwarding) is followed hop by hop. nullopt: the head does not chain.
std::optional<StepOutcome> RunChainStep(Route& route, RouteProvider& provider, const StepHead& head,
                                        uint64_t step_id, bool prefill,
                                        std::span<const int32_t> tokens,
                                        std::optional<int64_t> expected) {
  StepOutcome out;
  for (int redirects = 0;; ++redirects) {
    StepRequest req = MakeRequest(head, step_id, prefill, expected);
    req.token_ids.assign(tokens.begin(), tokens.end());
    std::optional<ChainAnswer> answer = route.hops[0]->ChainStep(std::move(req), route.hops);
    if (!answer) {
      if (redirects == 0) return std::nullopt;
      return RunStarFrom(route, provider, head, step_id, prefill, tokens, expected, 0, {},
                         std::move(out));
    }
    const size_t i = answer->hop;
    out.route_compute_micros = answer->route_compute_micros;
    if (i >= route.hops.size()) {
      throw Error(ErrorKind::kBoundaryContract, route.hops[0]->name() + " answered for hop " +
                                                    std::to_string(i) + " of a route of " +
                                                    std::to_string(route.hops.size()));
    }
    if (auto* miss = answer->result ? std::get_if<kv::CacheMiss>(&*answer->result) : nullptr;
        miss != nullptr && miss->reason == kv::CacheMissReason::kMoved && !prefill &&
        redirects < kMaxMovesPerHop) {
      if (std::shared_ptr<ShardEndpoint> next = provider.EndpointFor(miss->moved_to)) {
        route.hops[i] = std::move(next);
        ++out.moves;
        continue;
      }
    }
    if (answer->error) {
      try {
        std::rethrow_exception(answer->error);
      } catch (const Error& e) {
        if (!NoteHopError(*route.hops[i], e, &out)) throw;
        return out;
      }
    }
    std::optional<shard::BoundaryBundle> bundle;
    if (!TakeResult(std::move(*answer->result), route, i, &out, &bundle)) return out;
    if (!bundle) return out;
    return RunStarFrom(route, provider, head, step_id, prefill, tokens, expected, i + 1,
                       std::move(bundle), std::move(out));
  }
}

}  // namespace

StepOutcome RunRouteStep(Route& route, RouteProvider& provider, const StepHead& head,
                         uint64_t step_id, bool prefill, std::span<const int32_t> tokens,
                         std::optional<int64_t> expected) {
  if (route.hops.size() > 1) {
    if (std::optional<StepOutcome> chained =
            RunChainStep(route, provider, head, step_id, prefill, tokens, expected)) {
      return std::move(*chained);
    }
  }
  StepOutcome out;
  std::optional<shard::BoundaryBundle> bundle;
  size_t start = 0;
  std::optional<CohortCarrier::Carried> carried;
  CohortCarrier* carrier = provider.carrier();
  if (carrier != nullptr && !prefill && tokens.size() == 1 && route.hops.size() > 1 &&
      !head.want_logits && !head.rewind && !head.verify) {
    StepRequest req = MakeRequest(head, step_id, prefill, expected);
    req.token_ids.assign(tokens.begin(), tokens.end());
    carried = carrier->Carry(route, std::move(req));
    start = carried->hop;  // the hops before it answered bundles, sent on
  }
  if (carried) {
    std::optional<StepResult> result = CallHop(route, start, std::move(carried->request), provider,
                                               &out, {std::move(carried->result), carried->error});
    if (!result || !TakeResult(std::move(*result), route, start, &out, &bundle)) return out;
    ++start;
  }
  return RunStarFrom(route, provider, head, step_id, prefill, tokens, expected, start,
                     std::move(bundle), std::move(out));
}

StepOutcome RunChunkedPrefill(Route& route, RouteProvider& provider, const StepHead& head,
                              uint64_t first_step_id, std::span<const int32_t> tokens,
                              int64_t chunk, const std::function<bool()>& stop) {
  if (chunk <= 0) ThrowInvalidArgument("the prefill chunk must be > 0");
  PrefillPipeline pipeline(route, provider, head, first_step_id, tokens, chunk, stop);
  return pipeline.Run();
}

}  // namespace meshnet::mesh
