// Fanout: runs the items of one call at the same time, each on a thread of
// its own, when the items block for long (a node's StepMany: each step waits
// in the node's batcher for the batch it is in, so the steps of one call must
// all be waiting at once to be batched together).
//
//   util::Fanout fanout(64);
//   fanout.Run(n, [&](int64_t i) { outcomes[i] = RunStep(requests[i]); });
//
// Run(n, fn) calls fn(0) on the calling thread and fn(1..n-1) on kept
// threads, started as needed up to max_threads (idle ones wait for the next
// call; none is started per item once warm). When every thread is busy, the
// caller runs the items nobody took itself, one after the other, so a call
// always finishes. Written here because no Debian library offers a blocking-task
// executor we could use (ThreadPool, util/thread_pool.h, is for short compute
// chunks: its workers spin, and a blocking item would stall its ParallelFor).
//
// Thread-safety: Run may be called from several threads at once. fn must not
// throw (catch inside it). The destructor waits for running items and joins.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "util/mutex.h"

namespace meshnet::util {

class Fanout {
 public:
  // max_threads >= 0 (0: the caller runs every item).
  explicit Fanout(int max_threads);
  ~Fanout();
  Fanout(const Fanout&) = delete;
  Fanout& operator=(const Fanout&) = delete;

  void Run(int64_t n, const std::function<void(int64_t)>& fn) EXCLUDES(mu_);

  int threads() const EXCLUDES(mu_);  // started so far

 private:
  struct Call;
  struct Task {
    Call* call;
    int64_t index;
  };
  void Loop() EXCLUDES(mu_);
  // Runs `task` and counts it done (mu_ released around the item).
  void RunTaskLocked(const Task& task) REQUIRES(mu_);

  const int max_threads_;
  mutable Mutex mu_;
  CondVar work_{&mu_};  // a task was queued, or stopping
  std::deque<Task> queue_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  int idle_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace meshnet::util
