// Python-compatible JSON reading and writing for the trace replayer.
//
// The grammar follows CPython's C scanner (Modules/_json.c) as documented for
// json.loads; the escaping follows json.dumps(ensure_ascii=False); float
// formatting follows repr() (shortest round-trip digits, exponent form when the
// decimal exponent is < -4 or >= 16). Nothing here allocates per call once the
// document's buffers have grown to the longest line.
#include "kvtrace/trace_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace meshnet::kv::trace {

namespace {

constexpr size_t kPyIntMaxDigits = 4300;  // sys.int_info.default_max_str_digits

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  // Surrogates are written like any other code point (WTF-8).
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The four hex digits at in[at, at + 4) as a number in *v.
bool ReadHex4(std::string_view in, size_t at, uint32_t* v) {
  if (at + 4 > in.size()) return false;
  uint32_t r = 0;
  for (size_t k = 0; k < 4; ++k) {
    const int h = HexValue(in[at + k]);
    if (h < 0) return false;
    r = (r << 4) | static_cast<uint32_t>(h);
  }
  *v = r;
  return true;
}

// The \u escape whose hex digits start at in[*i], appended to *out; advances
// *i past it. A high surrogate followed by "\u" + low surrogate is one
// character; otherwise each escape stands alone (a lone surrogate), as in CPython.
bool DecodeUnicodeEscape(std::string_view in, size_t* pi, std::string* out) {
  size_t& i = *pi;
  uint32_t cp;
  if (!ReadHex4(in, i, &cp)) return false;
  i += 4;
  if (cp >= 0xD800 && cp <= 0xDBFF && i + 1 < in.size() && in[i] == '\\' && in[i + 1] == 'u') {
    uint32_t lo;
    if (!ReadHex4(in, i + 2, &lo)) return false;
    if (lo >= 0xDC00 && lo <= 0xDFFF) {
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      i += 6;
    }
  }
  AppendUtf8(cp, out);
  return true;
}

// Decodes one code point of valid UTF-8/WTF-8 at s[*i]; advances *i.
uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[*i + k]); };
  const unsigned char c = b(0);
  uint32_t cp;
  size_t n;
  if (c < 0x80) {
    cp = c, n = 1;
  } else if (c < 0xE0) {
    cp = c & 0x1F, n = 2;
  } else if (c < 0xF0) {
    cp = c & 0x0F, n = 3;
  } else {
    cp = c & 0x07, n = 4;
  }
  if (*i + n > s.size()) n = s.size() - *i;  // defensive; callers pass valid text
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(k) & 0x3F);
  *i += n;
  return cp;
}

