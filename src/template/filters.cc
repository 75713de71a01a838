// jinja2's built-in filters and tests that chat templates use, plus HF's tojson.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string_view>
#include <unordered_set>

#include "template/interpreter.h"
#include "template/markup.h"
#include "template/unicode_case.h"

namespace meshnet::jinja {
namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

const Value* Arg(CallArgs& a, size_t i, std::string_view name) { return a.Get(i, name); }

std::string ArgString(CallArgs& a, size_t i, std::string_view name, std::string def) {
  const Value* v = a.Get(i, name);
  if (v == nullptr || v->is_undefined()) return def;
  if (!v->is_string()) ThrowRuntime("argument '" + std::string(name) + "' must be a string");
  return v->as_string();
}

bool ArgBool(CallArgs& a, size_t i, std::string_view name, bool def) {
  const Value* v = a.Get(i, name);
  return v == nullptr || v->is_undefined() ? def : v->Truthy();
}

std::string Trim(std::string_view s) { return PyStrip(s, nullptr, true, true); }

// A dotted attribute path ("function.name") or integer index, as jinja2's make_attrgetter.
Value Attribute(const Value& item, const std::string& path) {
  Value cur = item;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? GetItem(cur, Value(static_cast<int64_t>(std::stoll(part)))) : GetAttr(cur, part);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

// select/reject/selectattr/rejectattr.
Value SelectImpl(Interpreter& in, const Value& input, CallArgs& args, bool by_attr, bool keep) {
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    const Value* a = Arg(args, next++, "attribute");
    if (a == nullptr || !a->is_string())
      ThrowRuntime("selectattr/rejectattr need an attribute name");
    attr = a->as_string();
  }
  const Value* test = Arg(args, next++, "test");
  CallArgs test_args;
  for (size_t i = next; i < args.positional.size(); ++i)
    test_args.positional.push_back(args.positional[i]);
  List out;
  if (!input.Truthy()) return Value(std::move(out));  // jinja2: `if value: for item in value`
  for (const Value& item : input.Iterate()) {
    in.Step();
    Value v = by_attr ? Attribute(item, attr) : item;
    bool ok = test == nullptr ? v.Truthy() : ApplyTest(in, test->as_string(), v, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value FilterTojson(Interpreter& in, const Value& v, CallArgs& args) {
  JsonDumpOptions o;
  o.ensure_ascii = ArgBool(args, 99, "ensure_ascii", false);
  if (const Value* ind = Arg(args, 0, "indent"); ind && !ind->is_none() && !ind->is_undefined()) {
    if (!ind->is_int()) ThrowRuntime("tojson: indent must be an integer");
    o.indent = static_cast<int>(std::clamp<int64_t>(ind->as_int(), 0, 64));
  }
  if (const Value* sep = Arg(args, 99, "separators"); sep && sep->is_list()) {
    const List& l = sep->as_list();
    if (l.size() != 2 || !l[0].is_string() || !l[1].is_string()) {
      ThrowRuntime("tojson: separators must be a pair of strings");
    }
    o.separators.emplace(l[0].as_string(), l[1].as_string());
  }
  o.sort_keys = ArgBool(args, 99, "sort_keys", false);
  o.max_bytes = in.options().max_output_bytes;
  std::string s = ToJson(v, o);
  in.CheckSize(s.size());
  return Value(std::move(s));
}

Value FilterMap(Interpreter& in, const Value& input, CallArgs& args) {
  List out;
  const Value* attr = Arg(args, 99, "attribute");
  const Value* def = Arg(args, 99, "default");
  std::string filter;
  CallArgs rest;
  if (attr == nullptr) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      ThrowRuntime("map: a filter name or attribute= is required");
    }
    filter = args.positional[0].as_string();
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keywords = args.keywords;
  }
  if (!input.Truthy()) return Value(std::move(out));  // jinja2: `if value: for item in value`
  for (const Value& item : input.Iterate()) {
    in.Step();
    if (attr != nullptr) {
      Value v = Attribute(item, attr->Str());
      out.push_back(v.is_undefined() && def && !def->is_none() ? *def : v);  // default=none: none
    } else {
      CallArgs copy = rest;
      out.push_back(ApplyFilter(in, filter, item, copy));
    }
  }
  return Value(std::move(out));
}

Value FilterJoin(Interpreter& in, const Value& input, CallArgs& args) {
  const Value* d = Arg(args, 0, "d");
  std::string sep = d == nullptr ? "" : d->Str();  // str(d).join(map(str, value))
  const Value* attr = Arg(args, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : input.Iterate()) {
    if (!first) out += sep;
    first = false;
    out += (attr ? Attribute(item, attr->Str()) : item).Str();
    in.CheckSize(out.size());
  }
  return Value(std::move(out));
}

// jinja2's replace filter (autoescape off): str(s).replace(str(old), str(new), count).
Value FilterReplace(Interpreter& in, const Value& input, CallArgs& args) {
  const Value* old_arg = Arg(args, 0, "old");
  const Value* new_arg = Arg(args, 1, "new");
  if (old_arg == nullptr || new_arg == nullptr) ThrowRuntime("replace needs old and new");
  std::string s = input.Str(), from = old_arg->Str(), to = new_arg->Str();
  const Value* count = Arg(args, 2, "count");
  int64_t limit = count && count->is_int() ? count->as_int() : -1;
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; limit < 0 || n < limit; ++n) {
    size_t hit =
        from.empty() ? (pos <= s.size() ? pos : std::string::npos) : FindText(s, from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    in.CheckSize(out.size());
    if (from.empty()) {
      if (hit >= s.size()) {
        pos = s.size() + 1;
        break;
      }
      size_t next = CodePointOffset(s, 1, hit);  // Python inserts between code points
      out.append(s, hit, next - hit);
      pos = next;
    } else {
      pos = hit + from.size();
    }
  }
  if (pos <= s.size()) out.append(s, pos, std::string::npos);
  return Value(std::move(out));
}

// jinja2's indent: the text gets a "\n" appended and is split into lines (so a trailing newline
// is dropped); blank lines are indented only with blank=true, the first line only with first=true.
Value FilterIndent(Interpreter& in, const Value& input, CallArgs& args) {
  if (!input.is_string()) {  // `s += "\n"` fails for anything else
    if (input.is_undefined()) ThrowRuntime(input.undefined_hint());
    ThrowRuntime("indent: expected a string, got " + input.TypeName());
  }
  const Value* w = Arg(args, 0, "width");
  std::string pad = "    ";
  if (w != nullptr && w->is_string()) pad = w->as_string();
  if (w != nullptr && w->is_int()) pad.assign(std::clamp<int64_t>(w->as_int(), 0, 256), ' ');
  bool first = ArgBool(args, 1, "first", false), blank = ArgBool(args, 2, "blank", false);
  std::string s = input.Str() + "\n";
  std::vector<std::string> lines;
  for (size_t b = 0; b < s.size();) {
    size_t e = s.find_first_of("\n\r\v\f", b);
    lines.push_back(s.substr(b, e - b));
    b = e + ((s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n') ? 2 : 1);
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
    in.CheckSize(out.size());
  }
  return StrLike(input, first ? pad + out : out);
}

Value FilterSort(Interpreter& in, const Value& input, CallArgs& args) {
  List items = input.Iterate();
  bool reverse = ArgBool(args, 0, "reverse", false);
  bool case_sensitive = ArgBool(args, 1, "case_sensitive", false);
  const Value* attr = Arg(args, 2, "attribute");
  // jinja2 sorts by a list of keys, one per comma-separated attribute: equal keys (undefined
  // ones included) keep their order, others compare with <.
  std::vector<std::string> attrs;
  for (size_t b = 0; attr != nullptr && b <= attr->Str().size();) {
    size_t e = attr->Str().find(',', b);
    attrs.push_back(attr->Str().substr(b, e == std::string::npos ? e : e - b));
    b = e == std::string::npos ? SIZE_MAX : e + 1;
  }
  std::vector<std::pair<Value, size_t>> keyed;  // (key, position): keys made once
  for (size_t i = 0; i < items.size(); ++i) {
    List key;
    for (size_t k = 0; k < std::max<size_t>(attrs.size(), 1); ++k) {
      Value part = attrs.empty() ? items[i] : Attribute(items[i], attrs[k]);
      if (part.is_string() && !case_sensitive) part = Value(PyLower(part.as_string()));
      key.push_back(std::move(part));
    }
    keyed.emplace_back(Value(std::move(key)), i);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    in.Charge(Interpreter::kItemCost + std::min(a.first.weight(), b.first.weight()));
    const Value &x = reverse ? b.first : a.first, &y = reverse ? a.first : b.first;
    return BinaryOp(in, "<", x, y).Truthy();
  });
  List out;
  out.reserve(items.size());
  for (const auto& [k, i] : keyed) out.push_back(items[i]);
  return Value(std::move(out));
}

Value FilterItems(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) ThrowRuntime("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, val] : v.as_dict()) out.push_back(Value::Tuple(List{Value(k), val}));
  return Value(std::move(out));
}

// The text of a Python int(str) / float(str) argument with whitespace and underscores taken
// out, or "" when it is not one: [sign] digits ('_' only between digits), for floats with an
// optional fraction and exponent, or inf / infinity / nan.
std::string NumericText(std::string_view raw, bool is_float) {
  const std::string s = Trim(raw);
  std::string out;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) out += s[i++];
  if (is_float) {
    std::string rest = PyLower(s.substr(i));
    if (rest == "inf" || rest == "infinity" || rest == "nan") return out + rest;
  }
  auto digits = [&] {
    size_t start = out.size();
    while (i < s.size()) {
      if (std::isdigit(static_cast<unsigned char>(s[i]))) {
        out += s[i++];
      } else if (s[i] == '_' && out.size() > start && i + 1 < s.size() &&
                 std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        ++i;
      } else {
        break;
      }
    }
    return out.size() > start;
  };
  bool whole = digits();
  if (is_float && i < s.size() && s[i] == '.') {
    out += s[i++];
    whole = digits() || whole;
  }
  if (!whole) return "";
  if (is_float && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    out += s[i++];
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) out += s[i++];
    if (!digits()) return "";
  }
  return i == s.size() ? out : "";
}

// jinja2's int filter: int(value), else int(float(value)), else the default.
Value FilterInt(Interpreter&, const Value& v, CallArgs& args) {
  const Value* def = Arg(args, 0, "default");
  if (v.is_undefined()) ThrowRuntime(v.undefined_hint());  // int(Undefined) raises
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  double d = v.is_float() ? v.as_float() : std::nan("");
  if (v.is_string()) {
    if (std::string t = NumericText(v.as_string(), false); !t.empty()) {
      errno = 0;
      long long i = std::strtoll(t.c_str(), nullptr, 10);
      if (errno == ERANGE) ThrowRuntime("int: " + t + " does not fit 64 bits");
      return Value(static_cast<int64_t>(i));
    }
    if (std::string t = NumericText(v.as_string(), true); !t.empty()) {
      d = std::strtod(t.c_str(), nullptr);
    }
  }
  if (std::isinf(d)) ThrowRuntime("cannot convert float infinity to integer");
  if (std::isfinite(d)) {
    if (std::fabs(d) >= 9.2e18) ThrowRuntime("int: the value does not fit 64 bits");
    return Value(static_cast<int64_t>(d));
  }
  return def ? *def : Value(0);
}

Value FilterFloat(Interpreter&, const Value& v, CallArgs& args) {
  if (v.is_undefined()) ThrowRuntime(v.undefined_hint());  // float(Undefined) raises
  if (v.is_number() || v.is_bool()) return Value(v.as_number());
  if (v.is_string()) {
    if (std::string t = NumericText(v.as_string(), true); !t.empty()) {
      return Value(std::strtod(t.c_str(), nullptr));
    }
  }
  const Value* def = Arg(args, 0, "default");
  return def ? *def : Value(0.0);
}

Value FilterLength(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_string()) return Value(static_cast<int64_t>(CodePointCount(v.as_string())));
  if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
  if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().size()));
  if (v.is_undefined()) return Value(0);
  ThrowRuntime("object of type '" + v.TypeName() + "' has no len()");
}

