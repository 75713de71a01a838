#include "node/admission.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "util/error.h"

namespace meshnet::node {

void AdmissionOptions::Validate() const {
  if (max_active < 1) ThrowInvalidArgument("admission: max active sessions must be >= 1");
  if (!(active_window_s > 0) || !std::isfinite(active_window_s)) {
    ThrowInvalidArgument("admission: the active window must be a positive number of seconds");
  }
  if (!(max_wait_s >= 0) || max_wait_s > 3600) {
    ThrowInvalidArgument("admission: the wait must be in [0, 3600] seconds");
  }
  if (max_waiting < 0) ThrowInvalidArgument("admission: the queue length must be >= 0");
}

SessionAdmission::SessionAdmission(AdmissionOptions options, const meshnet::Clock* clock)
    : options_(options), clock_(clock) {
  options_.Validate();
}

int64_t SessionAdmission::ActiveLocked(double now) {
  for (auto it = last_step_.begin(); it != last_step_.end();) {
    it = now - it->second >= options_.active_window_s ? last_step_.erase(it) : std::next(it);
  }
  return static_cast<int64_t>(last_step_.size());
}

double SessionAdmission::NextExpiryLocked(double now) const {
  double next = options_.active_window_s;
  for (const auto& [id, last] : last_step_) {
    next = std::min(next, last + options_.active_window_s - now);
  }
  return std::max(next, 0.0);
}

void SessionAdmission::Admit(const std::string& session_id,
                             const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  double now = clock_->Now();
  if (auto it = last_step_.find(session_id); it != last_step_.end()) {
    it->second = now;  // already active (a re-prefill)
    return;
  }
  auto refuse = [&](const char* why) {
    const int64_t retry_ms =
        std::max<int64_t>(50, static_cast<int64_t>(1000 * std::min(NextExpiryLocked(now), 5.0)));
    throw Error(ErrorKind::kResourceExhausted,
                std::string("node busy: ") + why + " (" + std::to_string(options_.max_active) +
                    " sessions active, " + std::to_string(queue_.size()) + " waiting); retry in " +
                    std::to_string(retry_ms) + " ms");
  };
  if (queue_.empty() && ActiveLocked(now) < options_.max_active) {
    last_step_[session_id] = now;
    return;
  }
  if (static_cast<int64_t>(queue_.size()) >= options_.max_waiting) refuse("the wait queue is full");
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  const double deadline = now + options_.max_wait_s;
  for (;;) {
    now = clock_->Now();
    if (queue_.front() == ticket && ActiveLocked(now) < options_.max_active) break;
    const bool gone = cancelled && cancelled();
    if (gone || now >= deadline) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
      changed_.notify_all();  // the next in line may be admissible now
      if (gone) throw Error(ErrorKind::kUnavailable, "the caller went away while waiting");
      refuse("no session slot freed within the wait");
    }
    // Wake on a release, when an active session may have gone idle, at the
    // deadline, and every 100 ms to notice a cancelled caller.
    const double wait_s = std::min({deadline - now, NextExpiryLocked(now) + 1e-3, 0.1});
    changed_.wait_for(lock, std::chrono::duration<double>(std::max(wait_s, 1e-3)));
  }
  queue_.pop_front();
  last_step_[session_id] = now;
  changed_.notify_all();
}

void SessionAdmission::Touch(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  last_step_[session_id] = clock_->Now();
}

void SessionAdmission::Release(const std::string& session_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_step_.erase(session_id) == 0) return;
  }
  changed_.notify_all();
}

int64_t SessionAdmission::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_->Now();
  int64_t n = 0;
  for (const auto& [id, last] : last_step_) n += now - last < options_.active_window_s;
  return n;
}

int64_t SessionAdmission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace meshnet::node
