#include "mesh/generator.h"

#include <algorithm>
#include <chrono>
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
};

StepOutcome RunRouteStep(const Route& route, const std::string& session, const std::string& secret,
                         int64_t epoch, uint64_t step_id, bool prefill,
                         std::span<const int32_t> tokens, std::optional<int64_t> expected,
                         const shard::SamplingContract& sampling) {
  StepOutcome out;
  std::optional<shard::BoundaryBundle> bundle;
  for (size_t i = 0; i < route.hops.size(); ++i) {
    ShardEndpoint& hop = *route.hops[i];
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
      result = hop.Step(std::move(req));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kUnavailable) throw;
      out.dead_hop = &hop;
      out.dead_reason = e.what();
      return out;
    }
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

}  // namespace

GenerateResult Generate(RouteProvider& provider, std::span<const int32_t> prompt_ids,
                        const GenerateOptions& options, const GenerateEvents& events) {
  if (prompt_ids.empty()) ThrowInvalidArgument("the prompt must hold at least one token");
  if (options.max_tokens < 0) ThrowInvalidArgument("max_tokens must be >= 0");
  options.sampling.Validate();
  const std::string session = options.session_id.empty() ? node::RandomId128() : options.session_id;
  const std::string secret =
      options.session_secret.empty() ? node::RandomId128() : options.session_secret;

  GenerateResult result;
  int64_t epoch = options.initial_epoch;
  Route route = provider.Plan();
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
    const bool prefill = need_prefill;
    std::span<const int32_t> tokens =
        prefill ? std::span<const int32_t>(history) : std::span<const int32_t>(&history.back(), 1);
    std::optional<int64_t> expected;
    if (!prefill) expected = static_cast<int64_t>(history.size()) - 1;
    StepOutcome step = RunRouteStep(route, session, secret, epoch, ++step_id, prefill, tokens,
                                    expected, options.sampling);
    if (step.dead_hop != nullptr) {
      recover("hop " + step.dead_hop->name() + " is unavailable (" + step.dead_reason +
              "); re-planning at epoch " + std::to_string(epoch + 1));
      provider.MarkDead(*step.dead_hop);
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, options.backoff_max_s);
      route = provider.Plan();
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
    if (options.eos_id && token == *options.eos_id) break;
    history.push_back(token);
    result.generated_ids.push_back(token);
    if (events.on_token) events.on_token(token);
  }
  if (options.release_at_end) {
    for (const auto& hop : route.hops) hop->Release(session, secret, epoch);
  }
  result.final_epoch = epoch;
  result.final_route = route.Describe();
  return result;
}

}  // namespace meshnet::mesh
