#include "shard/boundary.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "util/error.h"

namespace meshnet::shard {

namespace {

[[noreturn]] void Contract(const std::string& message) {
  throw Error(ErrorKind::kBoundaryContract, message);
}

// SplitMix64: a counter-based generator; one draw per (seed, position).
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

ShardRole RoleForRange(int start_layer, int end_layer, int total_layers) {
  if (!(0 <= start_layer && start_layer <= end_layer && end_layer <= total_layers - 1)) {
    ThrowInvalidArgument("layer range [" + std::to_string(start_layer) + ", " +
                         std::to_string(end_layer) + "] is not within 0.." +
                         std::to_string(total_layers - 1));
  }
  return ShardRole{start_layer, end_layer, total_layers, start_layer == 0,
                   end_layer == total_layers - 1};
}

void CheckBoundary(const BoundaryBundle& b, const CertifiedArchitecture& arch, int start_layer,
                   int64_t expected_n_embd, int64_t expected_start_pos) {
  const CertifiedArchitecture* got = FindCertifiedArchitecture(b.architecture_adapter);
  if (got != &arch) {
    Contract("boundary bundle architecture '" + b.architecture_adapter +
             "' does not match this shard's adapter '" + arch.adapter + "'");
  }
  if (b.schema_version != arch.boundary_schema_version) {
    Contract("boundary schema v" + std::to_string(b.schema_version) +
             " is not supported by this shard (expects v" +
             std::to_string(arch.boundary_schema_version) + ")");
  }
  if (b.tensor_name != arch.boundary_tensor_name) {
    Contract("boundary tensor '" + b.tensor_name + "' is not the architecture-defined '" +
             arch.boundary_tensor_name + "'");
  }
  if (b.normalized) {
    Contract(
        "boundary bundle is normalized; a shard range must receive the UNNORMALIZED "
        "architecture-defined residual");
  }
  if (b.next_layer != start_layer) {
    Contract("boundary hands over at layer " + std::to_string(b.next_layer) +
             " but this shard starts at layer " + std::to_string(start_layer));
  }
  if (b.n_embd != expected_n_embd) {
    Contract("boundary residual width " + std::to_string(b.n_embd) + " != model n_embd " +
             std::to_string(expected_n_embd));
  }
  if (b.n_tokens <= 0 || static_cast<int64_t>(b.positions.size()) != b.n_tokens ||
      static_cast<int64_t>(b.residual.size()) != b.n_tokens * b.n_embd) {
    Contract("boundary shape mismatch: n_tokens " + std::to_string(b.n_tokens) + ", positions " +
             std::to_string(b.positions.size()) + ", residual " +
             std::to_string(b.residual.size()) + " floats (expected n_tokens * " +
             std::to_string(b.n_embd) + ")");
  }
  for (int64_t i = 0; i < b.n_tokens; ++i) {
    if (b.positions[i] != expected_start_pos + i) {
      Contract("boundary positions must be contiguous from " + std::to_string(expected_start_pos) +
               "; got " + std::to_string(b.positions[i]) + " at row " + std::to_string(i));
    }
  }
  for (float v : b.residual) {
    if (!std::isfinite(v)) Contract("boundary residual holds a non-finite value");
  }
}

void SamplingContract::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    ThrowInvalidArgument("temperature must be a finite value >= 0");
  }
  if (top_k < 0) ThrowInvalidArgument("top_k must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) ThrowInvalidArgument("top_p must be in (0, 1]");
}

int SamplingContract::Sample(std::span<const float> logits, int64_t position,
                             std::span<float> probs, std::span<int> ids) const {
  const int n = static_cast<int>(logits.size());
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(logits[i])) {
      throw Error(ErrorKind::kBoundaryContract,
                  "the model produced a non-finite logit (" + std::to_string(logits[i]) +
                      " for token " + std::to_string(i) + ") at position " +
                      std::to_string(position) + ": the weights or activations overflowed");
    }
  }
  if (greedy()) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  // Candidates sorted by logit, descending (ties: lower id first), cut to top_k.
  std::iota(ids.begin(), ids.begin() + n, 0);
  const int k = (top_k > 0 && top_k < n) ? top_k : n;
  auto by_logit = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.begin() + n, by_logit);
  const float max_logit = logits[ids[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[ids[i]] - max_logit) / temperature);
    sum += probs[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p.
  int keep = k;
  if (top_p < 1.0f) {
    double cum = 0;
    for (int i = 0; i < k; ++i) {
      cum += probs[i] / sum;
      if (cum >= top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_mass = 0;
  for (int i = 0; i < keep; ++i) kept_mass += probs[i];
  const uint64_t bits = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(position)));
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * kept_mass;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

int SamplingContract::Sample(std::span<const float> logits, int64_t position) const {
  std::vector<float> probs(logits.size());
  std::vector<int> ids(logits.size());
  return Sample(logits, position, probs, ids);
}

}  // namespace meshnet::shard
