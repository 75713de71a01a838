// The SIMD targets the kernels dispatch to (Highway's dynamic dispatch picks
// the best one the CPU supports), and a way to leave the best ones out, so
// that a wider CPU computes as a narrower one does: with AVX3_DL and AVX3 left
// out, an AVX-512 machine runs the AVX2 kernels of an AVX2-only machine, bit
// for bit. `meshnet` reads the names from MESHNET_DISABLE_SIMD at start.
//
// Thread-safety: DisableSimdTargets changes process-wide dispatch; call it
// before any kernel runs (at start-up).
#pragma once

#include <string>
#include <string_view>

namespace meshnet::ops {

// The target the kernels run on now, as hwy::TargetName prints it ("AVX2").
std::string BestSimdTarget();
// The targets this binary has and the CPU supports, best first, space-separated.
std::string AvailableSimdTargets();
// Leaves out the comma-separated targets `names` (as BestSimdTarget spells
// them). Throws Error(kInvalidArgument) naming a target this machine does not
// have, or when nothing would be left. Replaces an earlier call's choice.
void DisableSimdTargets(std::string_view names);

}  // namespace meshnet::ops
