// The generation loop against scripted endpoints (no model): a toy pipeline
// whose tail output depends on the whole token history each hop holds, so any
// lost or duplicated state changes the output.
#include "mesh/generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>

#include "node/identity.h"
#include "util/error.h"

namespace meshnet::mesh {
namespace {

constexpr int kVocab = 50;

// The expected next token after `history`.
int32_t NextToken(const std::vector<int32_t>& history) {
  int64_t acc = 7;
  for (int32_t t : history) acc = (acc * 31 + t) % 1000003;
  return static_cast<int32_t>(acc % kVocab);
}

// A hop of the toy pipeline: every hop keeps the token history per
// (session, epoch); the head sends tokens onward as a 1-wide residual.
class ToyHop : public ShardEndpoint {
 public:
  ToyHop(std::string name, bool head, bool tail)
      : name_(std::move(name)), head_(head), tail_(tail) {}
  std::string name() const override { return name_; }
  ShardInfo Info() override { return {}; }

  StepResult Step(StepRequest req) override {
    if (before_step_) before_step_(req);  // outside the lock: it may wait for other hops
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_;
    if (dead_) throw Error(ErrorKind::kUnavailable, name_ + " is dead");
    if (fail_at_ && req.expected_seq_len == fail_at_) {
      fail_at_.reset();
      throw Error(*fail_kind_, name_ + " failed this step");
    }
    const auto key = std::make_pair(req.session_id, req.route_epoch);
    epochs_seen_.push_back(req.route_epoch);
    if (req.prefill) {
      state_[key].clear();
    } else {
      auto it = state_.find(key);
      if (it == state_.end() || forget_next_) {
        forget_next_ = false;
        state_.erase(key);
        return kv::CacheMiss{req.session_id, req.route_epoch, forget_reason_, ""};
      }
      if (!req.expected_seq_len ||
          *req.expected_seq_len != static_cast<int64_t>(it->second.size())) {
        return kv::CacheMiss{req.session_id, req.route_epoch, kv::CacheMissReason::kSeqLenMismatch,
                             ""};
      }
    }
    std::vector<int32_t> tokens = req.token_ids;
    if (!head_) {
      EXPECT_TRUE(req.bundle.has_value());
      tokens.clear();
      for (float v : req.bundle->residual) tokens.push_back(static_cast<int32_t>(v));
    }
    max_rows_ = std::max(max_rows_, tokens.size());
    route_hops_ = req.route_hops;
    step_ids_.push_back(req.step_id);
    auto& hist = state_[key];
    hist.insert(hist.end(), tokens.begin(), tokens.end());
    if (tail_) {
      shard::TailOutput out;
      out.token_id = NextToken(hist);
      out.logits.assign(kVocab, 0.0f);
      out.logits[out.token_id] = 1.0f;
      return out;
    }
    shard::BoundaryBundle b;
    b.n_tokens = static_cast<int64_t>(tokens.size());
    b.n_embd = 1;
    for (int32_t t : tokens) b.residual.push_back(static_cast<float>(t));
    return b;
  }
  void Release(const std::string& s, const std::string&, int64_t e) override {
    std::lock_guard<std::mutex> lock(mu_);
    state_.erase({s, e});
    ++releases_;
  }

  std::mutex mu_;
  std::string name_;
  bool head_, tail_;
  bool dead_ = false;
  bool forget_next_ = false;
  kv::CacheMissReason forget_reason_ = kv::CacheMissReason::kEvictedLru;
  int steps_ = 0;
  int releases_ = 0;
  std::vector<int64_t> epochs_seen_;
  size_t max_rows_ = 0;             // the most tokens one request carried
  int route_hops_ = -1;             // what the last request said of its route
  std::vector<uint64_t> step_ids_;  // in the order they were applied
  std::optional<int64_t> fail_at_;  // throw fail_kind_ once at this expected_seq_len
  std::optional<ErrorKind> fail_kind_;
  std::function<void(const StepRequest&)> before_step_;
  std::map<std::pair<std::string, int64_t>, std::vector<int32_t>> state_;
};

// Plans head -> (first live middle) -> tail.
class ToyProvider : public RouteProvider {
 public:
  std::shared_ptr<ToyHop> head = std::make_shared<ToyHop>("head", true, false);
  std::vector<std::shared_ptr<ToyHop>> middles = {std::make_shared<ToyHop>("mid-a", false, false),
                                                  std::make_shared<ToyHop>("mid-b", false, false)};
  std::shared_ptr<ToyHop> tail = std::make_shared<ToyHop>("tail", false, true);
  std::vector<const ShardEndpoint*> dead;
  int plans = 0;

