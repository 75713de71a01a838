// Markup and Python string formatting (markup.h). Written here: there is no packaged C++
// implementation of Python's `%` and str.format mini-languages, and Markup's escaping rules
// are markupsafe's, not a general HTML escaper's.
#include "template/markup.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "template/interpreter.h"

namespace meshnet::jinja {

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value Escape(const Value& v) { return v.is_markup() ? v : Value::Markup(HtmlEscape(v.Str())); }

Value SoftStr(const Value& v) { return v.is_string() ? v : Value(v.Str()); }

Value StrLike(const Value& like, std::string s) {
  return like.is_markup() ? Value::Markup(std::move(s)) : Value(std::move(s));
}

namespace {

struct Spec {
  std::string flags;  // of "-+ 0#"
  int64_t width = -1;
  int64_t precision = -1;
  char type = 0;
  bool Has(char f) const { return flags.find(f) != std::string::npos; }
};

// Pads to spec.width code points: left-aligned with '-', else right-aligned.
std::string PadTo(std::string s, const Spec& spec) {
  size_t n = CodePointCount(s);
  if (spec.width < 0 || n >= static_cast<size_t>(spec.width)) return s;
  std::string pad(static_cast<size_t>(spec.width) - n, ' ');
  return spec.Has('-') ? s + pad : pad + s;
}

std::string Truncate(const std::string& s, int64_t precision) {
  if (precision < 0) return s;
  std::string out;
  int64_t n = 0;
  for (std::string_view cp : SplitCodePoints(s)) {
    if (n++ >= precision) break;
    out.append(cp);
  }
  return out;
}

bool IsNumber(const Value& v) { return v.is_number() || v.is_bool(); }

std::string Digits(uint64_t v, int base, bool upper) {
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), digits[v % base]);
    v /= base;
  } while (v != 0);
  return out;
}

// %d %i %u %o %x %X: sign, base prefix with '#', precision as minimum digits, '0' padding.
std::string FormatInteger(const Value& v, const Spec& spec) {
  int64_t i = 0;
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) ThrowRuntime("cannot convert float to integer");
    if (spec.type != 'd' && spec.type != 'i' && spec.type != 'u') {
      ThrowRuntime(std::string("%") + spec.type + " format: an integer is required, not float");
    }
    double t = std::trunc(v.as_float());
    if (std::fabs(t) >= 9.2e18) ThrowRuntime("integer too large to format");
    i = static_cast<int64_t>(t);
  } else {
    i = v.is_bool() ? v.as_bool() : v.as_int();
  }
  uint64_t mag = i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  int base = spec.type == 'o' ? 8 : (spec.type == 'x' || spec.type == 'X') ? 16 : 10;
  std::string digits = Digits(mag, base, spec.type == 'X');
  if (spec.precision > static_cast<int64_t>(digits.size()) && spec.precision < 4096) {
    digits.insert(0, static_cast<size_t>(spec.precision) - digits.size(), '0');
  }
  std::string prefix = i < 0 ? "-" : spec.Has('+') ? "+" : spec.Has(' ') ? " " : "";
  if (spec.Has('#') && base != 10) prefix += base == 8 ? "0o" : spec.type == 'X' ? "0X" : "0x";
  if (spec.Has('0') && !spec.Has('-') &&
      spec.width > static_cast<int64_t>(prefix.size() + digits.size())) {
    digits.insert(0, static_cast<size_t>(spec.width) - prefix.size() - digits.size(), '0');
  }
  return PadTo(prefix + digits, spec);
}

std::string FormatFloating(double d, const Spec& spec) {
  std::string f = "%" + spec.flags;
  if (spec.width >= 0) f += std::to_string(spec.width);
  if (spec.precision >= 0) f += "." + std::to_string(spec.precision);
  f += spec.type;
  char buf[512];
  int n = std::snprintf(buf, sizeof(buf), f.c_str(), d);
  if (n < 0 || n >= static_cast<int>(sizeof(buf))) ThrowRuntime("formatted number too long");
  return std::string(buf, static_cast<size_t>(n));
}

std::string EncodeUtf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return out;
}

// One %-conversion of `v`; `escape`: the format string is a Markup.
std::string Convert(const Value& v, const Spec& spec, bool escape) {
  switch (spec.type) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = spec.type == 's' ? v.Str() : v.Repr();
      if (escape && !(spec.type == 's' && v.is_markup())) s = HtmlEscape(s);
      return PadTo(Truncate(s, spec.precision), spec);
    }
    case 'c': {
      if (v.is_string() && CodePointCount(v.as_string()) == 1) return PadTo(v.as_string(), spec);
      if (!v.is_int() || v.as_int() < 0 || v.as_int() > 0x10ffff) {
        ThrowRuntime("%c requires an int in range or a single character");
      }
      return PadTo(EncodeUtf8(static_cast<uint32_t>(v.as_int())), spec);
    }
    default:
      break;
  }
  if (!IsNumber(v)) {
    ThrowRuntime(std::string("%") + spec.type + " format: a real number is required, not " +
                 v.TypeName());
  }
  if (std::string_view("diuoxX").find(spec.type) != std::string_view::npos) {
    return FormatInteger(v, spec);
  }
  return FormatFloating(v.as_number(), spec);
}

