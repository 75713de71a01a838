#include "template/unicode_case.h"

#include <unicode/stringoptions.h>
#include <unicode/ucasemap.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <memory>

#include "template/value.h"

namespace meshnet::jinja {
namespace {

bool IsAscii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
char AsciiUpper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }

struct CaseMapCloser {
  void operator()(UCaseMap* m) const { ucasemap_close(m); }
};
using CaseMap = std::unique_ptr<UCaseMap, CaseMapCloser>;

CaseMap Open(uint32_t options) {
  UErrorCode status = U_ZERO_ERROR;
  CaseMap m(ucasemap_open("", options, &status));
  if (U_FAILURE(status)) ThrowRuntime(std::string("ICU case map: ") + u_errorName(status));
  return m;
}

// Runs an ICU UTF-8 case mapping, growing the buffer once if it was too small.
template <typename Fn>
std::string Map(std::string_view s, Fn fn) {
  std::string out(s.size() + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    UErrorCode status = U_ZERO_ERROR;
    int32_t n = fn(out.data(), static_cast<int32_t>(out.size()), s.data(),
                   static_cast<int32_t>(s.size()), &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(static_cast<size_t>(n), '\0');
      continue;
    }
    if (U_FAILURE(status)) ThrowRuntime(std::string("ICU case mapping: ") + u_errorName(status));
    out.resize(static_cast<size_t>(n));
    return out;
  }
  ThrowRuntime("ICU case mapping: the result did not fit");
}

const UCaseMap* Plain() {
  static const CaseMap m = Open(0);
  return m.get();
}

// Title case of the first character, the rest lowered (or kept, with NO_LOWERCASE); one per
// thread because ucasemap_utf8ToTitle takes a mutable map.
UCaseMap* Titler(bool lower_rest) {
  uint32_t options = U_TITLECASE_WHOLE_STRING | U_TITLECASE_NO_BREAK_ADJUSTMENT |
                     (lower_rest ? 0 : U_TITLECASE_NO_LOWERCASE);
  thread_local CaseMap lowering = Open(options);
  thread_local CaseMap keeping = Open(options);
  return lower_rest ? lowering.get() : keeping.get();
}

std::string Title1(std::string_view cp) {
  return Map(cp, [](char* d, int32_t cap, const char* src, int32_t n, UErrorCode* st) {
    return ucasemap_utf8ToTitle(Titler(false), d, cap, src, n, st);
  });
}

// The code point at s[i] (advancing i); ill-formed bytes decode as negative.
UChar32 Next(std::string_view s, size_t& i) {
  UChar32 c = 0;
  int32_t pos = static_cast<int32_t>(i);
  U8_NEXT(s.data(), pos, static_cast<int32_t>(s.size()), c);
  i = static_cast<size_t>(pos);
  return c;
}

bool Has(UChar32 c, UProperty p) { return c >= 0 && u_hasBinaryProperty(c, p); }
bool IsTitle(UChar32 c) { return c >= 0 && u_charType(c) == U_TITLECASE_LETTER; }

// Code points whose full case mapping is not their simple one (SpecialCasing.txt's
// unconditional entries, as ranges that hold them all) and capital sigma, whose lower case
// depends on its neighbours: these take ICU's string mapping, the rest a per-character one.
bool SpecialCase(UChar32 c) {
  return c == 0xdf || c == 0x130 || c == 0x149 || c == 0x1f0 || c == 0x390 || c == 0x3a3 ||
         c == 0x3b0 || c == 0x587 || (c >= 0x1e96 && c <= 0x1e9e) || (c >= 0x1f50 && c <= 0x1fff) ||
         (c >= 0xfb00 && c <= 0xfb17);
}

// Python's final sigma rule: a capital sigma lowers to final ς when a cased letter comes
// before it and none after it (case-ignorable characters skipped both ways).
bool FinalSigma(std::string_view s, size_t b, size_t e) {
  auto cased_before = [&] {
    for (int32_t i = static_cast<int32_t>(b); i > 0;) {
      UChar32 c = 0;
      U8_PREV(s.data(), 0, i, c);
      if (!Has(c, UCHAR_CASE_IGNORABLE)) return Has(c, UCHAR_CASED);
    }
    return false;
  };
  auto cased_after = [&] {
    for (size_t i = e; i < s.size();) {
      UChar32 c = Next(s, i);
      if (!Has(c, UCHAR_CASE_IGNORABLE)) return Has(c, UCHAR_CASED);
    }
    return false;
  };
  return cased_before() && !cased_after();
}

enum class Case { kLower, kUpper, kTitle };

// Appends the full `to` case mapping of the code point c = s[b, e).
void AppendMapped(std::string& out, std::string_view s, size_t b, size_t e, UChar32 c, Case to) {
  if (c < 0) {
    out.append(s.substr(b, e - b));
    return;
  }
  if (c < 0x80) {
    char ch = static_cast<char>(c);
    out += to == Case::kLower ? AsciiLower(ch) : AsciiUpper(ch);
    return;
  }
  if (c == 0x3a3 && to == Case::kLower) {
    out += FinalSigma(s, b, e) ? "\xcf\x82" : "\xcf\x83";
    return;
  }
  if (SpecialCase(c)) {
    std::string_view cp = s.substr(b, e - b);
    out += to == Case::kLower ? PyLower(cp) : to == Case::kUpper ? PyUpper(cp) : Title1(cp);
    return;
  }
  UChar32 m = to == Case::kLower ? u_tolower(c) : to == Case::kUpper ? u_toupper(c) : u_totitle(c);
  char buf[4];
  int32_t n = 0;
  U8_APPEND_UNSAFE(buf, n, m);
  out.append(buf, static_cast<size_t>(n));
}

}  // namespace

