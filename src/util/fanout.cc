#include "util/fanout.h"

#include <algorithm>
#include <system_error>

namespace meshnet::util {

struct Fanout::Call {
  explicit Call(Mutex* mu) : done(mu) {}
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t remaining = 0;  // items not finished
  CondVar done;           // remaining reached 0
};

Fanout::Fanout(int max_threads) : max_threads_(std::max(0, max_threads)) {}

Fanout::~Fanout() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

int Fanout::threads() const {
  MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void Fanout::RunTaskLocked(const Task& task) {
  mu_.Unlock();
  (*task.call->fn)(task.index);
  mu_.Lock();
  if (--task.call->remaining == 0) task.call->done.SignalAll();
}

void Fanout::Loop() {
  MutexLock lock(&mu_);
  while (true) {
    while (queue_.empty() && !stopping_) {
      ++idle_;
      work_.Wait();
      --idle_;
    }
    if (queue_.empty()) return;  // stopping, nothing left
    const Task task = queue_.front();
    queue_.pop_front();
    RunTaskLocked(task);
  }
}

void Fanout::Run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  Call call(&mu_);
  call.fn = &fn;
  call.remaining = n;
  MutexLock lock(&mu_);
  for (int64_t i = 1; i < n; ++i) queue_.push_back({&call, i});
  // Enough threads for everything queued, within the cap.
  int64_t start = static_cast<int64_t>(queue_.size()) - idle_;
  while (!stopping_ && start-- > 0 && static_cast<int>(threads_.size()) < max_threads_) {
    try {
      threads_.emplace_back([this] { Loop(); });
    } catch (const std::system_error&) {
      break;  // the OS refused a thread: the caller runs what is left
    }
  }
  work_.SignalAll();
  RunTaskLocked({&call, 0});
  // Items no thread took yet: run them here (all threads busy, or stopping).
  while (call.remaining > 0) {
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [&call](const Task& t) { return t.call == &call; });
    if (it == queue_.end()) {
      call.done.Wait();
      continue;
    }
    const Task task = *it;
    queue_.erase(it);
    RunTaskLocked(task);
  }
}

}  // namespace meshnet::util