// Parses "[(key)][flags][width][.precision][length]type" after a '%' at f[i]; advances i.
Spec ParseSpec(const std::string& f, size_t& i, std::string* key) {
  Spec spec;
  if (i < f.size() && f[i] == '(') {
    int depth = 1;
    size_t b = ++i;
    while (i < f.size() && depth > 0) depth += f[i] == '(' ? 1 : f[i] == ')' ? -1 : 0, ++i;
    if (depth > 0) ThrowRuntime("incomplete format key");
    *key = f.substr(b, i - b - 1);
  }
  while (i < f.size() && std::string_view("-+ 0#").find(f[i]) != std::string_view::npos) {
    spec.flags += f[i++];
  }
  auto number = [&]() -> int64_t {
    if (i < f.size() && f[i] == '*') ThrowRuntime("'*' width or precision is not supported");
    int64_t n = -1;
    while (i < f.size() && f[i] >= '0' && f[i] <= '9') {
      n = (n < 0 ? 0 : n) * 10 + (f[i++] - '0');
      if (n > 100000) ThrowRuntime("width or precision too big");
    }
    return n;
  };
  spec.width = number();
  if (i < f.size() && f[i] == '.') {
    ++i;
    spec.precision = std::max<int64_t>(number(), 0);
  }
  while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
  if (i >= f.size()) ThrowRuntime("incomplete format");
  spec.type = f[i++];
  if (std::string_view("sradiuoxXeEfFgGc%").find(spec.type) == std::string_view::npos) {
    ThrowRuntime(std::string("unsupported format character '") + spec.type + "'");
  }
  return spec;
}

// Python's format(v, spec): "[[fill]align][sign][#][0][width][.precision][type]".
struct FormatSpec {
  std::string fill = " ";
  char align = 0, sign = 0, type = 0;
  bool alt = false, zero = false;
  int64_t width = -1, precision = -1;
};

FormatSpec ParseFormatSpec(const std::string& s) {
  FormatSpec f;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  size_t i = 0;
  size_t first = SplitCodePoints(s)[0].size();
  if (s.size() > first && is_align(s[first])) {
    f.fill = s.substr(0, first);
    f.align = s[first];
    i = first + 1;
  } else if (is_align(s[0])) {
    f.align = s[i++];
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) f.sign = s[i++];
  if (i < s.size() && s[i] == '#') f.alt = true, ++i;
  if (i < s.size() && s[i] == '0') f.zero = true, ++i;
  auto number = [&] {
    int64_t n = -1;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      n = (n < 0 ? 0 : n) * 10 + (s[i++] - '0');
      if (n > 100000) ThrowRuntime("Too many decimal digits in format string");
    }
    return n;
  };
  f.width = number();
  if (i < s.size() && s[i] == '.') {
    ++i;
    f.precision = number();
    if (f.precision < 0) ThrowRuntime("Format specifier missing precision");
  }
  if (i < s.size()) f.type = s[i++];
  if (i != s.size()) ThrowRuntime("Invalid format specifier");
  return f;
}

std::string Align(const std::string& sign, const std::string& body, const FormatSpec& f,
                  char default_align) {
  char align = f.align ? f.align : default_align;
  std::string fill = f.fill;
  if (f.zero && f.align == 0) {
    fill = "0";
    if (default_align == '>') align = '=';
  }
  size_t len = CodePointCount(sign) + CodePointCount(body);
  if (f.width < 0 || len >= static_cast<size_t>(f.width)) return sign + body;
  size_t pad = static_cast<size_t>(f.width) - len;
  auto fills = [&](size_t n) {
    std::string out;
    for (size_t k = 0; k < n; ++k) out += fill;
    return out;
  };
  switch (align) {
    case '<':
      return sign + body + fills(pad);
    case '^':
      return fills(pad / 2) + sign + body + fills(pad - pad / 2);
    case '=':
      return sign + fills(pad) + body;
    default:
      return fills(pad) + sign + body;
  }
}

