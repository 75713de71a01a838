// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI
// (RFC 3720) and by the bundle payload checksum on the wire.
//
// Debian bookworm ships no crc32c library, so this is a small one: SSE4.2's
// crc32 instruction when the CPU has it (runtime check), otherwise a
// slicing-by-8 table. Both are tested against the RFC 3720 vectors and
// against each other.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshnet {

// Extends `crc` (0 for a fresh checksum) over n bytes.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(std::string_view s) { return Crc32cExtend(0, s.data(), s.size()); }

// The portable table path, exposed for tests.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
// Whether Crc32cExtend uses the hardware instruction on this CPU.
bool Crc32cHardwareAvailable();

}  // namespace meshnet
