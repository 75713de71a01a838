#include "mesh/generator.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <utility>

#include "node/identity.h"
#include "util/error.h"

namespace meshnet::mesh {

std::string Route::Describe() const {
  std::string out;
  for (const auto& hop : hops) {
    if (!out.empty()) out += " -> ";
    out += hop->name();
  }
  return out;
}

Route FixedRouteProvider::Plan() {
  if (dead_) {
    throw Error(ErrorKind::kUnavailable,
                "no route: a hop of the fixed route " + route_.Describe() + " is dead");
  }
  return route_;
}

void FixedRouteProvider::MarkDead(const ShardEndpoint& endpoint) {
  for (const auto& hop : route_.hops) {
    if (hop.get() == &endpoint) dead_ = true;
  }
}

namespace {

// The outcome of pushing one step through every hop of the route.
struct StepOutcome {
  std::optional<int32_t> token;             // the tail's sample
  std::vector<float> logits;                // the tail's logits
  std::optional<kv::CacheMiss> miss;        // some hop lost its state
  const ShardEndpoint* dead_hop = nullptr;  // some hop is unreachable
  std::string dead_reason;
  int moves = 0;                            // hops that followed a "moved to"
  const ShardEndpoint* busy_hop = nullptr;  // some hop refused it for now (admission)
  std::string busy_reason;
};

// At most this many "moved to" redirects per hop and step (a chain of drains).
constexpr int kMaxMovesPerHop = 4;

// Runs `req` on hop i of `route`, following "moved to" answers to nodes the
// provider knows (the hop is replaced in `route`). A decode request is kept
// for the re-send; a prefill is not (it is never answered "moved").
StepResult StepHop(Route& route, size_t i, StepRequest req, RouteProvider& provider, int* moves) {
  for (int redirects = 0;; ++redirects) {
    std::optional<StepRequest> again;
    if (!req.prefill) again = req;
    StepResult result = route.hops[i]->Step(std::move(req));
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

StepOutcome RunRouteStep(Route& route, RouteProvider& provider, const std::string& session,
                         const std::string& secret, int64_t epoch, uint64_t step_id, bool prefill,
                         std::span<const int32_t> tokens, std::optional<int64_t> expected,
                         const shard::SamplingContract& sampling) {
  StepOutcome out;
  std::optional<shard::BoundaryBundle> bundle;
  for (size_t i = 0; i < route.hops.size(); ++i) {
    StepRequest req;
    req.session_id = session;
    req.session_secret = secret;
    req.route_epoch = epoch;
    req.step_id = step_id;
    req.prefill = prefill;
    req.expected_seq_len = expected;
    req.sampling = sampling;
    if (i == 0) {
      req.token_ids.assign(tokens.begin(), tokens.end());
    } else {
      req.bundle = std::move(bundle);
      bundle.reset();
    }
    StepResult result;
    try {
      result = StepHop(route, i, std::move(req), provider, &out.moves);
    } catch (const Error& e) {
      ShardEndpoint& hop = *route.hops[i];
      if (e.kind() == ErrorKind::kResourceExhausted) {
        out.busy_hop = &hop;
        out.busy_reason = e.what();
        return out;
      }
      if (e.kind() != ErrorKind::kUnavailable) throw;
      out.dead_hop = &hop;
      out.dead_reason = e.what();
      return out;
    }
    const ShardEndpoint& hop = *route.hops[i];
    if (auto* miss = std::get_if<kv::CacheMiss>(&result)) {
      out.miss = std::move(*miss);
      return out;
    }
    if (auto* b = std::get_if<shard::BoundaryBundle>(&result)) {
      if (i + 1 == route.hops.size()) {
        throw Error(ErrorKind::kBoundaryContract,
                    "route ends at " + hop.name() + ", which is not a tail shard");
      }
      bundle = std::move(*b);
      continue;
    }
    if (i + 1 != route.hops.size()) {
      throw Error(ErrorKind::kBoundaryContract,
                  "hop " + hop.name() + " returned a tail output before the end of the route");
    }
    auto& tail = std::get<shard::TailOutput>(result);
    out.token = tail.token_id;
    out.logits = std::move(tail.logits);
  }
  return out;
}

// Releases the session, at the latest epoch, on every hop that may hold it
// (every route it ran on) when the generation ends, however it ends.
class SessionReleaser {
 public:
  SessionReleaser(const std::string& session, const std::string& secret, const int64_t* epoch)
      : session_(session), secret_(secret), epoch_(epoch) {}
  ~SessionReleaser() {
    if (!armed_) return;
    for (const auto& hop : hops_) hop->Release(session_, secret_, *epoch_);  // best effort
  }
  void Add(const Route& route) {
    for (const auto& hop : route.hops) {
      if (std::find(hops_.begin(), hops_.end(), hop) == hops_.end()) hops_.push_back(hop);
    }
  }
  void Disarm() { armed_ = false; }

 private:
  const std::string& session_;
  const std::string& secret_;
  const int64_t* epoch_;
  std::vector<std::shared_ptr<ShardEndpoint>> hops_;
  bool armed_ = true;
};

// Sleeps `seconds` scaled by a random factor in [0.5, 1.5): clients refused
// together do not come back together.
void SleepWithJitter(double seconds) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> factor(0.5, 1.5);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds * factor(rng)));
}

}  // namespace

