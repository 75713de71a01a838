#include "util/stop_signals.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace meshnet {

struct StopSignals::State {
  sigset_t set;
  std::mutex mu;
  std::condition_variable cv;
  bool armed = false;  // GUARDED_BY(mu)
  int received = 0;    // GUARDED_BY(mu): the armed signal, 0 = none yet
};

namespace {

[[noreturn]] void ExitNow(int sig, const char* when) {
  // Async-signal-safe enough: we are on a normal thread (sigwait), but keep
  // it to write + _exit so no lock or destructor can stall the exit.
  char line[96];
  const int n = std::snprintf(line, sizeof line, "meshnet: %s %s, exiting\n",
                              sig == SIGINT ? "SIGINT" : "SIGTERM", when);
  if (n > 0) (void)!::write(STDERR_FILENO, line, static_cast<size_t>(n));
  ::_exit(128 + sig);
}

}  // namespace

StopSignals::StopSignals() : state_(new State) {
  sigemptyset(&state_->set);
  sigaddset(&state_->set, SIGINT);
  sigaddset(&state_->set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &state_->set, nullptr);
  State* st = state_;
  std::thread([st] {
    for (;;) {
      int sig = 0;
      if (sigwait(&st->set, &sig) != 0) continue;
      std::unique_lock<std::mutex> lock(st->mu);
      if (!st->armed) ExitNow(sig, "before serving");
      if (st->received != 0) ExitNow(sig, "again while stopping");
      st->received = sig;
      st->cv.notify_all();
    }
  }).detach();
}

// The waiter thread may still run (detached, blocked in sigwait): the state
// is leaked on purpose, it lives as long as the process.
StopSignals::~StopSignals() = default;

void StopSignals::Arm() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->armed = true;
}

int StopSignals::Wait() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [this] { return state_->received != 0; });
  return state_->received;
}

}  // namespace meshnet
