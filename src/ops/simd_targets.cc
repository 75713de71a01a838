#include "ops/simd_targets.h"

#include <hwy/targets.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "util/error.h"

namespace meshnet::ops {

std::string BestSimdTarget() {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? std::string("none") : hwy::TargetName(targets.front());
}

std::string AvailableSimdTargets() {
  std::string out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    out += (out.empty() ? "" : " ") + std::string(hwy::TargetName(t));
  }
  return out;
}

void DisableSimdTargets(std::string_view names) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  int64_t disable = 0;
  while (!names.empty()) {
    const std::string_view name = names.substr(0, names.find(','));
    names.remove_prefix(std::min(names.size(), name.size() + 1));
    if (name.empty()) continue;
    int64_t found = 0;
    for (int64_t t : targets) {
      if (name == hwy::TargetName(t)) found = t;
    }
    if (found == 0) {
      ThrowInvalidArgument("SIMD target '" + std::string(name) +
                           "' is not one of this machine's (" + AvailableSimdTargets() + ")");
    }
    disable |= found;
  }
  int64_t left = 0;
  for (int64_t t : targets) left |= t & ~disable;
  if (left == 0) {
    ThrowInvalidArgument("disabling every SIMD target leaves none to run on");
  }
  if (disable != 0) hwy::DisableTargets(disable);
}

}  // namespace meshnet::ops
