#include "mesh/generator.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <utility>

#include "mesh/draft.h"
#include "mesh/route_step.h"
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

int64_t ShardEndpoint::Truncate(const std::string&, const std::string&, int64_t, int64_t) {
  throw Error(ErrorKind::kUnavailable, name() + " cannot truncate a session");
}

namespace {

constexpr int kMaxSpeculate = 64;

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

void ValidateGenerate(std::span<const int32_t> prompt_ids, const GenerateOptions& options) {
  if (prompt_ids.empty()) ThrowInvalidArgument("the prompt must hold at least one token");
  if (options.max_tokens < 0) ThrowInvalidArgument("max_tokens must be >= 0");
  if (options.prefill_chunk < 0) ThrowInvalidArgument("prefill_chunk must be >= 0");
  if (options.speculate < 0 || options.speculate > kMaxSpeculate) {
    ThrowInvalidArgument("speculate must be in 0.." + std::to_string(kMaxSpeculate));
  }
  if (options.resume_length < 0 ||
      options.resume_length >= static_cast<int64_t>(prompt_ids.size()) ||
      (options.resume_length > 0 &&
       (options.session_id.empty() || options.session_secret.empty()))) {
    ThrowInvalidArgument(
        "resume_length must be below the prompt's length, with the session's id and secret");
  }
  options.sampling.Validate();
  if (options.context_length > 0 &&
      static_cast<int64_t>(prompt_ids.size()) > options.context_length) {
    ThrowInvalidArgument("the prompt holds " + std::to_string(prompt_ids.size()) +
                         " tokens, more than the model's context length of " +
                         std::to_string(options.context_length));
  }
}

// One Generate call: the route, the session and the text so far, and what
// to do with each step's outcome (a token, a busy or dead hop, a cache miss).
class GenerationLoop {
 public:
  GenerationLoop(RouteProvider& provider, std::span<const int32_t> prompt_ids,
                 const GenerateOptions& options, const GenerateEvents& events)
      : provider_(provider),
        options_(options),
        events_(events),
        session_(options.session_id.empty() ? node::RandomId128() : options.session_id),
        secret_(options.session_secret.empty() ? node::RandomId128() : options.session_secret),
        epoch_(options.initial_epoch),
        route_(provider.Plan()),
        releaser_(session_, secret_, &epoch_) {
    releaser_.Add(route_);
    busy_until_ = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(options.busy_retry_s));
    backoff_ = options.backoff_initial_s;
    result_.stop_reason = "max_tokens";
    history_.assign(prompt_ids.begin(), prompt_ids.end());
    history_.reserve(history_.size() + options.max_tokens);
    result_.generated_ids.reserve(options.max_tokens);
    // A verify step answers one logits row (the last): no speculation where
    // every token's row is wanted.
    speculate_ = options.adjustments.active() || !options.forced_ids.empty() ||
                         options.want_logits || events.on_logits
                     ? 0
                     : options.speculate;
    drafts_.reserve(static_cast<size_t>(speculate_));
    send_.reserve(static_cast<size_t>(speculate_) + 1);
    if (speculate_ > 0 && options.draft) drafter_ = options.draft->NewDrafter();
  }

  GenerateResult Run() {
    if (options_.resume_length > 0) Resume();
    while (static_cast<int>(result_.generated_ids.size()) < options_.max_tokens) {
      if (Stopping()) break;
      StepOutcome step = TimedStep();
      if (step.moves > 0) {
        result_.moves += step.moves;
        releaser_.Add(route_);  // the new node holds the session now
      }
      if (step.busy_hop != nullptr) {
        WaitWhileBusy(step);
        continue;
      }
      if (step.dead_hop != nullptr) {
        FailOver(step);
        continue;
      }
      if (step.miss) {
        const std::string what = step.miss->ToString() + "; re-prefilling " +
                                 std::to_string(history_.size()) + " tokens";
        if (step.miss->reason == kv::CacheMissReason::kPreempted) {
          Preempted(what);
        } else {
          Recover(what);
        }
        ++result_.re_prefills;
        need_prefill_ = true;
        continue;
      }
      if (step.interrupted) continue;  // a chunked prefill stopped: Stopping() says why
      need_prefill_ = false;
      fed_ = static_cast<int64_t>(history_.size());  // every hop holds the whole text now
      if (!drafts_.empty()) {
        if (!AcceptDrafts(step)) break;
      } else if (!Accept(step)) {
        break;
      }
    }
    if (!options_.release_at_end) {
      releaser_.Disarm();
      DropRejectedDrafts();
    }
    result_.final_epoch = epoch_;
    result_.final_route = route_.Describe();
    result_.final_hops = route_.hops;
    result_.kv_tokens.assign(history_.begin(), history_.begin() + fed_);
    return std::move(result_);
  }

