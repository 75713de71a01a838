// Cooperative cancellation of the step running on this thread.
//
// A transport that runs a step on its handler thread installs a check for
// the step's lifetime; LlamaShard::Forward calls ThrowIfStepCancelled()
// between layers and between prefill chunks, so a step whose caller is gone
// (deadline passed, client disconnected) or whose node is shutting down stops
// within one layer of one chunk instead of running to the end.
//
//   ScopedStepCancel cancel([&] { return ctx->IsCancelled() || stopping; });
//   adapter.Decode(...);   // throws Error(kUnavailable, "step cancelled ...")
//
// A cancelled step is not committed: its reserved KV rows are rolled back.
// Thread-safety: the check is thread-local; nesting restores the outer one.
#pragma once

#include <functional>

namespace meshnet::shard {

class ScopedStepCancel {
 public:
  explicit ScopedStepCancel(std::function<bool()> cancelled);
  ~ScopedStepCancel();
  ScopedStepCancel(const ScopedStepCancel&) = delete;
  ScopedStepCancel& operator=(const ScopedStepCancel&) = delete;

 private:
  std::function<bool()> check_;
  const std::function<bool()>* outer_;
};

// This thread's check (null without a ScopedStepCancel), for a thread that
// runs the step on this thread's behalf (node::Batcher): valid while the
// ScopedStepCancel lives; checks must be safe to call from any thread.
const std::function<bool()>* CurrentStepCancel();
// Whether this thread's step was cancelled (false without a ScopedStepCancel).
bool StepCancelled();
// Throws Error(kUnavailable) when StepCancelled().
void ThrowIfStepCancelled();

}  // namespace meshnet::shard
