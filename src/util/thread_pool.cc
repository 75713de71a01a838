// Invariants:
// - state_ = (generation << 32) | kClosed | joined. A job is published by the
//   thread holding run_mu_: it writes job_* and next_, then stores a new
//   generation with joined = 0 and kClosed clear (release, under wake_mu_ so
//   sleeping workers cannot miss it).
// - A worker joins the current job only by a CAS that increments `joined`
//   while kClosed is clear and the generation is the one it observed; only a
//   joined worker reads job_* and claims chunks through next_.
// - The publisher runs chunks too, then sets kClosed and waits until joined
//   reaches 0. After that no worker touches job_ctx_ (the caller's stack), and
//   job_* may be rewritten. Workers that wake late (descheduled on a busy
//   machine) find the job closed and go back to waiting: the caller never
//   waits for a worker that did not start.
// - t_current_pool marks threads already inside a ParallelFor of a pool
//   (workers always, callers for the duration of a job): nested calls run inline.
#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <system_error>

#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace meshnet {

namespace {

thread_local const ThreadPool* t_current_pool = nullptr;

constexpr uint64_t kClosed = uint64_t{1} << 31;
constexpr uint64_t kJoinedMask = kClosed - 1;
constexpr uint64_t kGenerationOne = uint64_t{1} << 32;

inline uint64_t Generation(uint64_t state) { return state >> 32; }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a worker spins for the next job (and a caller for completion)
// before blocking: long enough to cover the gaps between kernels in a step.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// Spins until pred() or kSpinTime elapses; returns pred().
template <class Pred>
bool SpinUntil(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

// Pins the calling thread to `cpu`; false if the OS refuses (then nothing changed).
bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
}

// Lets the calling thread run on any of `cpus`.
void PinToAll(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

}  // namespace

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads = std::max(num_threads, 1);
  std::vector<int> allowed = AllowedCpus();
  if (num_threads > 1 && static_cast<int>(allowed.size()) == num_threads)
    cpus_ = std::move(allowed);
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  try {
    for (int i = 0; i + 1 < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  } catch (const std::system_error& e) {
    // The OS refused a thread (thread limit, memory): stop and join the ones
    // already running (a joinable std::thread must not be destroyed), then
    // report it as an error the caller can print.
    const size_t started = workers_.size();
    StopAndJoin();
    throw Error(ErrorKind::kInvalidArgument,
                "cannot start " + std::to_string(num_threads - 1) + " compute threads (" +
                    std::to_string(started) + " started): " + e.what() + "; use fewer --threads");
  }
}

ThreadPool::~ThreadPool() { StopAndJoin(); }

void ThreadPool::StopAndJoin() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    stop_.store(true, std::memory_order_relaxed);
    const uint64_t gen = Generation(state_.load(std::memory_order_relaxed)) + 1;
    state_.store((gen << 32) | kClosed, std::memory_order_release);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  const int64_t n = job_n_;
  const int64_t chunk = job_chunk_;
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk, std::memory_order_relaxed);
    if (begin >= n) return;
    job_fn_(job_ctx_, begin, std::min(n, begin + chunk));
  }
}

void ThreadPool::Run(int64_t n, int64_t min_chunk, Trampoline fn, void* ctx) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(min_chunk, 1);
  std::unique_lock<std::mutex> run_lock(run_mu_, std::defer_lock);
  if (workers_.empty() || n <= min_chunk || t_current_pool == this || !run_lock.try_lock()) {
    fn(ctx, 0, n);
    return;
  }
  // About 4 chunks per thread balances load without much claiming traffic.
  const int64_t threads = num_threads();
  const int64_t chunk = std::max(min_chunk, (n + 4 * threads - 1) / (4 * threads));
  job_n_ = n;
  job_chunk_ = chunk;
  job_fn_ = fn;
  job_ctx_ = ctx;
  next_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    const uint64_t gen = Generation(state_.load(std::memory_order_relaxed)) + 1;
    state_.store(gen << 32, std::memory_order_release);
  }
  wake_cv_.notify_all();

  const ThreadPool* outer = t_current_pool;
  t_current_pool = this;
  RunChunks();
  t_current_pool = outer;

  // Close the job; wait for the workers that joined it.
  const uint64_t closed = state_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
  if ((closed & kJoinedMask) == 0) return;
  auto all_left = [this] { return (state_.load(std::memory_order_acquire) & kJoinedMask) == 0; };
  if (!SpinUntil(all_left)) {
    std::unique_lock<std::mutex> lock(done_mu_);
    done_cv_.wait(lock, all_left);
  }
}

ThreadPool::PinnedCaller::PinnedCaller(ThreadPool* pool) {
  if (pool == nullptr || pool->cpus_.empty()) return;
  if (pool->caller_pinned_.exchange(true, std::memory_order_acquire)) return;  // another one
  if (sched_getaffinity(0, sizeof(previous_), &previous_) != 0 || !PinTo(pool->cpus_[0])) {
    pool->caller_pinned_.store(false, std::memory_order_release);
    return;
  }
  pool_ = pool;
}

ThreadPool::PinnedCaller::~PinnedCaller() {
  if (pool_ == nullptr) return;
  sched_setaffinity(0, sizeof(previous_), &previous_);
  pool_->caller_pinned_.store(false, std::memory_order_release);
}

void ThreadPool::WorkerLoop(int index) {
  t_current_pool = this;
  bool pinned = false;  // to its CPU, while a PinnedCaller is alive
  uint64_t seen = 0;    // generation at construction; a job may already be published
  for (;;) {
    auto published = [&] { return Generation(state_.load(std::memory_order_acquire)) != seen; };
    if (!SpinUntil(published)) {
      std::unique_lock<std::mutex> lock(wake_mu_);
      wake_cv_.wait(lock, published);
    }
    if (stop_.load(std::memory_order_relaxed)) return;  // ordered by the state acquire
    uint64_t state = state_.load(std::memory_order_acquire);
    seen = Generation(state);
    bool joined = false;
    while (Generation(state) == seen && (state & kClosed) == 0) {
      if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;  // closed before we got there (or a newer job: next loop)
    // Follow the callers' placement (a syscall only when it changes). A worker
    // that cannot be pinned runs where the scheduler puts it.
    if (!cpus_.empty() && caller_pinned_.load(std::memory_order_relaxed) != pinned) {
      pinned = !pinned;
      if (pinned) {
        PinTo(cpus_[static_cast<size_t>(index) + 1]);
      } else {
        PinToAll(cpus_);
      }
    }
    RunChunks();
    const uint64_t after = state_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if ((after & kClosed) != 0 && (after & kJoinedMask) == 0) {
      std::lock_guard<std::mutex> lock(done_mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace meshnet
