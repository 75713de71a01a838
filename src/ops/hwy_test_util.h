// Test helper: runs a body once per SIMD target compiled into this binary and
// supported by the CPU (forcing dynamic dispatch to it), so every target's
// kernels are checked against the scalar references, not only the best one.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

namespace meshnet::ops {

template <class Fn>
void ForEachSimdTarget(Fn&& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace meshnet::ops
