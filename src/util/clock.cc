#include "util/clock.h"

#include <chrono>

namespace meshnet {

double SteadyClock::Now() const {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

SteadyClock* SteadyClock::Default() {
  static SteadyClock clock;
  return &clock;
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace meshnet
