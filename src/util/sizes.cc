#include "util/sizes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "util/error.h"

namespace meshnet {

int64_t ParseByteSize(std::string_view text) {
  const std::string original(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  const std::string number(text.substr(0, i));
  std::string unit;
  for (char c : text.substr(i))
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (number.empty() || number.find('.') != number.rfind('.') || number == ".") {
    ThrowInvalidArgument("invalid size '" + original +
                         "': expected a number with an optional unit");
  }
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "kb" || unit == "k")
    mult = 1e3;
  else if (unit == "mb" || unit == "m")
    mult = 1e6;
  else if (unit == "gb" || unit == "g")
    mult = 1e9;
  else if (unit == "tb" || unit == "t")
    mult = 1e12;
  else if (unit == "kib")
    mult = 1024.0;
  else if (unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    ThrowInvalidArgument("invalid size '" + original + "': unknown unit '" + unit + "'");
  const double value = std::stod(number) * mult;
  if (!std::isfinite(value) || value >= 9.0e18) {
    ThrowInvalidArgument("invalid size '" + original + "': too large");
  }
  return static_cast<int64_t>(std::llround(value));
}

std::string FormatByteSize(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace meshnet
