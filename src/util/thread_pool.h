// A fixed pool of worker threads for data-parallel kernels.
//
//   ThreadPool pool;                          // hardware threads (caller included)
//   pool.ParallelFor(rows, [&](int64_t begin, int64_t end) { ... });
//
// Contract:
// - ParallelFor(n, fn) calls fn(begin, end) on disjoint ranges covering [0, n)
//   exactly once each, and returns after all calls have returned. The calling
//   thread runs ranges too. Ranges are chunks of at least `min_chunk` items
//   (except the last), claimed dynamically, so a slow core does not hold the rest.
// - No allocation per call and no std::function: fn is passed by reference
//   through a plain function pointer; it must not throw (kernels do not).
// - Thread-safety: ParallelFor may be called from any number of threads at once.
//   One call at a time is spread over the workers; a call that finds the pool
//   busy, or is nested inside a ParallelFor of the same pool, runs all of its
//   ranges inline on its own thread (never blocks, never deadlocks).
// - Workers spin briefly after each job before sleeping, so back-to-back kernel
//   calls (a decode step) do not pay a futex wake-up each.
// - Placement: in a pool with as many threads as the CPUs this process may run
//   on (its affinity mask at construction), a PinnedCaller keeps the thread
//   that drives a series of calls (a batch's forward pass) on the mask's first
//   CPU and, while it lives, worker i runs on CPU i + 1 (pinned when it joins
//   a job, unpinned at the first job after). Left to the scheduler, a worker
//   woken from sleep was often placed on the caller's CPU (wake-affine) while
//   the other stayed idle, and a whole forward pass ran on one CPU (16
//   sessions on 2 vCPUs: 10-35% of the batch cycles' wall time at ~1 CPU,
//   0-7% with the threads placed). Any other pool size (e.g. several
//   single-thread nodes sharing a machine) leaves placement to the scheduler.
#pragma once

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace meshnet {

// The CPUs this process may run on (its affinity mask), in increasing order;
// empty if the mask cannot be read.
std::vector<int> AllowedCpus();

class ThreadPool {
 public:
  // num_threads counts the calling thread: N means N-1 workers. 0 picks
  // std::thread::hardware_concurrency() (at least 1). Throws
  // Error(kInvalidArgument) if the OS refuses a thread (workers already
  // started are joined first). Callers bound N (cli: kMaxThreads).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // While alive, the constructing thread runs only on the CPU the workers
  // leave free (its previous affinity is restored at destruction), and the
  // workers on theirs. Does nothing if the pool does not place its threads
  // (its size is not the number of allowed CPUs) or another PinnedCaller of
  // the pool is alive (concurrent callers run inline or take turns, and two
  // of them on one CPU would be worse than none pinned). Not movable.
  class PinnedCaller {
   public:
    explicit PinnedCaller(ThreadPool* pool);
    ~PinnedCaller();
    PinnedCaller(const PinnedCaller&) = delete;
    PinnedCaller& operator=(const PinnedCaller&) = delete;
    bool pinned() const { return pool_ != nullptr; }

   private:
    ThreadPool* pool_ = nullptr;  // set while pinned
    cpu_set_t previous_;
  };

  // The CPUs a PinnedCaller and the workers are placed on (the caller's
  // first), or empty when the pool leaves placement to the scheduler.
  const std::vector<int>& pinned_cpus() const { return cpus_; }

  // Threads that take part in a ParallelFor (workers + caller).
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  template <class Fn>
  void ParallelFor(int64_t n, Fn&& fn, int64_t min_chunk = 1) {
    using F = std::remove_reference_t<Fn>;
    Run(
        n, min_chunk,
        [](void* ctx, int64_t begin, int64_t end) { (*static_cast<F*>(ctx))(begin, end); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);

  void Run(int64_t n, int64_t min_chunk, Trampoline fn, void* ctx);
  void WorkerLoop(int index);
  void StopAndJoin();  // ends every worker; the pool is unusable after
  void RunChunks();

  std::vector<std::thread> workers_;
  std::vector<int> cpus_;                   // see pinned_cpus(); written before the workers start
  std::atomic<bool> caller_pinned_{false};  // a PinnedCaller is alive

  // Serializes pool-wide jobs; a caller that cannot take it runs inline. The
  // job fields below are written by its holder but read by workers without
  // it (published through state_), so they are not GUARDED_BY it.
  std::mutex run_mu_;

  // The current job. Written by the owner of run_mu_ while no worker is joined
  // (see thread_pool.cc), read by joined workers.
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 1;
  Trampoline job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::atomic<int64_t> next_{0};  // next unclaimed item

  // (generation << 32) | kClosed bit | number of joined workers.
  std::atomic<uint64_t> state_{0};
  std::atomic<bool> stop_{false};  // set before the final generation bump
  // wake_mu_ and done_mu_ guard no data (the state is in the atomics above):
  // they only pair with their condition variables for sleeping, so they stay
  // plain std::mutex (nothing for the thread-safety analysis to check).
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
};

// pool->ParallelFor(n, fn, min_chunk), or fn(0, n) on the caller when pool is
// null (single-threaded callers).
template <class Fn>
void ParallelForOrInline(ThreadPool* pool, int64_t n, Fn&& fn, int64_t min_chunk = 1) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn, min_chunk);
  } else {
    fn(0, n);
  }
}

}  // namespace meshnet
