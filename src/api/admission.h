// Admission control for generations: at most `max_concurrent` run at once,
// at most `max_queue` wait for a slot; beyond that a request is refused at
// once (the server answers 429 with Retry-After). Shutdown wakes every waiter
// and refuses new ones.
//
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <condition_variable>
#include <mutex>

namespace meshnet::api {

class Admission {
 public:
  enum class Outcome { kAdmitted, kQueueFull, kShuttingDown };

  Admission(int max_concurrent, int max_queue);

  // Blocks while queued. kAdmitted must be paired with Release().
  Outcome Acquire();
  void Release();
  void Shutdown();
  int in_flight() const;
  int queued() const;

 private:
  const int max_concurrent_;
  const int max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
  int waiting_ = 0;
  bool shutting_down_ = false;
};

// RAII: releases an admitted slot.
class AdmissionSlot {
 public:
  explicit AdmissionSlot(Admission* a) : a_(a) {}
  ~AdmissionSlot() {
    if (a_ != nullptr) a_->Release();
  }
  AdmissionSlot(const AdmissionSlot&) = delete;
  AdmissionSlot& operator=(const AdmissionSlot&) = delete;

 private:
  Admission* a_;
};

}  // namespace meshnet::api
