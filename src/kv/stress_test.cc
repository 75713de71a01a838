// Concurrency stress: 8 threads drive one HotKvStateManager with many sessions
// under a tight block budget, a short TTL on a FakeClock that the threads
// advance (monotonically, under a mutex), and Release calls racing in from
// other threads. Each thread owns its sessions, writes content derived from
// (session, epoch, position, layer, head, dim) through steps and appends,
// and reads back the full content of the session after every operation.
// Run it under ThreadSanitizer (-DMESHNET_SANITIZE=thread) and ASan.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv/hot_kv_state.h"
#include "util/error.h"

namespace meshnet::kv {
namespace {

constexpr int kThreads = 8;
constexpr int kSessionsPerThread = 6;
constexpr int kMaxLen = 40;

KvCacheRecipe StressRecipe() {
  KvCacheRecipe r;
  r.architecture_adapter = "llama";
  r.kv_dtype = KvDtype::kF32;
  r.n_kv_heads = 2;
  r.head_dim = 4;
  r.total_layers = 6;
  r.start_layer = 3;
  r.end_layer = 4;
  return r;
}

// Exact in float32; distinct across sessions, epochs, positions and layers.
float Value(int session, int64_t epoch, int64_t pos, int layer, int h, int d, bool key) {
  const int64_t x =
      (int64_t{session} * 1000003 + epoch * 7919 + pos * 131 + layer * 17 + h * 5 + d) % 1000000;
  return static_cast<float>(key ? x : -x - 1);
}

struct Shared {
  HotKvStateManager* manager;
  FakeClock* clock;
  std::mutex clock_mu;
  std::atomic<int64_t> epoch_of[kThreads * kSessionsPerThread] = {};
  std::atomic<int64_t> corruptions{0};
  std::atomic<int64_t> unexpected{0};
  std::atomic<int64_t> verified{0};
  std::atomic<int64_t> committed{0};
  std::atomic<int64_t> step_misses{0};
  std::atomic<int64_t> budget_refusals{0};

  void Tick() {
    std::lock_guard lock(clock_mu);
    clock->Advance(0.001);
  }
};

std::string Id(int s) { return "sess-" + std::to_string(s); }

class Worker {
 public:
  Worker(Shared& sh, int index) : sh_(sh), index_(index), rng_(1234 + index) {
    for (int k = 0; k < kSessionsPerThread; ++k) {
      len_[k] = -1;  // not open
      epoch_[k] = 0;
    }
  }

  void Run(int iterations) {
    for (int i = 0; i < iterations; ++i) {
      sh_.Tick();
      const int k = static_cast<int>(rng_() % kSessionsPerThread);
      try {
        Once(k);
      } catch (const CacheMissError&) {
        len_[k] = -1;  // strict accessors: the session is gone, reopen later
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kBudgetExceeded) {
          ++sh_.budget_refusals;  // pinned sessions of others hold the budget: benign
        } else {
          ADD_FAILURE() << "unexpected error: " << e.what();
          ++sh_.unexpected;
        }
      }
    }
  }

 private:
  int Global(int k) const { return index_ * kSessionsPerThread + k; }