  Route Plan() override {
    ++plans;
    for (auto& m : middles) {
      if (std::find(dead.begin(), dead.end(), m.get()) == dead.end()) {
        return Route{{head, m, tail}};
      }
    }
    throw Error(ErrorKind::kUnavailable, "no node serves layers 2-3");
  }
  void MarkDead(const ShardEndpoint& e) override { dead.push_back(&e); }
};

std::vector<int32_t> Expected(std::vector<int32_t> history, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(NextToken(history));
    history.push_back(out.back());
  }
  return out;
}

GenerateOptions Opts(int n) {
  GenerateOptions o;
  o.max_tokens = n;
  o.backoff_initial_s = 0.0;
  return o;
}

const std::vector<int32_t> kPrompt = {1, 9, 4, 4};

TEST(Generator, UndisturbedRunMatchesTheToyModel) {
  ToyProvider p;
  GenerateResult r = Generate(p, kPrompt, Opts(20));
  EXPECT_EQ(r.generated_ids, Expected(kPrompt, 20));
  EXPECT_EQ(r.re_prefills, 0);
  EXPECT_EQ(r.failovers, 0);
  EXPECT_EQ(p.head->steps_, 20);  // one prefill + 19 decodes
  EXPECT_EQ(p.head->releases_, 1);
  EXPECT_TRUE(p.middles[0]->state_.empty());  // released at the end
  EXPECT_EQ(p.tail->route_hops_, 3);          // every step says the route's length
}

TEST(Generator, CacheMissReprefillsFromTokenZeroOnTheSameRoute) {
  ToyProvider p;
  GenerateEvents ev;
  int seen = 0;
  std::vector<std::string> recoveries;
  ev.on_token = [&](int32_t) {
    if (++seen == 7) p.middles[0]->forget_next_ = true;
  };
  ev.on_recovery = [&](const std::string& s) { recoveries.push_back(s); };
  GenerateResult r = Generate(p, kPrompt, Opts(20), ev);
  EXPECT_EQ(r.generated_ids, Expected(kPrompt, 20));
  EXPECT_EQ(r.re_prefills, 1);
  EXPECT_EQ(r.final_epoch, 0);
  EXPECT_EQ(p.plans, 1);
  ASSERT_EQ(recoveries.size(), 1u);
  EXPECT_NE(recoveries[0].find("evicted-lru"), std::string::npos);
}

TEST(Generator, DeadHopFailsOverToAStandbyWithANewEpoch) {
  ToyProvider p;
  GenerateEvents ev;
  int seen = 0;
  ev.on_token = [&](int32_t) {
    if (++seen == 5) p.middles[0]->dead_ = true;
  };
  GenerateOptions o = Opts(16);
  o.initial_epoch = 3;
  GenerateResult r = Generate(p, kPrompt, o, ev);
  EXPECT_EQ(r.generated_ids, Expected(kPrompt, 16));
  EXPECT_EQ(r.failovers, 1);
  EXPECT_EQ(r.final_epoch, 4);
  EXPECT_NE(r.final_route.find("mid-b"), std::string::npos);
  EXPECT_EQ(p.middles[1]->epochs_seen_.front(), 4);  // the standby only saw the new epoch
  // The head and tail moved to the new epoch too: their last steps are at epoch 4.
  EXPECT_EQ(p.tail->epochs_seen_.back(), 4);
}

TEST(Generator, RecoveriesAreBounded) {
  ToyProvider p;
  GenerateEvents ev;
  ev.on_token = [&](int32_t) { p.middles[0]->forget_next_ = true; };
  GenerateOptions o = Opts(50);
  o.max_recoveries = 3;
  try {
    Generate(p, kPrompt, o, ev);
    FAIL() << "expected giving up";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("giving up"), std::string::npos);
  }
}