 private:
  // Truncates every hop to the prefix they hold; the first step then sends
  // only the rest. Anything else than every hop holding it: a full prefill.
  void Resume() {
    const int64_t length = options_.resume_length;
    try {
      for (const auto& hop : route_.hops) {
        if (hop->Truncate(session_, secret_, epoch_, length) != length) {
          return;  // it held less: prefill everything
        }
      }
    } catch (const std::exception&) {
      return;  // a miss, a dead hop, no truncation: the prefill sorts it out
    }
    need_prefill_ = false;
    fed_ = held_ = length;
    result_.cached_tokens = length;
  }

  // True (with the stop reason set) when generation ends before the next step.
  bool Stopping() {
    if (events_.stop_requested && events_.stop_requested()) {
      result_.stopped = true;
      result_.stop_reason = "stopped";
      return true;
    }
    if (options_.cancelled && options_.cancelled()) {
      throw Error(ErrorKind::kUnavailable, "cancelled");  // the releaser frees the session
    }
    if (options_.context_length > 0 &&
        static_cast<int64_t>(history_.size()) >= options_.context_length) {
      result_.stop_reason = "context_length";
      return true;
    }
    return false;
  }

  // NextStep, counted in the result's route passes.
  StepOutcome TimedStep() {
    const auto t0 = std::chrono::steady_clock::now();
    StepOutcome step = NextStep();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++result_.route_passes;
    result_.route_seconds += seconds;
    if (step.route_compute_micros >= 0) {
      ++result_.measured_passes;
      result_.measured_seconds += seconds;
      result_.measured_compute_seconds += static_cast<double>(step.route_compute_micros) / 1e6;
    }
    return step;
  }

  // A prefill of the whole text when needed (in pieces when it is longer than
  // options.prefill_chunk and the route has hops to pipeline them over: on a
  // route of one hop no activations cross a wire and the node chunks a long
  // prompt itself), else a decode of its last token.
  StepOutcome NextStep() {
    StepHead head{session_,
                  secret_,
                  epoch_,
                  &options_.sampling,
                  static_cast<int>(route_.hops.size()),
                  options_.want_logits || options_.adjustments.active()};
    drafts_.clear();
    const int64_t chunk = options_.prefill_chunk;
    const auto n = static_cast<int64_t>(history_.size());
    if (need_prefill_ && chunk > 0 && n > chunk && route_.hops.size() > 1) {
      held_ = n;
      const uint64_t first = step_id_ + 1;
      step_id_ += static_cast<uint64_t>(ChunkCount(n, chunk));
      return RunChunkedPrefill(route_, provider_, head, first, history_, chunk,
                               [this] { return StopAsked(); });
    }
    if (need_prefill_) {
      result_.cached_tokens = 0;  // a re-prefill after a resume computes it all
      held_ = n;
      return RunRouteStep(route_, provider_, head, ++step_id_, true, history_, {});
    }
    // The tokens the hops do not hold yet (the last one when decoding, the
    // rest of the prompt after a resume) and the drafts.
    head.rewind = held_ > fed_;  // drafts of the last step that were rejected
    send_.assign(history_.begin() + fed_, history_.end());
    if (speculate_ > 0) Draft(n);
    send_.insert(send_.end(), drafts_.begin(), drafts_.end());
    head.verify = !drafts_.empty();
    held_ = fed_ + static_cast<int64_t>(send_.size());
    return RunRouteStep(route_, provider_, head, ++step_id_, false, send_, fed_);
  }

