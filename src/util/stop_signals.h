// SIGINT/SIGTERM handling for long-running commands (meshnet serve).
//
//   StopSignals stop;   // first thing in the command, before any thread starts
//   ... load the model, bind ...   // a signal now ends the process at once
//   stop.Arm();         // serving: the next signal starts a graceful stop
//   int sig = stop.Wait();
//   ... drain (a second signal ends the process at once) ...
//
// Both signals are blocked in the constructing thread (and so in every thread
// started after it) and taken by one waiter thread with sigwait, so they work
// at any time, including while the main thread is blocked in a slow load.
// Before Arm() and after a first armed signal, a signal calls _exit(128 + sig)
// after one line on stderr.
//
// Thread-safety: Arm/Wait from the owning thread. One instance per process.
#pragma once

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

namespace meshnet {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();  // leaves the signals blocked; the waiter thread is detached
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // From now on the first signal is delivered to Wait() instead of ending the
  // process.
  void Arm();
  // Blocks until a signal arrives after Arm(); returns it (SIGINT or SIGTERM).
  int Wait();

 private:
  struct State;
  State* state_;  // shared with the detached waiter; lives until process exit
};

}  // namespace meshnet