std::string PyLower(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out) c = AsciiLower(c);
    return out;
  }
  return Map(s, [](char* d, int32_t cap, const char* src, int32_t n, UErrorCode* st) {
    return ucasemap_utf8ToLower(Plain(), d, cap, src, n, st);
  });
}

std::string PyUpper(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out) c = AsciiUpper(c);
    return out;
  }
  return Map(s, [](char* d, int32_t cap, const char* src, int32_t n, UErrorCode* st) {
    return ucasemap_utf8ToUpper(Plain(), d, cap, src, n, st);
  });
}

std::string PyCapitalize(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = i == 0 ? AsciiUpper(out[i]) : AsciiLower(out[i]);
    return out;
  }
  return Map(s, [](char* d, int32_t cap, const char* src, int32_t n, UErrorCode* st) {
    return ucasemap_utf8ToTitle(Titler(true), d, cap, src, n, st);
  });
}

uint64_t CaseMappingCost(std::string_view s) { return IsAscii(s) ? 0 : 8 * s.size(); }

std::string PyTitle(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    bool prev_cased = false;
    for (char& c : out) {
      const bool cased = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      c = prev_cased ? AsciiLower(c) : AsciiUpper(c);
      prev_cased = cased;
    }
    return out;
  }
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    UChar32 c = Next(s, i);
    AppendMapped(out, s, b, i, c, prev_cased ? Case::kLower : Case::kTitle);
    prev_cased = Has(c, UCHAR_CASED);
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  if (IsAscii(s)) {
    // Separators: '-', '(', '{', '[', '<' and Python's ASCII whitespace (\t-\r, \x1c-\x20).
    std::string out(s);
    bool start = true;
    for (char& c : out) {
      const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
                       (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= ' ');
      if (!sep) c = start ? AsciiUpper(c) : AsciiLower(c);
      start = sep;
    }
    return out;
  }
  auto separator = [&](size_t i) -> size_t {
    char c = s[i];
    if (c == '-' || c == '(' || c == '{' || c == '[' || c == '<') return 1;
    return WhitespaceAt(s, i);
  };
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t b = i;
    while (i < s.size() && separator(i) > 0) i += separator(i);
    if (i > b) {
      out.append(s.substr(b, i - b));
      continue;
    }
    while (i < s.size() && separator(i) == 0) Next(s, i);
    // item[0].upper() + item[1:].lower(): the rest is lowered as a string of its own.
    std::string_view word = s.substr(b, i - b);
    size_t k = 0;
    UChar32 first = Next(word, k);
    AppendMapped(out, word, 0, k, first, Case::kUpper);
    std::string_view rest = word.substr(k);
    for (size_t j = 0; j < rest.size();) {
      size_t cb = j;
      UChar32 c = Next(rest, j);
      AppendMapped(out, rest, cb, j, c, Case::kLower);
    }
  }
  return out;
}

bool PyIsLower(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    UChar32 c = Next(s, i);
    if (Has(c, UCHAR_UPPERCASE) || IsTitle(c)) return false;
    cased = cased || Has(c, UCHAR_LOWERCASE);
  }
  return cased;
}

bool PyIsUpper(std::string_view s) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    UChar32 c = Next(s, i);
    if (Has(c, UCHAR_LOWERCASE) || IsTitle(c)) return false;
    cased = cased || Has(c, UCHAR_UPPERCASE);
  }
  return cased;
}

}  // namespace meshnet::jinja
