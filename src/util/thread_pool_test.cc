#include "util/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "util/error.h"

#if defined(__SANITIZE_THREAD__)
#define MESHNET_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MESHNET_TSAN_BUILD 1
#endif
#endif

// Counts allocations made by the current thread (to check ParallelFor allocates nothing).
namespace {
thread_local int64_t t_allocations = 0;
}  // namespace

#ifdef MESHNET_TSAN_BUILD
// clang links its TSan runtime whole (with its own operator new), so a
// replacement would not link: count through the sanitizer's malloc hooks.
#include <sanitizer/allocator_interface.h>
namespace {
void OnMalloc(const volatile void*, size_t) { ++t_allocations; }
void OnFree(const volatile void*) {}
[[maybe_unused]] const int kHooksInstalled =
    __sanitizer_install_malloc_and_free_hooks(OnMalloc, OnFree);
}  // namespace
#else
void* operator new(std::size_t size) {
  ++t_allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace meshnet {
namespace {

// Runs ParallelFor and checks every index in [0, n) was visited exactly once.
void ExpectCoversOnce(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  for (auto& h : hits) h.store(0);
  std::atomic<bool> bad_range{false};
  pool.ParallelFor(
      n,
      [&](int64_t begin, int64_t end) {
        if (begin < 0 || end > n || begin >= end) bad_range = true;
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      },
      min_chunk);
  EXPECT_FALSE(bad_range.load());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 4099}) {
      for (int64_t min_chunk : {1, 3, 16, 5000}) ExpectCoversOnce(pool, n, min_chunk);
    }
  }
}

