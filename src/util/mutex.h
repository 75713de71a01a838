// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// the clang thread-safety annotations (util/thread_annotations.h), so that
// GUARDED_BY / REQUIRES / EXCLUDES are checked by the compiler. The style of
// LevelDB's port::Mutex / port::CondVar / MutexLock; the standard types carry
// no annotations with libstdc++.
//
//   Mutex mu_;
//   CondVar changed_{&mu_};
//   std::vector<int> items_ GUARDED_BY(mu_);
//   ...
//   MutexLock lock(&mu_);
//   while (items_.empty()) changed_.Wait();
//
// Thread-safety: these are the synchronization.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace meshnet {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // For the analysis only: tells it the caller holds this mutex.
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable bound to one Mutex, which the caller of Wait/WaitUntil
// must hold (it is released while waiting and held again on return).
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False if `deadline` passed (spurious wake-ups return true: re-check).
  template <typename Clock, typename Duration>
  bool WaitUntil(const std::chrono::time_point<Clock, Duration>& deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    const bool woke = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woke;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace meshnet