// Python's str.isspace() (Py_UNICODE_ISSPACE), the characters str.strip() drops.
bool IsPySpace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool IsJsonWs(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

// ---------------------------------------------------------------- parsing

uint32_t JsonDocument::NewValue(JsonType t) {
  values_.emplace_back();
  values_.back().type = t;
  return static_cast<uint32_t>(values_.size() - 1);
}

void JsonDocument::SkipWs() {
  while (pos_ < in_.size() && IsJsonWs(in_[pos_])) ++pos_;
}

bool JsonDocument::Parse(std::string_view text) {
  in_ = text;
  pos_ = 0;
  values_.clear();
  members_.clear();
  arena_.clear();
  arena_.reserve(text.size() + 16);  // decoded strings are never longer than their source
  uint32_t root;
  SkipWs();
  if (!ParseValue(0, &root)) return false;
  SkipWs();
  return pos_ == in_.size();  // anything else is json.loads' "Extra data"
}

const JsonValue* JsonDocument::Find(const JsonValue& obj, std::string_view key) const {
  if (obj.type != JsonType::kObject) return nullptr;
  const JsonValue* found = nullptr;
  for (uint32_t m = obj.first_member; m != 0; m = members_[m - 1].next) {
    if (members_[m - 1].key == key) found = &values_[members_[m - 1].value];
  }
  return found;
}

bool JsonDocument::ParseString(std::string_view* out) {
  // At the opening quote. Fast path: no escapes, a view into the input.
  const size_t start = ++pos_;
  size_t i = start;
  while (i < in_.size()) {
    const unsigned char c = static_cast<unsigned char>(in_[i]);
    if (c == '"') {
      *out = in_.substr(start, i - start);
      pos_ = i + 1;
      return true;
    }
    if (c == '\\') break;
    if (c < 0x20) return false;  // strict: raw control characters are refused
    ++i;
  }
  if (i >= in_.size()) return false;  // unterminated
  return ParseEscapedString(start, i, out);
}

bool JsonDocument::ParseEscapedString(size_t start, size_t i, std::string_view* out) {
  const size_t arena_start = arena_.size();
  arena_.append(in_.data() + start, i - start);
  while (true) {
    if (i >= in_.size()) return false;
    const unsigned char c = static_cast<unsigned char>(in_[i]);
    if (c == '"') break;
    if (c < 0x20) return false;
    if (c != '\\') {
      arena_.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    ++i;
    if (!DecodeEscape(&i)) return false;
  }
  pos_ = i + 1;
  *out = std::string_view(arena_.data() + arena_start, arena_.size() - arena_start);
  return true;
}

bool JsonDocument::DecodeEscape(size_t* pi) {
  size_t& i = *pi;
  if (i >= in_.size()) return false;
  const char e = in_[i];
  i += 1;
  if (e == 'u') return DecodeUnicodeEscape(in_, &i, &arena_);
  // The one-character escapes and the characters they stand for.
  static constexpr std::string_view kFrom = "\"\\/bfnrt";
  static constexpr std::string_view kTo = "\"\\/\b\f\n\r\t";
  const size_t k = kFrom.find(e);
  if (k == std::string_view::npos) return false;
  arena_.push_back(kTo[k]);
  return true;
}

bool JsonDocument::ParseNumber(uint32_t* out) {
  // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?
  const size_t start = pos_;
  size_t i = pos_;
  const size_t n = in_.size();
  if (i < n && in_[i] == '-') ++i;
  if (i >= n || !IsDigit(in_[i])) return false;
  if (in_[i] == '0') {
    ++i;
  } else {
    while (i < n && IsDigit(in_[i])) ++i;
  }
  const size_t int_end = i;
  bool is_float = false;
  if (i + 1 < n && in_[i] == '.' && IsDigit(in_[i + 1])) {
    is_float = true;
    i += 2;
    while (i < n && IsDigit(in_[i])) ++i;
  }
  if (i < n && (in_[i] == 'e' || in_[i] == 'E')) {
    size_t j = i + 1;
    if (j < n && (in_[j] == '-' || in_[j] == '+')) ++j;
    const size_t digits = j;
    while (j < n && IsDigit(in_[j])) ++j;
    if (j > digits) {  // otherwise backtrack: the 'e' is not part of the number
      is_float = true;
      i = j;
    }
  }
  pos_ = i;
  const std::string_view lit = in_.substr(start, i - start);
  if (is_float) {
    // strtod is correctly rounded and gives +-inf / 0 on overflow / underflow,
    // as Python's float() does.
    std::string buf(lit);
    const uint32_t v = NewValue(JsonType::kFloat);
    values_[v].number = std::strtod(buf.c_str(), nullptr);
    *out = v;
    return true;
  }
  const bool negative = lit[0] == '-';
  if (int_end - start - (negative ? 1 : 0) > kPyIntMaxDigits) return false;
  const uint32_t v = NewValue(JsonType::kInt);
  JsonValue& val = values_[v];
  val.text = lit == "-0" ? std::string_view("0") : lit;
  const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), val.integer);
  if (r.ec == std::errc::result_out_of_range) {
    val.big = true;
    val.integer =
        negative ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
  }
  *out = v;
  return true;
}