// A preempted session (its hop's KV full of earlier active sessions) is
// re-prefilled as often as it takes, within busy_retry_s: not a recovery.
TEST(Generator, PreemptionsAreNotRecoveriesButAreBoundedInTime) {
  ToyProvider p;
  p.middles[0]->forget_reason_ = kv::CacheMissReason::kPreempted;
  GenerateEvents ev;
  ev.on_token = [&](int32_t) { p.middles[0]->forget_next_ = true; };
  GenerateOptions o = Opts(20);
  o.max_recoveries = 3;
  const GenerateResult r = Generate(p, kPrompt, o, ev);
  EXPECT_EQ(r.generated_ids.size(), 20u);
  EXPECT_EQ(r.preemptions, 19);  // after every token but the last
  EXPECT_EQ(r.re_prefills, 19);

  o.busy_retry_s = 0;  // out of time at the first one
  try {
    Generate(p, kPrompt, o, ev);
    FAIL() << "expected busy";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("preempted"), std::string::npos) << e.what();
  }
}

TEST(Generator, NoRouteLeftNamesTheUncoveredLayers) {
  ToyProvider p;
  p.middles[0]->dead_ = true;
  p.middles[1]->dead_ = true;
  try {
    Generate(p, kPrompt, Opts(4));
    FAIL() << "expected no route";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers 2-3"), std::string::npos);
  }
}

TEST(Generator, StopsAtEos) {
  ToyProvider p;
  const auto expected = Expected(kPrompt, 30);
  GenerateOptions o = Opts(30);
  o.eos_id = expected[6];
  GenerateResult r = Generate(p, kPrompt, o);
  const auto first = std::find(expected.begin(), expected.end(), expected[6]) - expected.begin();
  EXPECT_EQ(r.generated_ids, std::vector<int32_t>(expected.begin(), expected.begin() + first));
}

// Teacher forcing: the forced tokens are fed (and reported) in place of the
// sampled ones, each step's logits are still the model's own prediction at
// that point, and sampling takes over after the last forced token.
TEST(Generator, ForcedIdsAreFedWhateverIsSampled) {
  ToyProvider p;
  GenerateOptions o = Opts(5);
  o.forced_ids = {5, 17, 3};
  std::vector<int32_t> predicted;
  GenerateEvents ev;
  ev.on_logits = [&](std::span<const float> l) {
    predicted.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
  };
  GenerateResult r = Generate(p, kPrompt, o, ev);
  std::vector<int32_t> history = kPrompt, want_predicted;
  for (int32_t t : o.forced_ids) {
    want_predicted.push_back(NextToken(history));
    history.push_back(t);
  }
  const std::vector<int32_t> free = Expected(history, 2);
  want_predicted.insert(want_predicted.end(), free.begin(), free.end());
  std::vector<int32_t> want = o.forced_ids;
  want.insert(want.end(), free.begin(), free.end());
  EXPECT_EQ(r.generated_ids, want);
  EXPECT_EQ(predicted, want_predicted);
  ASSERT_NE(predicted[0], o.forced_ids[0]);  // the forcing is visible
}

TEST(Generator, RejectsBadArguments) {
  ToyProvider p;
  EXPECT_THROW(Generate(p, {}, Opts(3)), Error);
  GenerateOptions o = Opts(3);
  o.sampling.top_p = 0;
  EXPECT_THROW(Generate(p, kPrompt, o), Error);
}

TEST(Generator, RandomIdsAre128BitHex) {
  const std::string a = node::RandomId128(), b = node::RandomId128();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

}  // namespace
}  // namespace meshnet::mesh

