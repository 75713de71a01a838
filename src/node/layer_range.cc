#include "node/layer_range.h"

#include <charconv>
#include <string>

#include "util/error.h"

namespace meshnet::node {

namespace {

int ParseLayer(std::string_view s, const std::string& whole) {
  int v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty() || v < 0) {
    ThrowInvalidArgument("invalid layer range '" + whole + "': expected A-B with 0 <= A <= B");
  }
  return v;
}

}  // namespace

LayerRange ParseLayerRange(const std::string& text) {
  const size_t dash = text.find('-');
  if (dash == std::string::npos) {
    ThrowInvalidArgument("invalid layer range '" + text + "': expected A-B, e.g. 0-3");
  }
  const int a = ParseLayer(std::string_view(text).substr(0, dash), text);
  const int b = ParseLayer(std::string_view(text).substr(dash + 1), text);
  if (a > b) ThrowInvalidArgument("invalid layer range '" + text + "': start after end");
  return {a, b};
}

std::vector<LayerRange> ParseSplit(const std::string& text, int total_layers) {
  std::vector<LayerRange> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string part =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    out.push_back(ParseLayerRange(part));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  int next = 0;
  for (const auto& [a, b] : out) {
    if (a != next) {
      ThrowInvalidArgument("invalid split '" + text +
                           "': ranges must be contiguous from layer 0; " +
                           "expected a range starting at " + std::to_string(next) + ", got " +
                           std::to_string(a) + "-" + std::to_string(b));
    }
    next = b + 1;
  }
  if (next != total_layers) {
    ThrowInvalidArgument("invalid split '" + text + "': the model has " +
                         std::to_string(total_layers) + " layers (0-" +
                         std::to_string(total_layers - 1) + "), the split ends at " +
                         std::to_string(next - 1));
  }
  return out;
}

std::vector<LayerRange> EvenSplit(int n_shards, int total_layers) {
  if (n_shards < 1 || n_shards > total_layers) {
    ThrowInvalidArgument("cannot split " + std::to_string(total_layers) + " layers into " +
                         std::to_string(n_shards) + " shards (1.." + std::to_string(total_layers) +
                         ")");
  }
  std::vector<LayerRange> out;
  int start = 0;
  for (int i = 0; i < n_shards; ++i) {
    const int len = total_layers / n_shards + (i < total_layers % n_shards ? 1 : 0);
    out.emplace_back(start, start + len - 1);
    start += len;
  }
  return out;
}

}  // namespace meshnet::node
