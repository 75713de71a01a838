// Injectable clock. The KV manager reads time only through a Clock so that
// tests and `meshnet kv replay` can drive it by hand.
//
// Thread-safety: Now() may be called from any thread. FakeClock::Set is safe
// to call concurrently with Now().
#pragma once

#include <atomic>
#include <cstdint>

namespace meshnet {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds on a monotonic time line; never decreases.
  virtual double Now() const = 0;
};

// std::chrono::steady_clock in seconds.
class SteadyClock final : public Clock {
 public:
  double Now() const override;
  static SteadyClock* Default();
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start = 0.0) : now_(start) {}
  double Now() const override { return now_.load(std::memory_order_acquire); }
  void Set(double t) { now_.store(t, std::memory_order_release); }
  void Advance(double dt) { Set(Now() + dt); }

 private:
  std::atomic<double> now_;
};

// Wall-clock time in milliseconds since the Unix epoch (record and proof
// timestamps that other machines compare; not for measuring durations).
int64_t UnixMillis();

}  // namespace meshnet
