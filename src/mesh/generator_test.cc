// The generation loop against scripted endpoints (no model): a toy pipeline
// whose tail output depends on the whole token history each hop holds, so any
// lost or duplicated state changes the output.
#include "mesh/generator.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

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
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_;
    if (dead_) throw Error(ErrorKind::kUnavailable, name_ + " is dead");
    const auto key = std::make_pair(req.session_id, req.route_epoch);
    epochs_seen_.push_back(req.route_epoch);
    if (req.prefill) {
      state_[key].clear();
    } else {
      auto it = state_.find(key);
      if (it == state_.end() || forget_next_) {
        forget_next_ = false;
        state_.erase(key);
        return kv::CacheMiss{req.session_id, req.route_epoch, kv::CacheMissReason::kEvictedLru, ""};
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
  int steps_ = 0;
  int releases_ = 0;
  std::vector<int64_t> epochs_seen_;
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
