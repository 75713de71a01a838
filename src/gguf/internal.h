// Helpers shared by the gguf/ implementation files (not a public header).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "gguf/gguf_reader.h"

namespace meshnet::gguf::internal {

// Bytes of one scalar element; 0 for string/array/unknown.
inline uint64_t ScalarSize(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

// Length of the well-formed UTF-8 sequence at s[i] (2..4), or 0 when the
// bytes there are not one (stray continuation, overlong form, surrogate,
// beyond U+10FFFF, truncated). ASCII is handled by the caller.
inline size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // beyond U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return 0;
  }
  // C1 controls (U+0080..U+009F, e.g. CSI U+009B) act on terminals like ESC.
  if (n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f) return 0;
  return n;
}

// `s` made printable for messages and listings (terminal-safe): control
// bytes (C0, DEL, C1), quotes, backslashes and bytes that are not well-formed
// UTF-8 are escaped (\n, \", \\, \xNN); well-formed UTF-8 text is kept.
// Cut at max_len input bytes.
inline std::string Escaped(std::string_view s, size_t max_len = 200) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t end = std::min(s.size(), max_len);
  for (size_t i = 0; i < end;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(s, i);
      if (n > 0 && i + n <= end) {
        out.append(s.substr(i, n));
        i += n;
        continue;
      }
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  if (s.size() > max_len) out += "...";
  return out;
}

}  // namespace meshnet::gguf::internal