std::string FormatStringSpec(const Value& v, const FormatSpec& f) {
  if (f.type != 0 && f.type != 's') {
    ThrowRuntime(std::string("Unknown format code '") + f.type + "' for object of type 'str'");
  }
  if (f.sign != 0 || f.alt || f.align == '=') ThrowRuntime("invalid format for a string");
  return Align("", Truncate(v.as_string(), f.precision), f, '<');
}

std::string FormatFloatSpec(double d, const FormatSpec& f) {
  char type = f.type;
  Spec spec;
  spec.precision = f.precision;
  std::string body;
  if (type == 0 && f.precision < 0) {
    body = FormatFloat(std::fabs(d));
  } else {
    spec.type = type == 0 ? 'g' : type == '%' ? 'f' : type;
    if (std::string_view("eEfFgG").find(spec.type) == std::string_view::npos) {
      ThrowRuntime(std::string("Unknown format code '") + type + "' for object of type 'float'");
    }
    if (f.alt) spec.flags = "#";
    body = FormatFloating(std::fabs(type == '%' ? d * 100 : d), spec);
    if (type == 0 && body.find_first_of(".ein") == std::string::npos) body += ".0";
    if (type == '%') body += '%';
  }
  std::string sign = std::signbit(d) && !std::isnan(d) ? "-"
                     : f.sign == '+'                   ? "+"
                     : f.sign == ' '                   ? " "
                                                       : "";
  return Align(sign, body, f, '>');
}

std::string FormatIntSpec(const Value& v, const FormatSpec& f) {
  int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
  if (std::string_view("eEfFgG%").find(f.type) != std::string_view::npos && f.type != 0) {
    return FormatFloatSpec(static_cast<double>(i), f);
  }
  if (f.precision >= 0) ThrowRuntime("Precision not allowed in integer format specifier");
  if (f.type == 'c') return Align("", EncodeUtf8(static_cast<uint32_t>(i & 0x1fffff)), f, '>');
  int base = f.type == 'x' || f.type == 'X' ? 16 : f.type == 'o' ? 8 : f.type == 'b' ? 2 : 10;
  if (base == 10 && f.type != 0 && f.type != 'd' && f.type != 'n') {
    ThrowRuntime(std::string("Unknown format code '") + f.type + "' for object of type 'int'");
  }
  uint64_t mag = i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  std::string sign = i < 0 ? "-" : f.sign == '+' ? "+" : f.sign == ' ' ? " " : "";
  if (f.alt && base != 10)
    sign += base == 16 ? (f.type == 'X' ? "0X" : "0x") : base == 8 ? "0o" : "0b";
  return Align(sign, Digits(mag, base, f.type == 'X'), f, '>');
}

std::string FormatWithSpec(const Value& v, const std::string& spec) {
  if (spec.empty()) return v.Str();
  FormatSpec f = ParseFormatSpec(spec);
  if (v.is_string()) return FormatStringSpec(v, f);
  if (v.is_int() || v.is_bool()) return FormatIntSpec(v, f);
  if (v.is_float()) return FormatFloatSpec(v.as_float(), f);
  ThrowRuntime("unsupported format string passed to " + v.TypeName() + ".__format__");
}

// The value a replacement field names: "", a number or a keyword, then .attr and [key] parts.
Value ResolveField(const std::string& name, const CallArgs& a, size_t* auto_index, int* mode) {
  size_t p = name.find_first_of(".[");
  std::string head = name.substr(0, p);
  const Value* v = nullptr;
  bool digits = !head.empty() && std::all_of(head.begin(), head.end(), ::isdigit);
  if (head.empty() || digits) {
    int want = head.empty() ? 1 : 2;
    if (*mode != 0 && *mode != want) {
      ThrowRuntime("cannot switch between automatic and manual field numbering");
    }
    *mode = want;
    size_t index = head.empty() ? (*auto_index)++ : std::stoul(head.substr(0, 9));
    if (index < a.positional.size()) v = &a.positional[index];
    if (v == nullptr) ThrowRuntime("Replacement index " + std::to_string(index) + " out of range");
  } else {
    for (const auto& [k, val] : a.keywords) {
      if (k == head) v = &val;
    }
    if (v == nullptr) ThrowRuntime("KeyError: '" + head + "'");
  }
  Value cur = *v;
  while (p != std::string::npos && p < name.size()) {
    if (name[p] == '.') {
      size_t e = name.find_first_of(".[", p + 1);
      cur = GetAttr(cur, name.substr(p + 1, e == std::string::npos ? e : e - p - 1));
      p = e;
    } else {
      size_t e = name.find(']', p);
      if (e == std::string::npos) ThrowRuntime("Missing ']' in format string");
      std::string key = name.substr(p + 1, e - p - 1);
      bool index = !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit);
      cur = GetItem(
          cur, index ? Value(static_cast<int64_t>(std::stoll(key.substr(0, 15)))) : Value(key));
      p = e + 1;
      if (p < name.size() && name[p] != '.' && name[p] != '[') {
        ThrowRuntime("Only '.' or '[' may follow ']' in format field specifier");
      }
    }
    if (cur.is_undefined()) ThrowRuntime("format field " + name + " is missing");
  }
  return cur;
}

}  // namespace

