#include "cli/flags.h"

#include <charconv>

namespace meshnet::cli {

CLI::Validator IntRange(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
          return "must be an integer in " + range + ", got '" + text + "'";
        }
        return "";
      },
      "INT in " + range);
}

}  // namespace meshnet::cli