Value FilterFirstLast(const Value& v, bool first) {
  if (v.is_string() && !v.as_string().empty()) {  // next(iter(s)): no list of characters
    const std::string& s = v.as_string();
    size_t b = first ? 0 : s.size() - 1;
    while (!first && b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80) --b;
    return Value(s.substr(b, first ? CodePointOffset(s, 1) : std::string::npos));
  }
  List items = v.Iterate();
  if (items.empty()) return Value(Undefined{"No first item, sequence was empty."});
  return first ? items.front() : items.back();
}

// A hashable value's identity for `unique` (Python set semantics: 1 == 1.0 == True; strings
// lowercased unless case-sensitive); lists, dicts and namespaces are unhashable.
std::string HashKey(const Value& v, bool case_sensitive) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "U";
    case Value::Kind::kNone:
      return "N";
    case Value::Kind::kBool:
      return "I" + std::to_string(static_cast<int>(v.as_bool()));
    case Value::Kind::kInt:
      return "I" + std::to_string(v.as_int());
    case Value::Kind::kFloat: {
      double d = v.as_float();
      if (std::trunc(d) == d && std::fabs(d) < 9.2e18) {
        return "I" + std::to_string(static_cast<int64_t>(d));
      }
      return "F" + FormatFloat(d);
    }
    case Value::Kind::kString:
      return "S" + (case_sensitive ? v.as_string() : PyLower(v.as_string()));
    case Value::Kind::kList:
      if (v.is_tuple()) {
        std::string key = "T";
        for (const Value& item : v.as_list()) {
          std::string k = HashKey(item, case_sensitive);
          key += std::to_string(k.size()) + ":" + k;
        }
        return key;
      }
      break;
    case Value::Kind::kNs:  // hashed by identity
      return "O" + std::to_string(reinterpret_cast<uintptr_t>(&v.as_namespace()));
    default:
      break;
  }
  ThrowRuntime("unhashable type: '" + v.TypeName() + "'");
}

