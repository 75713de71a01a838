#include "shard/step_cancel.h"

#include "util/error.h"

namespace meshnet::shard {

namespace {
thread_local const std::function<bool()>* t_check = nullptr;
}  // namespace

ScopedStepCancel::ScopedStepCancel(std::function<bool()> cancelled)
    : check_(std::move(cancelled)), outer_(t_check) {
  t_check = &check_;
}

ScopedStepCancel::~ScopedStepCancel() { t_check = outer_; }

const std::function<bool()>* CurrentStepCancel() { return t_check; }

bool StepCancelled() { return t_check != nullptr && (*t_check)(); }

void ThrowIfStepCancelled() {
  if (StepCancelled()) {
    throw Error(ErrorKind::kUnavailable,
                "step cancelled: its deadline passed, its caller is gone or the node is stopping");
  }
}

}  // namespace meshnet::shard
