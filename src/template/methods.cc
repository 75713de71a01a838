// Python methods on str, dict and list that templates call (`s.strip()`, `d.items()`, ...), and
// the global functions HF's environment provides.
#include <ctime>

#include "template/interpreter.h"

namespace meshnet::jinja {
namespace {

std::string StrArg(CallArgs& a, size_t i, std::string_view name, std::string def) {
  const Value* v = a.Get(i, name);
  if (v == nullptr || v->is_none() || v->is_undefined()) return def;
  if (!v->is_string()) ThrowRuntime("expected a string argument, got " + v->TypeName());
  return v->as_string();
}

Value Split(const std::string& s, CallArgs& a) {
  const Value* sep_v = a.Get(0, "sep");
  const Value* max_v = a.Get(1, "maxsplit");
  int64_t maxsplit = max_v && max_v->is_int() ? max_v->as_int() : -1;
  List out;
  if (sep_v == nullptr || sep_v->is_none()) {  // split on runs of whitespace
    size_t i = 0;
    while (true) {
      while (size_t n = WhitespaceAt(s, i)) i += n;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.emplace_back(PyStrip(s.substr(i), nullptr, false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && WhitespaceAt(s, j) == 0) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return Value(std::move(out));
  }
  std::string sep = StrArg(a, 0, "sep", "");
  if (sep.empty()) ThrowRuntime("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  out.emplace_back(s.substr(pos));
  return Value(std::move(out));
}

bool AffixMatch(const std::string& s, const Value* arg, bool prefix) {
  if (arg == nullptr) ThrowRuntime("startswith/endswith need an argument");
  auto one = [&](const Value& v) {
    if (!v.is_string()) ThrowRuntime("startswith/endswith arguments must be strings");
    const std::string& a = v.as_string();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg->is_list()) {
    for (const Value& v : arg->as_list()) {
      if (one(v)) return true;
    }
    return false;
  }
  return one(*arg);
}

// str.format with positional "{}" / "{0}" and keyword "{name}" fields (no format specs).
Value Format(const std::string& s, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    size_t close = s.find('}', i);
    if (close == std::string::npos) ThrowRuntime("Single '{' encountered in format string");
    std::string field = s.substr(i + 1, close - i - 1);
    const Value* v = nullptr;
    if (field.empty()) {
      v = a.Get(auto_index++, "");
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      v = a.Get(std::stoul(field), "");
    } else {
      v = a.Get(SIZE_MAX, field);
    }
    if (v == nullptr) ThrowRuntime("format: missing argument for {" + field + "}");
    out += v->Str();
    i = close;
  }
  return Value(std::move(out));
}

Value Join(Interpreter& in, const std::string& s, CallArgs& a) {
  std::string out;
  bool first = true;
  for (const Value& v : a.positional.empty() ? List{} : a.positional[0].Iterate()) {
    if (!first) out += s;
    first = false;
    out += v.Str();
    in.CheckSize(out.size());
  }
  return Value(std::move(out));
}

Value SplitLines(const std::string& s) {
  List out;
  size_t b = 0;
  while (b < s.size()) {
    size_t e = s.find('\n', b);
    if (e == std::string::npos) e = s.size();
    out.emplace_back(s.substr(b, e - b));
    b = e + 1;
  }
  return Value(std::move(out));
}

// Python's str.title: a cased letter after an uncased one is upper.
Value Title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    bool upper = c >= 'A' && c <= 'Z', lower = c >= 'a' && c <= 'z';
    if (upper && prev_cased) c = static_cast<char>(c - 'A' + 'a');
    if (lower && !prev_cased) c = static_cast<char>(c - 'a' + 'A');
    prev_cased = upper || lower;
  }
  return Value(std::move(out));
}

Value StringMethod(Interpreter& in, const std::string& s, const std::string& name, CallArgs& a,
                   bool* found) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* c = a.Get(0, "chars");
    std::string chars = c == nullptr || c->is_none() ? "" : StrArg(a, 0, "chars", "");
    bool ws = c == nullptr || c->is_none();
    return Value(PyStrip(s, ws ? nullptr : &chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") return Split(s, a);
  if (name == "startswith") return Value(AffixMatch(s, a.Get(0, "prefix"), true));
  if (name == "endswith") return Value(AffixMatch(s, a.Get(0, "suffix"), false));
  if (name == "format") return Format(s, a);
  if (name == "find") {
    size_t hit = s.find(StrArg(a, 0, "sub", ""));
    return Value(hit == std::string::npos ? int64_t{-1}
                                          : static_cast<int64_t>(CodePointCount(s.substr(0, hit))));
  }
  if (name == "count") {
    std::string sub = StrArg(a, 0, "sub", "");
    if (sub.empty()) return Value(static_cast<int64_t>(CodePointCount(s) + 1));
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") return Join(in, s, a);
  if (name == "splitlines") return SplitLines(s);
  if (name == "title") return Title(s);
  // The rest map to filters of the same meaning.
  static const char* const kAsFilter[] = {"upper", "lower", "capitalize", "replace"};
  for (const char* f : kAsFilter) {
    if (name == f) return ApplyFilter(in, f, Value(s), a);
  }
  *found = false;
  return Value();
}

Value DictMethod(const Value& obj, const std::string& name, CallArgs& a, bool* found) {
  const Dict& d = obj.is_dict() ? obj.as_dict() : obj.as_namespace().attrs;
  if (name == "items") {
    List out;
    for (const auto& [k, v] : d) out.push_back(Value::Tuple(List{Value(k), v}));
    return Value(std::move(out));
  }
  if (name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : d) out.push_back(name == "keys" ? Value(k) : v);
    return Value(std::move(out));
  }
  if (name == "get") {
    const Value* key = a.Get(0, "key");
    const Value* def = a.Get(1, "default");
    const Value* hit = key && key->is_string() ? obj.Find(key->as_string()) : nullptr;
    return hit ? *hit : def ? *def : Value(None{});
  }
  *found = false;
  return Value();
}

}  // namespace

Value CallMethod(Interpreter& in, const Value& obj, const std::string& name, CallArgs& args,
                 bool* found) {
  in.Step();
  *found = true;
  if (obj.is_string()) return StringMethod(in, obj.as_string(), name, args, found);
  if (obj.is_dict()) return DictMethod(obj, name, args, found);
  if (obj.is_list() && name == "index") {
    const Value* item = args.Get(0, "value");
    const List& l = obj.as_list();
    for (size_t i = 0; item && i < l.size(); ++i) {
      if (l[i].Equals(*item)) return Value(static_cast<int64_t>(i));
    }
    ThrowRuntime("value is not in list");
  }
  *found = false;
  return Value();
}

Dict BuiltinGlobals() {
  auto fn = [](std::string name, NativeFn f) {
    return std::make_pair(name,
                          Value(std::make_shared<const Callable>(Callable{name, std::move(f)})));
  };
  Dict g;
  g.push_back(fn("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    const Value* msg = a.Get(0, "message");
    throw TemplateError(ErrorKind::kInvalidArgument, msg ? msg->Str() : "");
  }));
  g.push_back(fn("strftime_now", [](Interpreter&, CallArgs& a) {
    std::string fmt = StrArg(a, 0, "format", "");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return Value(std::string(buf, n));
  }));
  g.push_back(fn("namespace", [](Interpreter&, CallArgs& a) {
    auto ns = std::make_shared<Namespace>();
    for (const Value& p : a.positional) {
      if (p.is_dict()) ns->attrs = p.as_dict();
    }
    for (const auto& [k, v] : a.keywords) ns->attrs.emplace_back(k, v);
    return Value(std::move(ns));
  }));
  g.push_back(fn("dict", [](Interpreter&, CallArgs& a) {
    Dict d;
    for (const auto& [k, v] : a.keywords) d.emplace_back(k, v);
    return Value(std::move(d));
  }));
  g.push_back(fn("range", [](Interpreter& in, CallArgs& a) {
    int64_t v[3] = {0, 0, 1};
    size_t n = a.positional.size();
    if (n == 0 || n > 3) ThrowRuntime("range expects 1 to 3 arguments");
    for (size_t i = 0; i < n; ++i) {
      if (!a.positional[i].is_int()) ThrowRuntime("range arguments must be integers");
    }
    if (n == 1) v[1] = a.positional[0].as_int();
    for (size_t i = 0; n > 1 && i < n; ++i) v[i] = a.positional[i].as_int();
    if (v[2] == 0) ThrowRuntime("range() arg 3 must not be zero");
    List out;
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
      in.CheckSize(0, out.size() + 1);
      in.Step();
      out.emplace_back(i);
    }
    return Value(std::move(out));
  }));
  return g;
}

}  // namespace meshnet::jinja