namespace meshnet::mesh {
namespace {

TEST(Generator, StopRequestedEndsBeforeTheNextStepAndReleasesEveryHop) {
  ToyProvider p;
  GenerateEvents events;
  int seen = 0;
  events.on_token = [&](int32_t) { ++seen; };
  events.stop_requested = [&] { return seen == 5; };
  GenerateResult r = Generate(p, kPrompt, Opts(20), events);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.generated_ids, Expected(kPrompt, 5));
  EXPECT_EQ(p.head->steps_, 5);  // no step after the request
  EXPECT_EQ(p.head->releases_, 1);
  EXPECT_EQ(p.tail->releases_, 1);
  EXPECT_TRUE(p.head->state_.empty());
  EXPECT_TRUE(p.tail->state_.empty());
}

// Chunked prefill (GenerateOptions::prefill_chunk, mesh/route_step.h).

std::vector<int32_t> LongPrompt(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 17 + 3) % kVocab;
  return p;
}

GenerateOptions Chunked(int n, int64_t chunk) {
  GenerateOptions o = Opts(n);
  o.prefill_chunk = chunk;
  return o;
}

TEST(ChunkedPrefill, PiecesGiveTheSameTokensAndNoMessageCarriesMore) {
  const auto prompt = LongPrompt(23);
  for (int64_t chunk : {1, 5, 22, 23, 64}) {
    ToyProvider p;
    GenerateResult r = Generate(p, prompt, Chunked(6, chunk));
    EXPECT_EQ(r.generated_ids, Expected(prompt, 6)) << chunk;
    const int64_t pieces = (23 + chunk - 1) / chunk;
    EXPECT_EQ(p.head->steps_, pieces + 5) << chunk;  // then 5 decodes
    EXPECT_EQ(p.tail->steps_, pieces + 5) << chunk;
    for (auto* hop : {p.head.get(), p.middles[0].get(), p.tail.get()}) {
      EXPECT_EQ(hop->max_rows_, static_cast<size_t>(std::min<int64_t>(chunk, 23))) << chunk;
      // One step id per piece, the same at every hop, in order.
      std::vector<uint64_t> ids(pieces + 5);
      std::iota(ids.begin(), ids.end(), 1);
      EXPECT_EQ(hop->step_ids_, ids) << chunk;
    }
    EXPECT_EQ(r.re_prefills, 0);
  }
}

// Each hop works on its piece while the hop before it works on the next: the
// tail takes the first piece only once the head has begun the second. Run
// one piece through the whole route at a time, it would wait for ever
// (bounded here: the test then fails).
TEST(ChunkedPrefill, HopsWorkOnDifferentPiecesAtOnce) {
  ToyProvider p;
  std::mutex mu;
  std::condition_variable cv;
  bool head_on_second = false, tail_waited = false, overlapped = false;
  p.head->before_step_ = [&](const StepRequest& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.expected_seq_len == 4) head_on_second = true;
    cv.notify_all();
  };
  p.tail->before_step_ = [&](const StepRequest& r) {
    if (!r.prefill || tail_waited) return;  // the first piece
    std::unique_lock<std::mutex> lock(mu);
    tail_waited = true;
    overlapped = cv.wait_for(lock, std::chrono::seconds(20), [&] { return head_on_second; });
  };
  const auto prompt = LongPrompt(12);
  GenerateResult r = Generate(p, prompt, Chunked(3, 4));
  EXPECT_TRUE(tail_waited);
  EXPECT_TRUE(overlapped);
  EXPECT_EQ(r.generated_ids, Expected(prompt, 3));
}

TEST(ChunkedPrefill, AMissOnAPieceReprefillsAndKeepsTheOutput) {
  ToyProvider p;
  bool dropped = false;
  p.middles[0]->before_step_ = [&](const StepRequest& r) {
    if (dropped || r.expected_seq_len != 10) return;  // the third piece
    dropped = true;
    std::lock_guard<std::mutex> lock(p.middles[0]->mu_);
    p.middles[0]->forget_next_ = true;
  };
  const auto prompt = LongPrompt(25);
  GenerateResult r = Generate(p, prompt, Chunked(4, 5));
  EXPECT_TRUE(dropped);
  EXPECT_EQ(r.re_prefills, 1);
  EXPECT_EQ(r.generated_ids, Expected(prompt, 4));
  // The tail never saw the third piece of the first attempt (the middle's
  // miss stopped it), at most the two before it; then 5 pieces and 3 decodes.
  EXPECT_GE(p.tail->steps_, 5 + 3);
  EXPECT_LE(p.tail->steps_, 2 + 5 + 3);
}

