#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <type_traits>
#include <unordered_set>

namespace meshnet::jinja {

void ThrowRuntime(const std::string& message) {
  throw TemplateError(ErrorKind::kInvalidArgument, message);
}

namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

template <typename Items, typename Get>
void MeasureNesting(const Items& items, Get get, uint16_t* depth, bool* holds_ns,
                    uint64_t* weight) {
  if (items.size() > Value::kMaxItems) {
    ThrowRuntime("template list exceeds " + std::to_string(Value::kMaxItems) + " items");
  }
  int max_child = 0;
  uint64_t w = 1;
  for (const auto& item : items) {
    const Value& v = get(item);
    max_child = std::max<int>(max_child, v.nesting_depth());
    *holds_ns = *holds_ns || v.holds_namespace();
    w = SaturatingAdd(w, v.weight());
    if constexpr (!std::is_same_v<std::decay_t<decltype(item)>, Value>) {
      w = SaturatingAdd(w, item.first.size());
    }
  }
  *weight = w;
  if (max_child + 1 > Value::kMaxValueDepth) {
    ThrowRuntime("value nested deeper than " + std::to_string(Value::kMaxValueDepth) + " levels");
  }
  *depth = static_cast<uint16_t>(max_child + 1);
}

}  // namespace

Value::Value(List l) {
  MeasureNesting(
      l, [](const Value& v) -> const Value& { return v; }, &depth_, &holds_ns_, &weight_);
  v_ = std::make_shared<const List>(std::move(l));
}

Value::Value(Dict d) {
  MeasureNesting(
      d, [](const auto& kv) -> const Value& { return kv.second; }, &depth_, &holds_ns_, &weight_);
  v_ = std::make_shared<const Dict>(std::move(d));
}

Value Value::FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) {
    ThrowRuntime("JSON input nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      list.reserve(j.size());
      for (const auto& e : j) list.push_back(FromJson(e, depth + 1));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      dict.reserve(j.size());
      for (const auto& [k, v] : j.items()) dict.emplace_back(k, FromJson(v, depth + 1));
      return Value(std::move(dict));
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  ThrowRuntime("binary JSON values are not supported in templates");
}

uint64_t Value::weight() const {
  if (is_string()) return std::max<uint64_t>(as_string().size(), 1);
  return is_list() || is_dict() ? weight_ : 1;
}

uint64_t Value::width() const {
  if (is_string()) return std::max<uint64_t>(as_string().size(), 1);
  if (is_list()) return std::max<uint64_t>(as_list().size(), 1);
  if (is_dict()) return std::max<uint64_t>(as_dict().size(), 1);
  return 1;
}

double Value::as_number() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_float()) return as_float();
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  ThrowRuntime("expected a number, got " + TypeName());
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().empty();
    case Kind::kDict:
      return !as_dict().empty();
    case Kind::kCall:
    case Kind::kNs:
      return true;
  }
  return false;
}

namespace {

void CheckPrintSize(const std::string& out) {
  if (out.size() > Value::kMaxPrintBytes) {
    ThrowRuntime("value too large to print (more than " + std::to_string(Value::kMaxPrintBytes) +
                 " bytes)");
  }
}

std::string ReprString(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string ReprDict(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d) {
    if (!first) out += ", ";
    first = false;
    out += ReprString(k) + ": " + v.Repr();
    CheckPrintSize(out);
  }
  return out + "}";
}

}  // namespace

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return FormatFloat(as_float());
    case Kind::kString:
      return markup_ ? "Markup(" + ReprString(as_string()) + ")" : ReprString(as_string());
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      bool first = true;
      for (const Value& v : as_list()) {
        if (!first) out += ", ";
        first = false;
        out += v.Repr();
        CheckPrintSize(out);
      }
      if (tuple_) return out + (as_list().size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::kDict:
      return ReprDict(as_dict());
    case Kind::kCall:
      return "<function " + as_callable().name + ">";
    case Kind::kNs:
      return "<Namespace " + ReprDict(as_namespace().attrs) + ">";
  }
  return "";
}

bool Value::Equals(const Value& o) const {
  bool num_a = is_number() || is_bool(), num_b = o.is_number() || o.is_bool();
  if (num_a && num_b) {
    if ((is_int() || is_bool()) && (o.is_int() || o.is_bool())) {
      auto ai = is_bool() ? int64_t{as_bool()} : as_int();
      auto bi = o.is_bool() ? int64_t{o.as_bool()} : o.as_int();
      return ai == bi;
    }
    return as_number() == o.as_number();
  }
  if (kind() != o.kind()) return false;
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return as_string() == o.as_string();
    case Kind::kList: {
      const List &a = as_list(), &b = o.as_list();
      if (tuple_ != o.tuple_ || a.size() != b.size()) return false;  // [1] != (1,)
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].Equals(b[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict &a = as_dict(), &b = o.as_dict();
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : a) {
        const Value* other = o.Find(k);
        if (other == nullptr || !v.Equals(*other)) return false;
      }
      return true;
    }
    case Kind::kCall:
      return std::get<8>(v_) == std::get<8>(o.v_);
    case Kind::kNs:
      return std::get<9>(v_) == std::get<9>(o.v_);
    default:
      return false;
  }
}