Value FilterUnique(Interpreter& in, const Value& v, CallArgs& args) {
  bool case_sensitive = ArgBool(args, 0, "case_sensitive", false);
  const Value* attr = Arg(args, 1, "attribute");
  List out;
  std::unordered_set<std::string> seen;
  for (const Value& item : v.Iterate()) {
    in.Step();
    std::string key = HashKey(attr ? Attribute(item, attr->Str()) : item, case_sensitive);
    in.Charge(key.size() + Interpreter::kItemCost);
    if (seen.insert(std::move(key)).second) out.push_back(item);
  }
  return Value(std::move(out));
}

// min/max(value, case_sensitive=False, attribute=None): the first smallest (largest) by key.
Value FilterMinMax(Interpreter& in, const Value& v, CallArgs& args, bool max) {
  List items = v.Iterate();
  if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
  bool case_sensitive = ArgBool(args, 0, "case_sensitive", false);
  const Value* attr = Arg(args, 1, "attribute");
  auto key = [&](const Value& item) {
    Value k = attr ? Attribute(item, attr->Str()) : item;
    return k.is_string() && !case_sensitive ? Value(PyLower(k.as_string())) : k;
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    in.Step();
    Value k = key(items[i]);
    if (BinaryOp(in, max ? ">" : "<", k, best_key).Truthy()) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value FilterTrim(Interpreter&, const Value& v, CallArgs& a) {
  const Value* chars = Arg(a, 0, "chars");
  if (chars == nullptr || chars->is_none() || chars->is_undefined()) {
    return StrLike(v, Trim(v.Str()));
  }
  std::string set = chars->Str();
  return StrLike(v, PyStrip(v.Str(), &set, true, true));
}

// soft_str(value) then a str method: a Markup stays one.
Value SoftStrMap(Interpreter& in, const Value& v, std::string (*fn)(std::string_view)) {
  Value str = SoftStr(v);
  in.Charge(CaseMappingCost(str.as_string()));
  return StrLike(str, fn(str.as_string()));
}

// jinja2's format filter: soft_str(value) % (kwargs or args).
Value FilterFormat(Interpreter& in, const Value& v, CallArgs& a) {
  Value fmt = SoftStr(v);
  if (!a.keywords.empty()) {
    Dict kw(a.keywords.begin(), a.keywords.end());
    return PercentFormat(in, fmt, Value(std::move(kw)));
  }
  return PercentFormat(in, fmt, Value::Tuple(a.positional));
}

Value FilterDefault(Interpreter&, const Value& v, CallArgs& a) {
  const Value* def = Arg(a, 0, "default_value");
  bool boolean = ArgBool(a, 1, "boolean", false);
  bool use_default = v.is_undefined() || (boolean && !v.Truthy());
  return use_default ? (def ? *def : Value(std::string())) : v;
}

Value FilterReverse(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {  // value[::-1]: a Markup stays one
    const std::string& s = v.as_string();
    in.Charge(s.size() * Interpreter::kItemCost);
    std::string out;
    out.reserve(s.size());
    for (size_t e = s.size(); e > 0;) {  // code point by code point from the end
      size_t b = e - 1;
      while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80 && e - b < 4) --b;
      out.append(s, b, e - b);
      e = b;
    }
    return StrLike(v, std::move(out));
  }
  List items = v.Iterate();
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value FilterAbs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_int()) {
    if (v.as_int() == INT64_MIN) ThrowRuntime("integer overflow in abs");
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (!v.is_float()) ThrowRuntime("bad operand type for abs(): '" + v.TypeName() + "'");
  return Value(std::fabs(v.as_float()));
}

Value FilterSum(Interpreter& in, const Value& v, CallArgs&) {
  Value total(0);
  for (const Value& item : v.Iterate()) total = BinaryOp(in, "+", total, item);
  return total;
}

const std::map<std::string, FilterFn, std::less<>>& Filters() {
  static const std::map<std::string, FilterFn, std::less<>> kFilters = {
      {"tojson", FilterTojson},
      {"map", FilterMap},
      {"join", FilterJoin},
      {"replace", FilterReplace},
      {"indent", FilterIndent},
      {"sort", FilterSort},
      {"items", FilterItems},
      {"int", FilterInt},
      {"float", FilterFloat},
      {"length", FilterLength},
      {"count", FilterLength},
      {"unique", FilterUnique},
      {"trim", FilterTrim},
      {"string", [](Interpreter&, const Value& v, CallArgs&) { return SoftStr(v); }},
      {"safe", [](Interpreter&, const Value& v,
                  CallArgs&) { return v.is_markup() ? v : Value::Markup(v.Str()); }},
      {"e", [](Interpreter&, const Value& v, CallArgs&) { return Escape(v); }},
      {"escape", [](Interpreter&, const Value& v, CallArgs&) { return Escape(v); }},
      {"forceescape",
       [](Interpreter&, const Value& v, CallArgs&) { return Value::Markup(HtmlEscape(v.Str())); }},
      {"format", FilterFormat},
      {"lower",
       [](Interpreter& in, const Value& v, CallArgs&) { return SoftStrMap(in, v, PyLower); }},
      {"upper",
       [](Interpreter& in, const Value& v, CallArgs&) { return SoftStrMap(in, v, PyUpper); }},
      {"title",
       [](Interpreter& in, const Value& v, CallArgs&) {
         std::string s = v.Str();
         in.Charge(CaseMappingCost(s));
         return Value(JinjaTitle(s));
       }},
      {"capitalize",
       [](Interpreter& in, const Value& v, CallArgs&) { return SoftStrMap(in, v, PyCapitalize); }},
      {"default", FilterDefault},
      {"first", [](Interpreter&, const Value& v, CallArgs&) { return FilterFirstLast(v, true); }},
      {"last", [](Interpreter&, const Value& v, CallArgs&) { return FilterFirstLast(v, false); }},
      {"list", [](Interpreter&, const Value& v, CallArgs&) { return Value(v.Iterate()); }},
      {"reverse", FilterReverse},
      {"abs", FilterAbs},
      {"sum", FilterSum},
      {"min",
       [](Interpreter& in, const Value& v, CallArgs& a) { return FilterMinMax(in, v, a, false); }},
      {"max",
       [](Interpreter& in, const Value& v, CallArgs& a) { return FilterMinMax(in, v, a, true); }},
      {"select", [](Interpreter& in, const Value& v,
                    CallArgs& a) { return SelectImpl(in, v, a, false, true); }},
      {"reject", [](Interpreter& in, const Value& v,
                    CallArgs& a) { return SelectImpl(in, v, a, false, false); }},
      {"selectattr", [](Interpreter& in, const Value& v,
                        CallArgs& a) { return SelectImpl(in, v, a, true, true); }},
      {"rejectattr", [](Interpreter& in, const Value& v,
                        CallArgs& a) { return SelectImpl(in, v, a, true, false); }},
  };
  return kFilters;
}

bool IsSequence(const Value& v) { return v.is_list() || v.is_string() || v.is_dict(); }

const std::map<std::string, TestFn, std::less<>>& Tests() {
  static const std::map<std::string, TestFn, std::less<>> kTests = {
      {"defined", [](Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }},
      {"string", [](Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }},
      {"iterable",
       [](Interpreter&, const Value& v, CallArgs&) { return IsSequence(v) || v.is_undefined(); }},
      // Undefined has len() and [] (both empty), so it is a sequence.
      {"sequence",
       [](Interpreter&, const Value& v, CallArgs&) { return IsSequence(v) || v.is_undefined(); }},
      {"number",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_number() || v.is_bool(); }},
      {"integer", [](Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }},
      {"float", [](Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }},
      {"boolean", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }},
      {"true", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      // Undefined is callable (calling it raises).
      {"callable",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_callable() || v.is_undefined(); }},
      // Python `is`: identity; for the singletons none/true/false that is same kind and value.
      {"sameas",
       [](Interpreter&, const Value& v, CallArgs& a) {
         const Value* o = Arg(a, 0, "other");
         return o != nullptr && o->kind() == v.kind() && v.Equals(*o);
       }},
      {"odd", [](Interpreter& in, const Value& v,
                 CallArgs&) { return BinaryOp(in, "%", v, Value(2)).Equals(Value(1)); }},
      {"even", [](Interpreter& in, const Value& v,
                  CallArgs&) { return BinaryOp(in, "%", v, Value(2)).Equals(Value(0)); }},
      {"lower", [](Interpreter&, const Value& v, CallArgs&) { return PyIsLower(v.Str()); }},
      {"upper", [](Interpreter&, const Value& v, CallArgs&) { return PyIsUpper(v.Str()); }},
      {"divisibleby",
       [](Interpreter& in, const Value& v, CallArgs& a) {
         const Value* d = Arg(a, 0, "num");
         return d != nullptr && BinaryOp(in, "%", v, *d).Equals(Value(0));
       }},
  };
  return kTests;
}

