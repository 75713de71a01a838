#include "api/admission.h"

namespace meshnet::api {

Admission::Admission(int max_concurrent, int max_queue)
    : max_concurrent_(max_concurrent), max_queue_(max_queue) {}

Admission::Outcome Admission::Acquire() {
  std::unique_lock lock(mu_);
  if (shutting_down_) return Outcome::kShuttingDown;
  if (running_ < max_concurrent_ && waiting_ == 0) {
    ++running_;
    return Outcome::kAdmitted;
  }
  if (waiting_ >= max_queue_) return Outcome::kQueueFull;
  ++waiting_;
  cv_.wait(lock, [&] { return shutting_down_ || running_ < max_concurrent_; });
  --waiting_;
  if (shutting_down_) return Outcome::kShuttingDown;
  ++running_;
  return Outcome::kAdmitted;
}

void Admission::Release() {
  {
    std::lock_guard lock(mu_);
    --running_;
  }
  cv_.notify_one();
}

void Admission::Shutdown() {
  {
    std::lock_guard lock(mu_);
    shutting_down_ = true;
  }
  cv_.notify_all();
}

int Admission::in_flight() const {
  std::lock_guard lock(mu_);
  return running_;
}

int Admission::queued() const {
  std::lock_guard lock(mu_);
  return waiting_;
}

}  // namespace meshnet::api
