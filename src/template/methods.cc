// Python methods on str, dict and list that templates call (`s.strip()`, `d.items()`, ...), and
// the global functions HF's environment provides.
#include <ctime>

#include "template/interpreter.h"
#include "template/markup.h"
#include "template/unicode_case.h"

namespace meshnet::jinja {
namespace {

// A required str argument (Python raises for a missing one, None or any other type).
std::string RequiredStr(CallArgs& a, size_t i, std::string_view name) {
  const Value* v = a.Get(i, name);
  if (v == nullptr) ThrowRuntime("missing required argument '" + std::string(name) + "'");
  if (!v->is_string()) ThrowRuntime("must be str, not " + v->TypeName());
  return v->as_string();
}

std::string StrArg(CallArgs& a, size_t i, std::string_view name, std::string def) {
  const Value* v = a.Get(i, name);
  if (v == nullptr || v->is_none() || v->is_undefined()) return def;
  if (!v->is_string()) ThrowRuntime("expected a string argument, got " + v->TypeName());
  return v->as_string();
}

Value Split(Interpreter& in, const Value& str, CallArgs& a) {
  const std::string& s = str.as_string();
  const Value* sep_v = a.Get(0, "sep");
  const Value* max_v = a.Get(1, "maxsplit");
  int64_t maxsplit = max_v && max_v->is_int() ? max_v->as_int() : -1;
  List out;
  if (sep_v == nullptr || sep_v->is_none()) {  // split on runs of whitespace
    size_t i = 0;
    while (true) {
      while (size_t n = WhitespaceAt(s, i)) i += n;
      if (i >= s.size()) break;
      in.CheckSize(0, out.size() + 1);
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(StrLike(str, PyStrip(s.substr(i), nullptr, false, true)));
        break;
      }
      size_t j = i;
      while (j < s.size() && WhitespaceAt(s, j) == 0) ++j;
      out.push_back(StrLike(str, s.substr(i, j - i)));
      i = j;
    }
    return Value(std::move(out));
  }
  std::string sep = StrArg(a, 0, "sep", "");
  if (sep.empty()) ThrowRuntime("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t hit = FindText(s, sep, pos);
    if (hit == std::string::npos) break;
    in.CheckSize(0, out.size() + 2);
    in.Charge(Interpreter::kItemCost);
    out.push_back(StrLike(str, s.substr(pos, hit - pos)));
    pos = hit + sep.size();
  }
  out.push_back(StrLike(str, s.substr(pos)));
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

// str.join takes only strings; Markup.join escapes each item (so it takes any value).
Value Join(Interpreter& in, const Value& sep, CallArgs& a) {
  std::string out;
  bool first = true;
  for (const Value& v : a.positional.empty() ? List{} : a.positional[0].Iterate()) {
    if (!first) out += sep.as_string();
    first = false;
    if (sep.is_markup()) {
      out += Escape(v).as_string();
    } else if (v.is_string()) {
      out += v.as_string();
    } else {
      ThrowRuntime("sequence item: expected str instance, " + v.TypeName() + " found");
    }
    in.CheckSize(out.size());
  }
  return StrLike(sep, std::move(out));
}

Value SplitLines(Interpreter& in, const Value& str) {
  const std::string& s = str.as_string();
  List out;
  size_t b = 0;
  while (b < s.size()) {
    size_t e = s.find('\n', b);
    if (e == std::string::npos) e = s.size();
    in.CheckSize(0, out.size() + 1);
    out.push_back(StrLike(str, s.substr(b, e - b)));
    b = e + 1;
  }
  return Value(std::move(out));
}

Value StringMethod(Interpreter& in, const Value& str, const std::string& name, CallArgs& a,
                   bool* found) {
  const std::string& s = str.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* c = a.Get(0, "chars");
    std::string chars = c == nullptr || c->is_none() ? "" : StrArg(a, 0, "chars", "");
    if (str.is_markup() && !(c != nullptr && c->is_markup())) chars = HtmlEscape(chars);
    bool ws = c == nullptr || c->is_none();
    return StrLike(str, PyStrip(s, ws ? nullptr : &chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split") return Split(in, str, a);
  if (name == "startswith") return Value(AffixMatch(s, a.Get(0, "prefix"), true));
  if (name == "endswith") return Value(AffixMatch(s, a.Get(0, "suffix"), false));
  if (name == "format") return StrFormat(in, str, a);
  if (name == "find") {
    size_t hit = FindText(s, RequiredStr(a, 0, "sub"));
    return Value(hit == std::string::npos ? int64_t{-1}
                                          : static_cast<int64_t>(CodePointCount(s.substr(0, hit))));
  }
  if (name == "count") {
    std::string sub = RequiredStr(a, 0, "sub");
    if (sub.empty()) return Value(static_cast<int64_t>(CodePointCount(s) + 1));
    int64_t n = 0;
    for (size_t p = FindText(s, sub); p != std::string::npos;
         p = FindText(s, sub, p + sub.size())) {
      in.Charge(Interpreter::kItemCost);
      ++n;
    }
    return Value(n);
  }
  if (name == "join") return Join(in, str, a);
  if (name == "splitlines") return SplitLines(in, str);
  if (name == "title" || name == "upper" || name == "lower" || name == "capitalize") {
    in.Charge(CaseMappingCost(s));
    return StrLike(str, name == "title"   ? PyTitle(s)
                        : name == "upper" ? PyUpper(s)
                        : name == "lower" ? PyLower(s)
                                          : PyCapitalize(s));
  }
  if (name == "replace") {
    // Markup's methods escape their string arguments (markupsafe 2.1, Debian bookworm's).
    CallArgs copy = a;
    for (size_t i = 0; i < 2; ++i) {
      if (i >= copy.positional.size() || !copy.positional[i].is_string()) {
        ThrowRuntime("replace() arguments must be str");
      }
    }
    if (str.is_markup()) {
      copy.positional[0] = Escape(copy.positional[0]);
      copy.positional[1] = Escape(copy.positional[1]);
    }
    return StrLike(str, ApplyFilter(in, "replace", Value(s), copy).as_string());
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
    if (key != nullptr && !key->Hashable()) {
      ThrowRuntime("unhashable type: '" + key->TypeName() + "'");
    }
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
  if (obj.is_string()) return StringMethod(in, obj, name, args, found);
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
      const Value& p = a.positional[i];
      if (!p.is_int() && !p.is_bool()) ThrowRuntime("range arguments must be integers");
      v[n == 1 ? 1 : i] = p.is_bool() ? p.as_bool() : p.as_int();
    }
    if (v[2] == 0) ThrowRuntime("range() arg 3 must not be zero");
    // The sandbox's limit (jinja2.sandbox.MAX_RANGE), so the same templates fail.
    constexpr __int128 kMaxRange = 100000;
    __int128 span = static_cast<__int128>(v[1]) - v[0], step = v[2];
    __int128 len = step > 0 ? (span > 0 ? (span + step - 1) / step : 0)
                            : (span < 0 ? (-span + -step - 1) / -step : 0);
    if (len > kMaxRange) {
      ThrowRuntime("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    List out;
    out.reserve(static_cast<size_t>(len));
    for (__int128 k = 0; k < len; ++k) {
      in.Step();
      out.emplace_back(static_cast<int64_t>(v[0] + k * step));
    }
    return Value(std::move(out));
  }));
  return g;
}

}  // namespace meshnet::jinja