  void Once(int k) {
    const int s = Global(k);
    const std::string id = Id(s);
    const KvCacheRecipe& r = sh_.manager->recipe();
    if (rng_() % 16 == 0) {
      // Race a release against another thread's session.
      const int victim = static_cast<int>(rng_() % (kThreads * kSessionsPerThread));
      sh_.manager->Release(Id(victim), sh_.epoch_of[victim].load());
      return;
    }
    if (len_[k] < 0) {
      ++epoch_[k];
      sh_.epoch_of[s].store(epoch_[k]);
      sh_.manager->Open(id, epoch_[k]);
      len_[k] = 0;
      Verify(k);
      return;
    }
    const int action = static_cast<int>(rng_() % 10);
    if (action < 5) {
      // Reserve / write / commit (or roll back).
      int64_t n = 1 + static_cast<int64_t>(rng_() % 4);
      if (len_[k] + n > kMaxLen) {
        len_[k] = sh_.manager->Truncate(id, epoch_[k], static_cast<int64_t>(rng_() % 8));
        Verify(k);
        return;
      }
      StepResult res = sh_.manager->BeginStep(id, epoch_[k], n, &r, len_[k]);
      if (std::holds_alternative<CacheMiss>(res)) {
        len_[k] = -1;
        return;
      }
      KvStep& step = std::get<KvStep>(res);
      for (int layer = r.start_layer; layer <= r.end_layer; ++layer) {
        ops::PagedKvLayer v = step.Layer(layer);
        for (int64_t p = step.start_pos(); p < step.start_pos() + n; ++p) {
          auto* kr = reinterpret_cast<float*>(v.KRow(p));
          auto* vr = reinterpret_cast<float*>(v.VRow(p));
          for (int h = 0; h < r.n_kv_heads; ++h)
            for (int d = 0; d < r.head_dim; ++d) {
              kr[h * r.head_dim + d] = Value(s, epoch_[k], p, layer, h, d, true);
              vr[h * r.head_dim + d] = Value(s, epoch_[k], p, layer, h, d, false);
            }
        }
      }
      if (rng_() % 8 == 0) {
        step.Rollback();
      } else if (rng_() % 32 == 0) {
        // Supersede our own session while the step is in flight.
        ++epoch_[k];
        sh_.epoch_of[s].store(epoch_[k]);
        sh_.manager->Open(id, epoch_[k]);
        // The step's session is dead (superseded, or killed earlier by a race):
        // its commit must miss.
        if (!step.Commit().has_value()) ++sh_.corruptions;
        len_[k] = 0;
      } else if (std::optional<CacheMiss> miss = step.Commit()) {
        ++sh_.step_misses;
        len_[k] = -1;
        return;
      } else {
        len_[k] += n;
        ++sh_.committed;
      }
    } else if (action < 8) {
      // The reference Append path.
      const int64_t n = 1 + static_cast<int64_t>(rng_() % 3);
      if (len_[k] + n > kMaxLen) return;
      std::vector<std::vector<float>> keys(r.num_owned_layers()), vals(r.num_owned_layers());
      std::vector<LayerKv> kv;
      for (int i = 0; i < r.num_owned_layers(); ++i) {
        const int layer = r.start_layer + i;
        for (int64_t p = len_[k]; p < len_[k] + n; ++p)
          for (int h = 0; h < r.n_kv_heads; ++h)
            for (int d = 0; d < r.head_dim; ++d) {
              keys[i].push_back(Value(s, epoch_[k], p, layer, h, d, true));
              vals[i].push_back(Value(s, epoch_[k], p, layer, h, d, false));
            }
        kv.push_back({layer, n, keys[i], vals[i]});
      }
      try {
        len_[k] = sh_.manager->Append(id, epoch_[k], kv, &r, len_[k]);
      } catch (const CacheMissError&) {
        len_[k] = -1;
        return;
      }
    } else {
      try {
        len_[k] = sh_.manager->Truncate(id, epoch_[k], len_[k] / 2);
      } catch (const CacheMissError&) {
        len_[k] = -1;
        return;
      }
    }
    Verify(k);
  }

