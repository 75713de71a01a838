// JSON with Python's typing, for `meshnet kv replay` (see trace_replay.h).
//
// The reference replayer reads each trace line with Python's json.loads and
// prints results with json.dumps(..., separators=(",", ":"), ensure_ascii=False).
// This file reproduces exactly the parts of both that a trace can observe:
//
//  * JsonDocument::Parse accepts what json.loads accepts: NaN / Infinity /
//    -Infinity literals, ints of any size (kept as text, with an int64 value
//    when they fit), floats correctly rounded, duplicate keys (the last one
//    wins on lookup), surrogate-pair escapes joined, lone surrogate escapes
//    kept (stored as 3-byte "WTF-8" sequences, which valid UTF-8 never holds).
//    Raw control characters in strings and everything else json.loads refuses
//    are refused.
//  * AppendPyJsonString escapes like json.dumps with ensure_ascii=False.
//  * AppendPyFloatRepr formats a double like Python's repr() / json.dumps.
//  * The Python-str helpers: UTF-8 validation, str.isspace / str.strip()
//    blankness, float(str) parsing.
//
// Thread-safety: JsonDocument is a mutable parser object, one per thread; the
// free functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshnet::kv::trace {

enum class JsonType : uint8_t { kNull, kBool, kInt, kFloat, kString, kArray, kObject };

struct JsonValue {
  JsonType type = JsonType::kNull;
  bool boolean = false;  // kBool
  bool big = false;      // kInt outside int64: `integer` is clamped to INT64_MIN/MAX
  int64_t integer = 0;   // kInt
  double number = 0;     // kFloat
  // kString: the decoded bytes (UTF-8, WTF-8 for lone surrogates).
  // kInt: Python's str() of the int (the JSON digits, "-0" becomes "0").
  std::string_view text;
  uint32_t first_member = 0;  // kObject: index into members + 1, 0 if empty

  bool is_number() const {
    return type == JsonType::kBool || type == JsonType::kInt || type == JsonType::kFloat;
  }
  // Python hashability (lists and dicts are not hashable).
  bool hashable() const { return type != JsonType::kArray && type != JsonType::kObject; }
};

class JsonDocument {
 public:
  // Parses one line like json.loads. Returns false where json.loads raises
  // (including ints longer than Python's 4300-digit conversion limit and
  // nesting deeper than kMaxDepth, where CPython's decoder would hit its
  // recursion limit). `text` must stay alive while the document is used.
  bool Parse(std::string_view text);
  const JsonValue& root() const { return values_[0]; }
  // The last member named `key` of object `obj` (a dict keeps the last
  // duplicate), or nullptr.
  const JsonValue* Find(const JsonValue& obj, std::string_view key) const;

  static constexpr int kMaxDepth = 1000;

 private:
  struct Member {
    std::string_view key;
    uint32_t value = 0;
    uint32_t next = 0;  // index + 1 of the next member of the same object, 0 = end
  };
  bool ParseValue(int depth, uint32_t* out);
  bool ParseString(std::string_view* out);
  bool ParseNumber(uint32_t* out);
  void SkipWs();
  uint32_t NewValue(JsonType t);

  std::string_view in_;
  size_t pos_ = 0;
  std::vector<JsonValue> values_;
  std::vector<Member> members_;
  std::string arena_;  // decoded strings; capacity reserved up front, never reallocated
};

// Strict UTF-8 as Python's decoder requires (no overlongs, no encoded
// surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view s);
// True if `s` (valid UTF-8/WTF-8) holds a lone surrogate (an ED A0..BF xx
// sequence), which Python cannot encode to UTF-8.
bool HasLoneSurrogate(std::string_view s);
// Python's `not s.strip()`: empty or only str.isspace() characters.
bool IsPyBlank(std::string_view s);
// Python's float(s) for a str: surrounding whitespace, sign, digits with
// single underscores between them, optional fraction and exponent, or
// inf / infinity / nan in any case. Non-ASCII digits are not accepted.
bool ParsePyFloatString(std::string_view s, double* out);

// json.dumps(s, ensure_ascii=False) appended to *out, quotes included. Lone
// surrogates (which Python would fail to write) are written as \udxxx escapes.
void AppendPyJsonString(std::string_view s, std::string* out);
// repr(x) as json.dumps writes it: "1.0", "0.001", "1e-05", "1e+16",
// "NaN", "Infinity", "-Infinity".
void AppendPyFloatRepr(double x, std::string* out);
void AppendInt(int64_t v, std::string* out);

}  // namespace meshnet::kv::trace
