#include "rpc/server_limits.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "util/error.h"

namespace meshnet::rpc {

namespace {
constexpr double kWindowS = 60.0;  // a session opened within it is not charged again
}  // namespace

SessionRateLimiter::SessionRateLimiter(int64_t per_minute, const meshnet::Clock* clock)
    : per_minute_(static_cast<double>(per_minute)),
      per_second_(static_cast<double>(per_minute) / kWindowS),
      clock_(clock) {
  if (per_minute < 1 || per_minute > kMaxNewSessionsPerMinute) {
    ThrowInvalidArgument("--max-new-sessions-per-minute must be in 1.." +
                         std::to_string(kMaxNewSessionsPerMinute));
  }
}

void SessionRateLimiter::RefillLocked(Peer& p, double now) const {
  p.tokens = std::min(per_minute_, p.tokens + (now - p.updated) * per_second_);
  p.updated = now;
}

void SessionRateLimiter::ForgetOldLocked(Peer& p, double now) const {
  std::erase_if(p.opened, [&](const auto& e) { return now - e.second >= kWindowS; });
}

// Drops peers whose bucket is full again and who opened nothing within the
// window: they are indistinguishable from new ones. Amortized O(1) per Open.
void SessionRateLimiter::SweepLocked(double now) {
  if (peers_.size() < sweep_at_) return;
  for (auto it = peers_.begin(); it != peers_.end();) {
    RefillLocked(it->second, now);
    ForgetOldLocked(it->second, now);
    const bool idle = it->second.tokens >= per_minute_ && it->second.opened.empty();
    it = idle ? peers_.erase(it) : std::next(it);
  }
  sweep_at_ = std::max<size_t>(1024, 2 * peers_.size());
}

void SessionRateLimiter::Open(const std::string& peer, const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_->Now();
  SweepLocked(now);
  auto [it, fresh] = peers_.try_emplace(peer);
  Peer& p = it->second;
  if (fresh) {
    p.tokens = per_minute_;
    p.updated = now;
  }
  RefillLocked(p, now);
  if (auto s = p.opened.find(session_id); s != p.opened.end() && now - s->second < kWindowS) {
    return;  // opened within the window: a re-prefill or a retry
  }
  if (p.tokens < 1.0) {
    ++refused_;
    const auto retry_ms = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil((1.0 - p.tokens) / per_second_ * 1000)));
    throw Error(ErrorKind::kResourceExhausted,
                "too many new sessions from " + peer + " (limit " +
                    std::to_string(static_cast<int64_t>(per_minute_)) + " per minute); retry in " +
                    std::to_string(retry_ms) + " ms");
  }
  p.tokens -= 1.0;
  if (p.opened.size() >= 2 * static_cast<size_t>(per_minute_)) ForgetOldLocked(p, now);
  p.opened[session_id] = now;
}

int64_t SessionRateLimiter::peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(peers_.size());
}

int64_t SessionRateLimiter::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

}  // namespace meshnet::rpc