Value PercentFormat(Interpreter& in, const Value& fmt, const Value& arg) {
  const std::string& f = fmt.as_string();
  const bool escape = fmt.is_markup();
  const bool tuple = arg.is_list() && arg.is_tuple();
  const bool mapping = !tuple && (arg.is_dict() || arg.is_list() || arg.is_undefined());
  size_t next = 0;
  bool single_used = false;
  std::string out;
  for (size_t i = 0; i < f.size();) {
    size_t pct = f.find('%', i);
    out.append(f, i, pct == std::string::npos ? std::string::npos : pct - i);
    if (pct == std::string::npos) break;
    i = pct + 1;
    std::string key;
    bool keyed = i < f.size() && f[i] == '(';
    Spec spec = ParseSpec(f, i, &key);
    if (spec.type == '%' && !keyed) {
      out += '%';
      continue;
    }
    const Value* v = nullptr;
    Value looked_up;
    if (keyed) {
      if (!mapping) ThrowRuntime("format requires a mapping");
      looked_up = GetItem(arg, Value(key));
      if (looked_up.is_undefined() && !arg.is_undefined()) ThrowRuntime("KeyError: '" + key + "'");
      v = &looked_up;
    } else if (tuple) {
      if (next >= arg.as_list().size()) ThrowRuntime("not enough arguments for format string");
      v = &arg.as_list()[next++];
    } else {
      if (single_used) ThrowRuntime("not enough arguments for format string");
      single_used = true;
      v = &arg;
    }
    out += Convert(*v, spec, escape);
    in.CheckSize(out.size());
  }
  if ((tuple && next < arg.as_list().size()) || (!tuple && !mapping && !single_used)) {
    ThrowRuntime("not all arguments converted during string formatting");
  }
  return StrLike(fmt, std::move(out));
}

namespace {

// The replacement field "name[!conv][:spec]" (the text between braces), formatted.
struct FieldState {
  size_t auto_index = 0;
  int mode = 0;  // 1: automatic numbering, 2: manual
};

std::string FormatField(const std::string& field, const Value& fmt, const CallArgs& args,
                        FieldState* state) {
  size_t k = 0;
  for (bool in_key = false; k < field.size() && (in_key || (field[k] != '!' && field[k] != ':'));
       ++k) {
    in_key = field[k] == '[' ? true : field[k] == ']' ? false : in_key;
  }
  const size_t name_end = k;
  char conv = 0;
  if (k < field.size() && field[k] == '!') {
    if (k + 1 >= field.size()) ThrowRuntime("end of string while looking for conversion");
    conv = field[k + 1];
    k += 2;
    if (k < field.size() && field[k] != ':') ThrowRuntime("expected ':' after conversion");
  }
  std::string spec = k < field.size() ? field.substr(k + 1) : "";
  Value v = ResolveField(field.substr(0, name_end), args, &state->auto_index, &state->mode);
  if (conv == 'r' || conv == 'a') {
    v = Value(v.Repr());
  } else if (conv == 's') {
    v = Value(v.Str());
  } else if (conv != 0) {
    ThrowRuntime(std::string("Unknown conversion specifier ") + conv);
  }
  if (fmt.is_markup() && v.is_markup()) {
    if (!spec.empty()) ThrowRuntime("Unsupported format specification for Markup.");
    return v.as_string();
  }
  return fmt.is_markup() ? HtmlEscape(FormatWithSpec(v, spec)) : FormatWithSpec(v, spec);
}

}  // namespace

Value StrFormat(Interpreter& in, const Value& fmt, const CallArgs& args) {
  const std::string& s = fmt.as_string();
  std::string out;
  FieldState state;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '}') {
      if (i + 1 < s.size() && s[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      ThrowRuntime("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < s.size() && s[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool bracket = false;
    for (; j < s.size() && (bracket || s[j] != '}'); ++j) {
      if (s[j] == '[') bracket = true;
      if (s[j] == ']') bracket = false;
      if (s[j] == '{' && !bracket) ThrowRuntime("nested format fields are not supported");
    }
    if (j >= s.size()) ThrowRuntime("Single '{' encountered in format string");
    out += FormatField(s.substr(i + 1, j - i - 1), fmt, args, &state);
    i = j;
    in.CheckSize(out.size());
  }
  return StrLike(fmt, std::move(out));
}

}  // namespace meshnet::jinja