  // A kept session's hops hold exactly its kv_tokens: drafts the last step
  // rejected are dropped now, not by a next step (best effort: a hop that
  // fails here is found out by the next resume's truncation).
  void DropRejectedDrafts() {
    if (held_ <= fed_ || need_prefill_) return;
    try {
      for (const auto& hop : route_.hops) hop->Truncate(session_, secret_, epoch_, fed_);
      held_ = fed_;
    } catch (const std::exception&) {
    }
  }

  // Prompt lookup: the tokens that followed the latest earlier occurrence of
  // the text's last 3 (else 2, else 1) tokens, at most speculate_, and no
  // more than the context and max_tokens leave room for.
  void Draft(int64_t n) {
    int64_t room = speculate_;
    room = std::min<int64_t>(
        room, options_.max_tokens - static_cast<int64_t>(result_.generated_ids.size()) - 1);
    if (options_.context_length > 0) room = std::min(room, options_.context_length - n - 1);
    if (drafter_) {  // the draft model's greedy guesses
      if (room > 0) drafter_->Propose(history_, static_cast<int>(room), &drafts_);
      return;
    }
    for (int64_t g = std::min<int64_t>(3, n - 1); g >= 1 && room > 0; --g) {
      const auto tail = history_.end() - g;
      for (int64_t start = n - g - 1; start >= 0; --start) {
        if (!std::equal(tail, history_.end(), history_.begin() + start)) continue;
        for (int64_t p = start + g; p < n && static_cast<int64_t>(drafts_.size()) < room; ++p) {
          drafts_.push_back(history_[p]);
        }
        return;
      }
    }
  }

  // A verify step's answer: the token after the last fed one, then each
  // draft the tail sampled too (and the token after it), up to the first
  // draft it did not: exactly what one-token steps would have given.
  bool AcceptDrafts(const StepOutcome& step) {
    const size_t k = drafts_.size();
    if (step.row_tokens.size() != k + 1) {
      throw Error(ErrorKind::kBoundaryContract, "the tail verified " +
                                                    std::to_string(step.row_tokens.size()) +
                                                    " rows of " + std::to_string(k + 1));
    }
    ++result_.verify_steps;
    result_.drafted += static_cast<int64_t>(k);
    for (size_t i = 0; i <= k; ++i) {
      if (static_cast<int>(result_.generated_ids.size()) >= options_.max_tokens) break;
      if (!AcceptToken(step.row_tokens[i], step)) return false;
      if (i == k || step.row_tokens[i] != drafts_[i]) break;
      ++fed_;  // the hops hold this draft, and it is the text's next token
      ++result_.accepted;
    }
    return true;
  }

  // Whether the caller wants the generation to end (asked between pieces of a
  // chunked prefill; Stopping() then says how).
  bool StopAsked() const {
    return (events_.stop_requested && events_.stop_requested()) ||
           (options_.cancelled && options_.cancelled());
  }

  void Recover(const std::string& what) {
    if (++recoveries_ > options_.max_recoveries) {
      throw Error(ErrorKind::kUnavailable, "giving up after " +
                                               std::to_string(options_.max_recoveries) +
                                               " recoveries; last: " + what);
    }
    if (events_.on_recovery) events_.on_recovery(what);
  }

  // A hop whose KV budget is full of active sessions took this one's room for
  // an earlier session: it is full, as busy is. Re-prefilled at once (the hop
  // makes the prefill wait for room); bounded by busy_retry_s, not a recovery.
  void Preempted(const std::string& what) {
    if (std::chrono::steady_clock::now() >= busy_until_) {
      throw Error(ErrorKind::kResourceExhausted,
                  "still preempted after " + std::to_string(options_.busy_retry_s) + " s: " + what);
    }
    ++result_.preemptions;
    if (events_.on_recovery) events_.on_recovery(what);
  }

  void WaitWhileBusy(const StepOutcome& step) {
    if (std::chrono::steady_clock::now() >= busy_until_) {
      throw Error(ErrorKind::kResourceExhausted, "still busy after " +
                                                     std::to_string(options_.busy_retry_s) +
                                                     " s of retries: " + step.busy_reason);
    }
    ++result_.busy_retries;
    SleepWithJitter(busy_backoff_);
    busy_backoff_ = std::min(busy_backoff_ * 2, 2.0);
    need_prefill_ = true;  // hops before the busy one are re-opened too
  }