bool JsonDocument::ParseValue(int depth, uint32_t* out) {
  if (pos_ >= in_.size()) return false;
  const std::string_view rest = in_.substr(pos_);
  auto literal = [&](std::string_view word) {
    if (rest.substr(0, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  };
  switch (in_[pos_]) {
    case '"': {
      std::string_view s;
      if (!ParseString(&s)) return false;
      *out = NewValue(JsonType::kString);
      values_[*out].text = s;
      return true;
    }
    case '{':
      return ParseObject(depth, out);
    case '[':
      return ParseArray(depth, out);
    case 'n':
      if (!literal("null")) return false;
      *out = NewValue(JsonType::kNull);
      return true;
    case 't':
    case 'f': {
      const bool v = in_[pos_] == 't';
      if (!literal(v ? "true" : "false")) return false;
      *out = NewValue(JsonType::kBool);
      values_[*out].boolean = v;
      return true;
    }
    case 'N':
      if (!literal("NaN")) return false;
      *out = NewValue(JsonType::kFloat);
      values_[*out].number = std::numeric_limits<double>::quiet_NaN();
      return true;
    case 'I':
      if (!literal("Infinity")) return false;
      *out = NewValue(JsonType::kFloat);
      values_[*out].number = std::numeric_limits<double>::infinity();
      return true;
    case '-':
      if (literal("-Infinity")) {
        *out = NewValue(JsonType::kFloat);
        values_[*out].number = -std::numeric_limits<double>::infinity();
        return true;
      }
      return ParseNumber(out);
    default:
      return ParseNumber(out);
  }
}

bool JsonDocument::ParseObject(int depth, uint32_t* out) {
  if (depth >= kMaxDepth) return false;
  const uint32_t obj = NewValue(JsonType::kObject);
  *out = obj;
  ++pos_;
  SkipWs();
  if (pos_ < in_.size() && in_[pos_] == '}') {
    ++pos_;
    return true;
  }
  uint32_t last = 0;
  while (true) {
    if (pos_ >= in_.size() || in_[pos_] != '"') return false;
    std::string_view key;
    if (!ParseString(&key)) return false;
    SkipWs();
    if (pos_ >= in_.size() || in_[pos_] != ':') return false;
    ++pos_;
    SkipWs();
    uint32_t value;
    if (!ParseValue(depth + 1, &value)) return false;
    members_.push_back(Member{key, value, 0});
    const uint32_t m = static_cast<uint32_t>(members_.size());
    if (last == 0) {
      values_[obj].first_member = m;
    } else {
      members_[last - 1].next = m;
    }
    last = m;
    SkipWs();
    if (pos_ >= in_.size()) return false;
    if (in_[pos_] == '}') {
      ++pos_;
      return true;
    }
    if (in_[pos_] != ',') return false;
    ++pos_;
    SkipWs();
  }
}

bool JsonDocument::ParseArray(int depth, uint32_t* out) {
  if (depth >= kMaxDepth) return false;
  *out = NewValue(JsonType::kArray);
  ++pos_;
  SkipWs();
  if (pos_ < in_.size() && in_[pos_] == ']') {
    ++pos_;
    return true;
  }
  while (true) {
    uint32_t element;
    if (!ParseValue(depth + 1, &element)) return false;
    SkipWs();
    if (pos_ >= in_.size()) return false;
    if (in_[pos_] == ']') {
      ++pos_;
      return true;
    }
    if (in_[pos_] != ',') return false;
    ++pos_;
    SkipWs();
  }
}

// ---------------------------------------------------------------- Python str helpers

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    auto cont = [&](size_t k) {
      return i + k < n && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    };
    const unsigned char c1 = i + 1 < n ? static_cast<unsigned char>(s[i + 1]) : 0;
    if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(1)) return false;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(1) || !cont(2)) return false;
      if (c == 0xE0 && c1 < 0xA0) return false;   // overlong
      if (c == 0xED && c1 >= 0xA0) return false;  // encoded surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(1) || !cont(2) || !cont(3)) return false;
      if (c == 0xF0 && c1 < 0x90) return false;   // overlong
      if (c == 0xF4 && c1 >= 0x90) return false;  // above U+10FFFF
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

