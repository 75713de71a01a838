// Python's json.dumps as Hugging Face's `tojson` filter calls it: ensure_ascii=False by default,
// indent, separators and sort_keys as given. nlohmann::json's dump differs in separators,
// float spelling and escapes, so the bytes are produced here.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "template/value.h"

namespace meshnet::jinja {
namespace {

void AppendCodeUnitEscape(std::string& out, unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\u%04x", v & 0xffffu);
  out += buf;
}

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i.
uint32_t DecodeUtf8(std::string_view s, size_t& i) {
  unsigned char c = s[i];
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += len;
  return cp;
}

void DumpString(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    if (c >= 0x80 && ensure_ascii) {
      uint32_t cp = DecodeUtf8(s, i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        AppendCodeUnitEscape(out, 0xd800 + (cp >> 10));
        AppendCodeUnitEscape(out, 0xdc00 + (cp & 0x3ff));
      } else {
        AppendCodeUnitEscape(out, cp);
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          AppendCodeUnitEscape(out, c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct Dumper {
  const JsonDumpOptions& opts;
  std::string item_sep;
  std::string key_sep;
  std::string out;
  int depth_guard = 0;

  void CheckSize() const {
    if (out.size() > opts.max_bytes) {
      ThrowRuntime("tojson: the result exceeds " + std::to_string(opts.max_bytes) + " bytes");
    }
  }

  void Newline(int level) {
    if (opts.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(opts.indent) * level, ' ');
  }

  void Dump(const Value& v, int level) {
    if (++depth_guard > 512) ThrowRuntime("tojson: value nested too deeply");
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        break;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        break;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        break;
      case Value::Kind::kFloat: {
        double d = v.as_float();
        out += std::isnan(d)   ? "NaN"
               : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                               : FormatFloat(d);
        break;
      }
      case Value::Kind::kString:
        DumpString(out, v.as_string(), opts.ensure_ascii);
        break;
      case Value::Kind::kList:
        DumpList(v.as_list(), level);
        break;
      case Value::Kind::kDict:
        DumpDict(v.as_dict(), level);
        break;
      default:
        ThrowRuntime("Object of type " + v.TypeName() + " is not JSON serializable");
    }
    --depth_guard;
  }

  void DumpList(const List& list, int level) {
    if (list.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += item_sep;
      Newline(level + 1);
      Dump(list[i], level + 1);
      CheckSize();
    }
    Newline(level);
    out += ']';
  }

  void DumpDict(const Dict& dict, int level) {
    if (dict.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : dict) items.push_back(&kv);
    if (opts.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](auto* a, auto* b) { return a->first < b->first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_sep;
      Newline(level + 1);
      DumpString(out, items[i]->first, opts.ensure_ascii);
      out += key_sep;
      Dump(items[i]->second, level + 1);
      CheckSize();
    }
    Newline(level);
    out += '}';
  }
};

}  // namespace

std::string ToJson(const Value& v, const JsonDumpOptions& opts) {
  Dumper d{opts, opts.indent < 0 ? ", " : ",", ": ", {}};
  if (opts.separators) {
    d.item_sep = opts.separators->first;
    d.key_sep = opts.separators->second;
  }
  d.Dump(v, 0);
  d.CheckSize();
  return std::move(d.out);
}

}  // namespace meshnet::jinja
