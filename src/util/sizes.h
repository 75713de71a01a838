// Human sizes for flags: "64MiB", "2GiB", "512KiB", "1000", "1.5GB".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace meshnet {

// Parses a byte size. Accepts an integer or decimal number followed by an
// optional unit: B, KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of
// 1024), case-insensitive. Throws Error(kInvalidArgument) on anything else,
// on negative values and on overflow.
int64_t ParseByteSize(std::string_view text);

// "64.0 MiB"-style rendering for logs and --help defaults.
std::string FormatByteSize(int64_t bytes);

}  // namespace meshnet