bool HasLoneSurrogate(std::string_view s) {
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (static_cast<unsigned char>(s[i]) == 0xED && static_cast<unsigned char>(s[i + 1]) >= 0xA0) {
      return true;
    }
  }
  return false;
}

bool IsPyBlank(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (!IsPySpace(NextCodePoint(s, &i))) return false;
  }
  return true;
}

bool ParsePyFloatString(std::string_view s, double* out) {
  // Strip str.isspace() characters on both ends.
  size_t b = 0;
  size_t e = s.size();
  while (b < e) {
    size_t j = b;
    if (!IsPySpace(NextCodePoint(s, &j))) break;
    b = j;
  }
  while (e > b) {
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t j = k;
    if (!IsPySpace(NextCodePoint(s, &j))) break;
    e = k;
  }
  std::string t;
  t.reserve(e - b);
  for (size_t i = b; i < e; ++i) {
    const char c = s[i];
    if (c == '_') {  // only between two digits
      if (i == b || i + 1 >= e || !IsDigit(s[i - 1]) || !IsDigit(s[i + 1])) return false;
      continue;
    }
    t.push_back(c);
  }
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
  std::string lower;
  for (size_t k = i; k < t.size(); ++k) {
    lower.push_back(static_cast<char>(t[k] >= 'A' && t[k] <= 'Z' ? t[k] + 32 : t[k]));
  }
  if (lower == "inf" || lower == "infinity" || lower == "nan") {
    const bool neg = i == 1 && t[0] == '-';
    *out = lower == "nan" ? std::numeric_limits<double>::quiet_NaN()
                          : (neg ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
    return true;
  }
  size_t digits = 0;
  while (i < t.size() && IsDigit(t[i])) ++i, ++digits;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && IsDigit(t[i])) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < t.size() && IsDigit(t[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  if (i != t.size()) return false;
  *out = std::strtod(t.c_str(), nullptr);
  return true;
}

// ---------------------------------------------------------------- writing

void AppendPyJsonString(std::string_view s, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0xED && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0xA0) {
      size_t j = i;
      const uint32_t cp = NextCodePoint(s, &j);  // a lone surrogate
      out->append("\\u");
      for (int shift = 12; shift >= 0; shift -= 4) out->push_back(kHex[(cp >> shift) & 15]);
      i = j;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 15]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendPyFloatRepr(double x, std::string* out) {
  if (std::isnan(x)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(x)) {
    out->append(x > 0 ? "Infinity" : "-Infinity");
    return;
  }
  // Shortest round-trip digits d1.d2d3...e<exp>, as repr() takes them.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  const std::string_view sci(buf, r.ptr - buf);
  const size_t epos = sci.find('e');
  std::string_view mant = sci.substr(0, epos);
  const int exp10 = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  bool negative = false;
  if (!mant.empty() && mant[0] == '-') {
    negative = true;
    mant.remove_prefix(1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  if (negative) out->push_back('-');
  const int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  const int nd = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out->push_back(digits[0]);
    if (nd > 1) {
      out->push_back('.');
      out->append(digits, 1, std::string::npos);
    }
    out->push_back('e');
    out->push_back(exp10 < 0 ? '-' : '+');
    const int a = exp10 < 0 ? -exp10 : exp10;
    if (a < 10) out->push_back('0');
    out->append(std::to_string(a));
  } else if (decpt <= 0) {
    out->append("0.");
    out->append(static_cast<size_t>(-decpt), '0');
    out->append(digits);
  } else if (decpt < nd) {
    out->append(digits, 0, static_cast<size_t>(decpt));
    out->push_back('.');
    out->append(digits, static_cast<size_t>(decpt), std::string::npos);
  } else {
    out->append(digits);
    out->append(static_cast<size_t>(decpt - nd), '0');
    out->append(".0");
  }
}

void AppendInt(int64_t v, std::string* out) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, r.ptr);
}

}  // namespace meshnet::kv::trace