GenerateResult Generate(RouteProvider& provider, std::span<const int32_t> prompt_ids,
                        const GenerateOptions& options, const GenerateEvents& events) {
  if (prompt_ids.empty()) ThrowInvalidArgument("the prompt must hold at least one token");
  if (options.max_tokens < 0) ThrowInvalidArgument("max_tokens must be >= 0");
  options.sampling.Validate();
  if (options.context_length > 0 &&
      static_cast<int64_t>(prompt_ids.size()) > options.context_length) {
    ThrowInvalidArgument("the prompt holds " + std::to_string(prompt_ids.size()) +
                         " tokens, more than the model's context length of " +
                         std::to_string(options.context_length));
  }
  const std::string session = options.session_id.empty() ? node::RandomId128() : options.session_id;
  const std::string secret =
      options.session_secret.empty() ? node::RandomId128() : options.session_secret;

  GenerateResult result;
  int64_t epoch = options.initial_epoch;
  Route route = provider.Plan();
  SessionReleaser releaser(session, secret, &epoch);
  releaser.Add(route);
  const auto busy_until = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(options.busy_retry_s));
  double busy_backoff = 0.05;
  result.stop_reason = "max_tokens";
  std::vector<int32_t> history(prompt_ids.begin(), prompt_ids.end());
  history.reserve(history.size() + options.max_tokens);
  result.generated_ids.reserve(options.max_tokens);
  bool need_prefill = true;
  int recoveries = 0;
  uint64_t step_id = 0;
  double backoff = options.backoff_initial_s;

  auto recover = [&](const std::string& what) {
    if (++recoveries > options.max_recoveries) {
      throw Error(ErrorKind::kUnavailable, "giving up after " +
                                               std::to_string(options.max_recoveries) +
                                               " recoveries; last: " + what);
    }
    if (events.on_recovery) events.on_recovery(what);
  };

  while (static_cast<int>(result.generated_ids.size()) < options.max_tokens) {
    if (events.stop_requested && events.stop_requested()) {
      result.stopped = true;
      result.stop_reason = "stopped";
      break;
    }
    if (options.cancelled && options.cancelled()) {
      throw Error(ErrorKind::kUnavailable, "cancelled");  // the releaser frees the session
    }
    if (options.context_length > 0 &&
        static_cast<int64_t>(history.size()) >= options.context_length) {
      result.stop_reason = "context_length";
      break;
    }
    const bool prefill = need_prefill;
    std::span<const int32_t> tokens =
        prefill ? std::span<const int32_t>(history) : std::span<const int32_t>(&history.back(), 1);
    std::optional<int64_t> expected;
    if (!prefill) expected = static_cast<int64_t>(history.size()) - 1;
    StepOutcome step = RunRouteStep(route, provider, session, secret, epoch, ++step_id, prefill,
                                    tokens, expected, options.sampling);
    if (step.moves > 0) {
      result.moves += step.moves;
      releaser.Add(route);  // the new node holds the session now
    }
    if (step.busy_hop != nullptr) {
      if (std::chrono::steady_clock::now() >= busy_until) {
        throw Error(ErrorKind::kResourceExhausted, "still busy after " +
                                                       std::to_string(options.busy_retry_s) +
                                                       " s of retries: " + step.busy_reason);
      }
      ++result.busy_retries;
      SleepWithJitter(busy_backoff);
      busy_backoff = std::min(busy_backoff * 2, 2.0);
      need_prefill = true;  // hops before the busy one are re-opened too
      continue;
    }
    if (step.dead_hop != nullptr) {
      recover("hop " + step.dead_hop->name() + " is unavailable (" + step.dead_reason +
              "); re-planning at epoch " + std::to_string(epoch + 1));
      provider.MarkDead(*step.dead_hop);
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, options.backoff_max_s);
      route = provider.Plan();
      releaser.Add(route);
      ++epoch;
      ++result.failovers;
      need_prefill = true;
      continue;
    }
    if (step.miss) {
      recover(step.miss->ToString() + "; re-prefilling " + std::to_string(history.size()) +
              " tokens");
      ++result.re_prefills;
      need_prefill = true;
      continue;
    }
    need_prefill = false;
    const int32_t token = *step.token;
    if (events.on_logits) events.on_logits(step.logits);
    if (options.eos_id && token == *options.eos_id) {
      result.stop_reason = "eos";
      break;
    }
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
        options.stop_ids.end()) {
      result.stop_reason = "eos";
      break;
    }
    history.push_back(token);
    result.generated_ids.push_back(token);
    if (events.on_token) events.on_token(token);
  }
  if (!options.release_at_end) releaser.Disarm();
  result.final_epoch = epoch;
  result.final_route = route.Describe();
  return result;
}

}  // namespace meshnet::mesh