TEST(ThreadPool, DefaultUsesHardwareThreads) {
  ThreadPool pool;
  EXPECT_EQ(pool.num_threads(), std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

TEST(ThreadPool, SingleThreadPoolRunsOnCaller) {
  ThreadPool pool(1);
  const auto me = std::this_thread::get_id();
  bool other = false;
  pool.ParallelFor(100, [&](int64_t, int64_t) { other |= std::this_thread::get_id() != me; });
  EXPECT_FALSE(other);
}

TEST(ThreadPool, WorkersAndCallerRunConcurrently) {
  // Two chunks each wait (bounded) until the other has started: this can only
  // succeed if two threads run ranges at the same time.
  ThreadPool pool(2);
  std::atomic<int> started{0};
  std::atomic<int> saw_both{0};
  pool.ParallelFor(
      2,
      [&](int64_t begin, int64_t end) {
        started.fetch_add(static_cast<int>(end - begin));
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        if (started.load() == 2) saw_both.fetch_add(1);
      },
      1);
  EXPECT_EQ(saw_both.load(), 2);
}

TEST(ThreadPool, DoesNotAllocatePerCall) {
  ThreadPool pool(2);
  std::vector<int64_t> sums(64, 0);
  pool.ParallelFor(64, [&](int64_t b, int64_t e) {
    for (; b < e; ++b) sums[b] += b;
  });  // warm
  const int64_t before = t_allocations;
  for (int rep = 0; rep < 100; ++rep) {
    pool.ParallelFor(64, [&](int64_t b, int64_t e) {
      for (; b < e; ++b) sums[static_cast<size_t>(b)] += b;
    });
  }
  EXPECT_EQ(t_allocations, before);
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(sums[static_cast<size_t>(i)], 101 * i);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(8, [&](int64_t b, int64_t e) {
    for (; b < e; ++b) {
      pool.ParallelFor(10, [&](int64_t ib, int64_t ie) { total.fetch_add(ie - ib); });
    }
  });
  EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, ManyConcurrentCallers) {
  ThreadPool pool(2);
  constexpr int kCallers = 4;
  constexpr int kRounds = 200;
  std::vector<int64_t> results(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::vector<int64_t> data(257);
      int64_t total = 0;
      for (int r = 0; r < kRounds; ++r) {
        pool.ParallelFor(static_cast<int64_t>(data.size()), [&](int64_t b, int64_t e) {
          for (; b < e; ++b) data[static_cast<size_t>(b)] = b * (r + c);
        });
        for (int64_t v : data) total += v;
      }
      results[static_cast<size_t>(c)] = total;
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    int64_t want = 0;
    for (int r = 0; r < kRounds; ++r) want += static_cast<int64_t>(256 * 257 / 2) * (r + c);
    EXPECT_EQ(results[static_cast<size_t>(c)], want) << c;
  }
}

TEST(ThreadPool, ManyQuickJobsThenDestroy) {
  for (int i = 0; i < 20; ++i) {
    ThreadPool pool(3);
    std::atomic<int64_t> sum{0};
    for (int j = 0; j < 50; ++j) {
      pool.ParallelFor(33, [&](int64_t b, int64_t e) {
        for (; b < e; ++b) sum.fetch_add(b);
      });
    }
    EXPECT_EQ(sum.load(), 50 * (32 * 33 / 2));
  }
}

// ---- placement (PinnedCaller) ----

cpu_set_t CurrentMask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return set;
}

TEST(ThreadPoolPlacement, AllowedCpusListsTheAffinityMask) {
  const std::vector<int> cpus = AllowedCpus();
  cpu_set_t mask = CurrentMask();
  ASSERT_EQ(static_cast<int>(cpus.size()), CPU_COUNT(&mask));
  for (size_t i = 0; i < cpus.size(); ++i) {
    EXPECT_TRUE(CPU_ISSET(cpus[i], &mask)) << cpus[i];
    if (i > 0) {
      EXPECT_LT(cpus[i - 1], cpus[i]);
    }
  }
}

struct Seen {
  std::thread::id id;
  int cpu = -1;
  cpu_set_t mask;
};

// One job of num_threads() chunks, each waiting (bounded) until every thread
// of the pool has started one: records each thread's CPU and affinity.
std::vector<Seen> RunOnEveryThread(ThreadPool& pool) {
  const int n = pool.num_threads();
  std::vector<Seen> seen(static_cast<size_t>(n));
  std::atomic<int> started{0};
  pool.ParallelFor(
      n,
      [&](int64_t begin, int64_t) {
        Seen& s = seen[static_cast<size_t>(begin)];
        s.id = std::this_thread::get_id();
        s.cpu = sched_getcpu();
        s.mask = CurrentMask();
        started.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (started.load() < n && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
      },
      1);
  EXPECT_EQ(started.load(), n);
  return seen;
}

TEST(ThreadPoolPlacement, PinnedCallerPutsCallerAndWorkersOnCpusOfTheirOwn) {
  const std::vector<int> cpus = AllowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs";
  ThreadPool pool(static_cast<int>(cpus.size()));
  ASSERT_EQ(pool.pinned_cpus(), cpus);
  cpu_set_t before = CurrentMask();
  {
    const ThreadPool::PinnedCaller pin(&pool);
    ASSERT_TRUE(pin.pinned());
    EXPECT_EQ(sched_getcpu(), cpus[0]);
    std::set<int> worker_cpus;
    for (Seen& s : RunOnEveryThread(pool)) {
      EXPECT_EQ(CPU_COUNT(&s.mask), 1);
      if (s.id == std::this_thread::get_id()) {
        EXPECT_EQ(s.cpu, cpus[0]);
      } else {
        worker_cpus.insert(s.cpu);
      }
    }
    EXPECT_EQ(worker_cpus, std::set<int>(cpus.begin() + 1, cpus.end()));
  }
  cpu_set_t after = CurrentMask();
  EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the caller's affinity is restored";
  // Without a PinnedCaller the workers unpin at their next job.
  for (Seen& s : RunOnEveryThread(pool)) EXPECT_TRUE(CPU_EQUAL(&s.mask, &before));
}

TEST(ThreadPoolPlacement, OnePinnedCallerAtATime) {
  const std::vector<int> cpus = AllowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs";
  ThreadPool pool(static_cast<int>(cpus.size()));
  {
    const ThreadPool::PinnedCaller first(&pool);
    ASSERT_TRUE(first.pinned());
    std::thread other([&] {
      cpu_set_t before = CurrentMask();
      const ThreadPool::PinnedCaller second(&pool);
      EXPECT_FALSE(second.pinned());
      cpu_set_t now = CurrentMask();
      EXPECT_TRUE(CPU_EQUAL(&before, &now));
    });
    other.join();
  }
  const ThreadPool::PinnedCaller again(&pool);  // the first one is gone
  EXPECT_TRUE(again.pinned());
}

TEST(ThreadPoolPlacement, PoolsNotMatchingTheCpusLeavePlacementToTheScheduler) {
  const std::vector<int> cpus = AllowedCpus();
  const ThreadPool::PinnedCaller none(nullptr);
  EXPECT_FALSE(none.pinned());
  for (int threads : {static_cast<int>(cpus.size()) - 1, static_cast<int>(cpus.size()) + 1}) {
    if (threads < 1) continue;
    ThreadPool pool(threads);
    EXPECT_TRUE(pool.pinned_cpus().empty()) << threads;
    cpu_set_t before = CurrentMask();
    const ThreadPool::PinnedCaller pin(&pool);
    EXPECT_FALSE(pin.pinned()) << threads;
    cpu_set_t now = CurrentMask();
    EXPECT_TRUE(CPU_EQUAL(&before, &now)) << threads;
    for (Seen& s : RunOnEveryThread(pool)) EXPECT_TRUE(CPU_EQUAL(&s.mask, &before)) << threads;
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MESHNET_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MESHNET_SANITIZED 1
#endif
#endif

// In a death-test child: limits the address space to what is mapped now plus
// 64 MiB (room for a few 8 MiB thread stacks), then asks for 256 threads.
// Exits 0 when that is an Error.
[[noreturn]] void StartPoolUnderAddressSpaceLimit() {
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t now = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE));
  const rlimit lim{now + (rlim_t{64} << 20), now + (rlim_t{64} << 20)};
  setrlimit(RLIMIT_AS, &lim);
  try {
    ThreadPool pool(256);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(0);
  }
  std::_Exit(1);
}

// A thread the OS refuses (here: the address-space limit leaves room for a
// few thread stacks only) is an Error naming the count, after the workers
// already started are joined: not std::terminate, not a hang.
TEST(ThreadPoolDeathTest, ThreadCreationFailureIsAnError) {
#ifdef MESHNET_SANITIZED
  GTEST_SKIP() << "sanitizers reserve more address space than the limit this test sets";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(StartPoolUnderAddressSpaceLimit(), ::testing::ExitedWithCode(0),
              "cannot start 255 compute threads");
#endif
}

}  // namespace
}  // namespace meshnet
