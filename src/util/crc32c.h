// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI
// (RFC 3720) and by the bundle payload checksum on the wire.
//
// Crc32cExtend is Intel ISA-L's crc32_iscsi (Debian's libisal: runtime
// dispatch to its fastest code for the CPU, three interleaved crc32 streams
// or PCLMULQDQ folding). A small slicing-by-8 table is kept as the reference
// the tests check it against (with the RFC 3720 vectors).
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

// The reference: a portable table, for tests.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace meshnet
