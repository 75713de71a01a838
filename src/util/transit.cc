#include "util/transit.h"

#include <algorithm>
#include <chrono>

namespace meshnet::util {

thread_local Transit::ThreadMark Transit::mark_;

Transit::ThreadMark::~ThreadMark() { Get().Clear(); }

Transit& Transit::Get() {
  static Transit t;
  return t;
}

void Transit::Mark() {
  if (mark_.on) return;
  mark_.on = true;
  Count(1);
}

void Transit::Clear() {
  if (!mark_.on) return;
  mark_.on = false;
  Uncount();
}

void Transit::Count(int64_t k) {
  MutexLock lock(&mu_);
  n_ += k;
}

void Transit::Adopt() {
  if (mark_.on) return Uncount();  // marked already: one mark per thread
  mark_.on = true;
}

void Transit::Uncount() {
  MutexLock lock(&mu_);
  --n_;
  // Which mark cleared is not known: a forgotten one, as far as the count of
  // forgotten ones goes (so it never exceeds those still marked).
  forgotten_ = std::min(forgotten_, n_);
  if (n_ <= forgotten_) zero_.SignalAll();
}

void Transit::Wait(double seconds) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  MutexLock lock(&mu_);
  while (n_ > forgotten_) {
    if (!zero_.WaitUntil(until)) {  // ran out: what is left is not waited for again
      forgotten_ = n_;
      return;
    }
  }
}

int64_t Transit::count() const {
  MutexLock lock(&mu_);
  return n_;
}

bool Transit::marked() { return mark_.on; }

}  // namespace meshnet::util