const char* CompareTestOp(std::string_view name) {
  static const std::pair<const char*, const char*> kOps[] = {
      {"equalto", "=="}, {"eq", "=="}, {"==", "=="},      {"ne", "!="},
      {"!=", "!="},      {"lt", "<"},  {"lessthan", "<"}, {"<", "<"},
      {"le", "<="},      {"<=", "<="}, {"gt", ">"},       {"greaterthan", ">"},
      {">", ">"},        {"ge", ">="}, {">=", ">="},      {"in", "in"}};
  for (const auto& [n, op] : kOps) {
    if (name == n) return op;
  }
  return nullptr;
}

}  // namespace

Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  in.Step();
  if (name == "d") return ApplyFilter(in, "default", input, args);
  auto it = Filters().find(name);
  if (it == Filters().end()) ThrowRuntime("No filter named '" + name + "'.");
  return it->second(in, input, args);
}

bool ApplyTest(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  in.Step();
  if (const char* op = CompareTestOp(name)) {
    const Value* other = args.Get(0, "other");
    if (other == nullptr) ThrowRuntime("test '" + name + "' needs an argument");
    return BinaryOp(in, op, input, *other).Truthy();
  }
  auto it = Tests().find(name);
  if (it == Tests().end()) ThrowRuntime("No test named '" + name + "'.");
  return it->second(in, input, args);
}

}  // namespace meshnet::jinja