const Value* Value::Find(std::string_view key) const {
  const Dict* d = is_dict() ? &as_dict() : is_namespace() ? &as_namespace().attrs : nullptr;
  if (d == nullptr) return nullptr;
  for (const auto& [k, v] : *d) {
    if (k == key) return &v;
  }
  return nullptr;
}

List Value::Iterate() const {
  switch (kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return as_list();
    case Kind::kDict: {
      List keys;
      for (const auto& kv : as_dict()) keys.emplace_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      if (CodePointCount(as_string()) > kMaxItems) {
        ThrowRuntime("template string too long to iterate (more than " + std::to_string(kMaxItems) +
                     " characters)");
      }
      List chars;
      for (std::string_view c : SplitCodePoints(as_string())) chars.emplace_back(std::string(c));
      return chars;
    }
    default:
      ThrowRuntime("'" + TypeName() + "' object is not iterable");
  }
}

bool Value::Hashable() const {
  if (is_dict()) return false;
  if (!is_list()) return true;
  if (!tuple_) return false;
  for (const Value& v : as_list()) {
    if (!v.Hashable()) return false;
  }
  return true;
}

std::string Value::TypeName() const {
  static const char* const kNames[] = {"Undefined", "NoneType", "bool", "int",      "float",
                                       "str",       "list",     "dict", "function", "Namespace"};
  if (markup_) return "Markup";
  if (tuple_) return "tuple";
  return kNames[v_.index()];
}

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keywords) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX, shortest round-trip digits
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits = sci.substr(0, e_pos);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

std::vector<std::string_view> SplitCodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 1;
    if (i + len > s.size()) len = s.size() - i;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

size_t CodePointOffset(std::string_view s, size_t n, size_t from) {
  size_t i = from;
  while (i < s.size()) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) {
      if (n == 0) return i;
      --n;
    }
    ++i;
  }
  return s.size();
}

namespace {

bool IsPyWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Decodes the UTF-8 sequence of `len` bytes at s[i] (len from the lead byte).
uint32_t DecodeAt(std::string_view s, size_t i, size_t len) {
  unsigned char c = s[i];
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return cp;
}

size_t LeadLength(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
}

}  // namespace

size_t WhitespaceAt(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t len = LeadLength(s[i]);
  if (i + len > s.size()) return 0;
  return IsPyWhitespace(DecodeAt(s, i, len)) ? len : 0;
}

size_t WhitespaceBefore(std::string_view s, size_t end) {
  size_t b = end;
  while (b > 0 && end - b < 4) {
    --b;
    if ((static_cast<unsigned char>(s[b]) & 0xc0) != 0x80) break;
  }
  if (b == end) return 0;
  size_t len = WhitespaceAt(s, b);
  return len == end - b ? len : 0;
}

// Knuth-Morris-Pratt for long needles: written here because the standard searchers
// (std::string::find, boyer_moore_horspool_searcher) are quadratic in the worst case.
size_t FindText(std::string_view hay, std::string_view needle, size_t pos) {
  if (pos > hay.size()) return std::string_view::npos;
  if (needle.size() <= 8) return hay.find(needle, pos);
  std::vector<uint32_t> fail(needle.size(), 0);
  for (size_t i = 1, k = 0; i < needle.size(); ++i) {
    while (k > 0 && needle[i] != needle[k]) k = fail[k - 1];
    if (needle[i] == needle[k]) ++k;
    fail[i] = static_cast<uint32_t>(k);
  }
  for (size_t i = pos, k = 0; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = fail[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == needle.size()) return i + 1 - k;
  }
  return std::string_view::npos;
}

std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::unordered_set<std::string_view> set;  // the code points to strip, looked up in O(1)
  if (chars != nullptr) {
    for (std::string_view c : SplitCodePoints(*chars)) set.insert(c);
  }
  auto match_at = [&](size_t i) -> size_t {
    if (chars == nullptr) return WhitespaceAt(s, i);
    size_t len = std::min(LeadLength(s[i]), s.size() - i);
    return set.count(s.substr(i, len)) ? len : 0;
  };
  size_t b = 0, e = s.size();
  while (left && b < e) {
    size_t n = match_at(b);
    if (n == 0) break;
    b += n;
  }
  while (right && e > b) {
    size_t p = e - 1;
    while (p > b && (static_cast<unsigned char>(s[p]) & 0xc0) == 0x80) --p;
    size_t n = match_at(p);
    if (n == 0 || p + n != e) break;
    e = p;
  }
  return std::string(s.substr(b, e - b));
}

}  // namespace meshnet::jinja