  void FailOver(const StepOutcome& step) {
    Recover("hop " + step.dead_hop->name() + " is unavailable (" + step.dead_reason +
            "); re-planning at epoch " + std::to_string(epoch_ + 1));
    provider_.MarkDead(*step.dead_hop);
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff_));
    backoff_ = std::min(backoff_ * 2, options_.backoff_max_s);
    route_ = provider_.Plan();
    releaser_.Add(route_);
    ++epoch_;
    ++result_.failovers;
    need_prefill_ = true;
  }

  // The token sampled from the tail's row with the adjustments applied, at
  // the position the tail samples at (the sequence length after the step).
  int32_t SampleAdjusted(const StepOutcome& step) {
    const size_t vocab = step.logits.size();
    if (vocab == 0) {
      throw Error(ErrorKind::kBoundaryContract,
                  "the tail sent no logits row, which penalties and logit_bias need");
    }
    for (const auto& [id, bias] : options_.adjustments.bias) {
      if (id < 0 || static_cast<size_t>(id) >= vocab) {
        ThrowInvalidArgument("logit_bias names token " + std::to_string(id) +
                             ", outside the vocabulary of " + std::to_string(vocab));
      }
    }
    if (counts_.size() != vocab) counts_.assign(vocab, 0);
    adjusted_.assign(step.logits.begin(), step.logits.end());
    options_.adjustments.Apply(adjusted_, counts_, seen_);
    probs_.resize(vocab);
    ids_.resize(vocab);
    return options_.sampling.Sample(adjusted_, static_cast<int64_t>(history_.size()), probs_, ids_);
  }

  // Takes the step's token; false when it ends the generation (EOS or a stop id).
  bool Accept(const StepOutcome& step) {
    const size_t i = result_.generated_ids.size();
    const bool adjusting = options_.adjustments.active();
    const int32_t token = i < options_.forced_ids.size() ? options_.forced_ids[i]
                          : adjusting                    ? SampleAdjusted(step)
                                                         : *step.token;
    return AcceptToken(token, step);
  }

  bool AcceptToken(int32_t token, const StepOutcome& step) {
    const bool adjusting = options_.adjustments.active();
    if (events_.on_logits) events_.on_logits(step.logits);
    if (options_.eos_id && token == *options_.eos_id) {
      result_.stop_reason = "eos";
      return false;
    }
    if (std::find(options_.stop_ids.begin(), options_.stop_ids.end(), token) !=
        options_.stop_ids.end()) {
      result_.stop_reason = "eos";
      return false;
    }
    history_.push_back(token);
    result_.generated_ids.push_back(token);
    if (adjusting && counts_[token]++ == 0) seen_.push_back(token);
    if (events_.on_token) events_.on_token(token);
    return true;
  }

  RouteProvider& provider_;
  const GenerateOptions& options_;
  const GenerateEvents& events_;
  const std::string session_;
  const std::string secret_;
  GenerateResult result_;
  int64_t epoch_;
  Route route_;
  SessionReleaser releaser_;
  std::chrono::steady_clock::time_point busy_until_;
  double busy_backoff_ = 0.05;
  std::vector<int32_t> history_;
  bool need_prefill_ = true;
  int64_t fed_ = 0;   // tokens of history_ whose KV every hop of route_ holds
  int64_t held_ = 0;  // positions the hops hold (more than fed_: rejected drafts)
  int speculate_ = 0;
  std::unique_ptr<Drafter> drafter_;  // GenerateOptions::draft's, or null: prompt lookup
  std::vector<int32_t> drafts_, send_;
  int recoveries_ = 0;
  uint64_t step_id_ = 0;
  double backoff_ = 0;
  // With adjustments: generated-token counts by id, the ids counted, and
  // the sampler's buffers (kept across steps).
  std::vector<int32_t> counts_, seen_;
  std::vector<float> adjusted_, probs_;
  std::vector<int> ids_;
};

}  // namespace

GenerateResult Generate(RouteProvider& provider, std::span<const int32_t> prompt_ids,
                        const GenerateOptions& options, const GenerateEvents& events) {
  ValidateGenerate(prompt_ids, options);
  GenerationLoop loop(provider, prompt_ids, options, events);
  return loop.Run();
}

}  // namespace meshnet::mesh