TEST(ChunkedPrefill, ADeadHopFailsOverWithANewEpoch) {
  ToyProvider p;
  p.middles[0]->before_step_ = [&](const StepRequest& r) {
    if (r.expected_seq_len == 6) {
      std::lock_guard<std::mutex> lock(p.middles[0]->mu_);
      p.middles[0]->dead_ = true;
    }
  };
  const auto prompt = LongPrompt(20);
  GenerateResult r = Generate(p, prompt, Chunked(5, 3));
  EXPECT_EQ(r.failovers, 1);
  EXPECT_EQ(r.final_epoch, 1);
  EXPECT_EQ(r.generated_ids, Expected(prompt, 5));
  EXPECT_EQ(p.middles[1]->epochs_seen_.front(), 1);
}

TEST(ChunkedPrefill, ABusyHopIsRetriedAndAnErrorEndsTheGeneration) {
  {
    ToyProvider p;
    p.tail->fail_at_ = 8;
    p.tail->fail_kind_ = ErrorKind::kResourceExhausted;
    const auto prompt = LongPrompt(16);
    GenerateResult r = Generate(p, prompt, Chunked(3, 4));
    EXPECT_EQ(r.busy_retries, 1);
    EXPECT_EQ(r.generated_ids, Expected(prompt, 3));
  }
  ToyProvider p;
  p.middles[0]->fail_at_ = 4;
  p.middles[0]->fail_kind_ = ErrorKind::kBoundaryContract;
  try {
    Generate(p, LongPrompt(16), Chunked(3, 4));
    FAIL() << "expected the hop's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBoundaryContract);
    EXPECT_NE(std::string(e.what()).find("mid-a failed"), std::string::npos);
  }
  // Released everywhere on the way out.
  EXPECT_TRUE(p.head->state_.empty());
  EXPECT_TRUE(p.tail->state_.empty());
}

TEST(ChunkedPrefill, AStopBetweenPiecesEndsItAndReleasesEveryHop) {
  ToyProvider p;
  GenerateEvents events;
  events.stop_requested = [&] {
    std::lock_guard<std::mutex> lock(p.head->mu_);
    return p.head->steps_ >= 2;
  };
  GenerateResult r = Generate(p, LongPrompt(30), Chunked(5, 3), events);
  EXPECT_TRUE(r.stopped);
  EXPECT_TRUE(r.generated_ids.empty());
  EXPECT_EQ(p.head->steps_, 2);  // no piece after the request
  EXPECT_EQ(p.head->releases_, 1);
  EXPECT_EQ(p.tail->releases_, 1);
  EXPECT_TRUE(p.middles[0]->state_.empty());
}

// A route of one hop takes the prompt whole: no activations cross a wire.
TEST(ChunkedPrefill, ARouteOfOneHopTakesThePromptWhole) {
  auto solo = std::make_shared<ToyHop>("solo", true, true);
  FixedRouteProvider p(Route{{solo}});
  const auto prompt = LongPrompt(23);
  GenerateResult r = Generate(p, prompt, Chunked(4, 5));
  EXPECT_EQ(r.generated_ids, Expected(prompt, 4));
  EXPECT_EQ(solo->steps_, 1 + 3);
  EXPECT_EQ(solo->max_rows_, 23u);
  EXPECT_EQ(solo->route_hops_, 1);
}

TEST(ChunkedPrefill, RejectsANegativeChunk) {
  ToyProvider p;
  EXPECT_THROW(Generate(p, kPrompt, Chunked(3, -1)), Error);
}

}  // namespace
}  // namespace meshnet::mesh