  // Resolves the session and checks every committed row of every layer.
  void Verify(int k) {
    const int s = Global(k);
    const KvCacheRecipe& r = sh_.manager->recipe();
    ResolveResult res = sh_.manager->Resolve(Id(s), epoch_[k], &r, len_[k]);
    if (std::holds_alternative<CacheMiss>(res)) {
      len_[k] = -1;  // evicted, expired or released meanwhile: benign
      return;
    }
    const SessionHandle& h = std::get<SessionHandle>(res);
    if (h.seq_len() != len_[k]) ++sh_.corruptions;
    for (int layer = r.start_layer; layer <= r.end_layer; ++layer) {
      const std::vector<float> keys = h.ReadKeys(layer);
      const std::vector<float> vals = h.ReadValues(layer);
      if (static_cast<int64_t>(keys.size()) != len_[k] * r.n_kv_heads * r.head_dim) {
        ++sh_.corruptions;
        continue;
      }
      size_t i = 0;
      for (int64_t p = 0; p < len_[k]; ++p)
        for (int hh = 0; hh < r.n_kv_heads; ++hh)
          for (int d = 0; d < r.head_dim; ++d, ++i) {
            if (keys[i] != Value(s, epoch_[k], p, layer, hh, d, true) ||
                vals[i] != Value(s, epoch_[k], p, layer, hh, d, false)) {
              ++sh_.corruptions;
            }
          }
    }
    ++sh_.verified;
  }

  Shared& sh_;
  int index_;
  std::mt19937 rng_;
  int64_t len_[kSessionsPerThread];
  int64_t epoch_[kSessionsPerThread];
};

TEST(KvStressTest, ConcurrentSessionsNeverCorrupt) {
  FakeClock clock;
  HotKvStateConfig c;
  c.block_tokens = 4;
  c.budget_bytes = 24 * 4 * StressRecipe().BytesPerToken();  // 24 blocks for 48 sessions
  c.max_sessions = 16;
  c.ttl_seconds = 0.08;  // ~80 clock ticks of 1 ms
  c.miss_history = 64;
  c.epoch_history = 16;
  c.check_invariants = true;  // after every mutation, under contention
  HotKvStateManager manager(StressRecipe(), c, &clock);
  Shared sh;
  sh.manager = &manager;
  sh.clock = &clock;
  std::vector<std::thread> threads;
  std::vector<Worker> workers;
  workers.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) workers.emplace_back(sh, t);
  for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] { workers[t].Run(2000); });
  for (auto& th : threads) th.join();

  EXPECT_EQ(sh.corruptions.load(), 0);
  EXPECT_EQ(sh.unexpected.load(), 0);
  const HotKvStats s = manager.Stats();
  // The run exercised what it claims to.
  EXPECT_GT(sh.verified.load(), 1000);
  EXPECT_GT(sh.committed.load(), 1000);
  EXPECT_GT(s.evictions[static_cast<int>(CacheMissReason::kEvictedLru)], 0);
  EXPECT_GT(s.evictions[static_cast<int>(CacheMissReason::kEvictedTtl)], 0);
  EXPECT_GT(s.evictions[static_cast<int>(CacheMissReason::kReleased)], 0);
  EXPECT_GT(s.evictions[static_cast<int>(CacheMissReason::kSupersededEpoch)], 0);
  // Quiescent invariants: nothing pinned, blocks all accounted for.
  EXPECT_EQ(s.pinned_sessions, 0);
  EXPECT_LE(s.blocks_used, s.blocks_capacity);
  EXPECT_EQ(s.bytes_reserved, manager.TotalBytes());
  EXPECT_LE(s.remembered_epochs, s.live_sessions + c.epoch_history);
  EXPECT_EQ(manager.InvariantViolation(), "");
  std::printf(
      "verified=%lld committed=%lld step_misses=%lld budget_refusals=%lld lru=%lld ttl=%lld "
      "released=%lld\n",
      static_cast<long long>(sh.verified.load()), static_cast<long long>(sh.committed.load()),
      static_cast<long long>(sh.step_misses.load()),
      static_cast<long long>(sh.budget_refusals.load()),
      static_cast<long long>(s.evictions[static_cast<int>(CacheMissReason::kEvictedLru)]),
      static_cast<long long>(s.evictions[static_cast<int>(CacheMissReason::kEvictedTtl)]),
      static_cast<long long>(s.evictions[static_cast<int>(CacheMissReason::kReleased)]));
}

}  // namespace
}  // namespace meshnet::kv
