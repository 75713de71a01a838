// jinja2's built-in filters and tests that chat templates use, plus HF's tojson.
#include <algorithm>
#include <cmath>
#include <map>

#include "template/interpreter.h"

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

std::string ToLower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

std::string ToUpper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

// A dotted attribute path ("function.name") or integer index, as jinja2's make_attrgetter.
Value Attribute(const Value& item, const std::string& path) {
  Value cur = item;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (cur.is_undefined()) return cur;
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
  }
  for (const Value& item : input.Iterate()) {
    in.Step();
    if (attr != nullptr) {
      Value v = Attribute(item, attr->Str());
      out.push_back(v.is_undefined() && def ? *def : v);
    } else {
      CallArgs copy = rest;
      out.push_back(ApplyFilter(in, filter, item, copy));
    }
  }
  return Value(std::move(out));
}

Value FilterJoin(Interpreter& in, const Value& input, CallArgs& args) {
  std::string sep = ArgString(args, 0, "d", "");
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

Value FilterReplace(Interpreter& in, const Value& input, CallArgs& args) {
  std::string s = input.Str(), from = ArgString(args, 0, "old", ""),
              to = ArgString(args, 1, "new", "");
  const Value* count = Arg(args, 2, "count");
  int64_t limit = count && count->is_int() ? count->as_int() : -1;
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; limit < 0 || n < limit; ++n) {
    size_t hit = from.empty() ? (pos <= s.size() ? pos : std::string::npos) : s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    in.CheckSize(out.size());
    if (from.empty()) {
      if (hit >= s.size()) {
        pos = s.size() + 1;
        break;
      }
      out += s[hit];
      pos = hit + 1;
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
  return Value(first ? pad + out : out);
}

Value FilterSort(Interpreter& in, const Value& input, CallArgs& args) {
  List items = input.Iterate();
  bool reverse = ArgBool(args, 0, "reverse", false);
  const Value* attr = Arg(args, 2, "attribute");
  auto key = [&](const Value& v) { return attr ? Attribute(v, attr->Str()) : v; };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    Value x = key(a), y = key(b);
    if (x.is_string() && y.is_string()) {
      x = Value(ToLower(x.as_string()));
      y = Value(ToLower(y.as_string()));
    }
    return BinaryOp(in, reverse ? ">" : "<", x, y).Truthy();
  });
  return Value(std::move(items));
}

Value FilterItems(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) ThrowRuntime("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, val] : v.as_dict()) out.push_back(Value::Tuple(List{Value(k), val}));
  return Value(std::move(out));
}

Value FilterInt(Interpreter&, const Value& v, CallArgs& args) {
  const Value* def = Arg(args, 0, "default");
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float() && std::isfinite(v.as_float())) return Value(static_cast<int64_t>(v.as_float()));
  if (v.is_string()) {
    try {
      size_t used = 0;
      std::string t = Trim(v.as_string());
      int64_t i = std::stoll(t, &used);
      if (used == t.size()) return Value(i);
      double d = std::stod(t, &used);
      if (used == t.size() && std::isfinite(d)) return Value(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return def ? *def : Value(0);
}

Value FilterFloat(Interpreter&, const Value& v, CallArgs& args) {
  if (v.is_number() || v.is_bool()) return Value(v.as_number());
  if (v.is_string()) {
    try {
      return Value(std::stod(v.as_string()));
    } catch (const std::exception&) {
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
  List items = v.Iterate();
  if (items.empty()) return Value(Undefined{"No first item, sequence was empty."});
  return first ? items.front() : items.back();
}

// jinja2's title filter: words start after runs of whitespace, '-', '(', '{', '[' or '<'.
Value FilterTitle(std::string s) {
  bool start = true;
  for (char& c : s) {
    bool boundary = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
                    c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (!boundary) c = start ? ToUpper(std::string(1, c))[0] : ToLower(std::string(1, c))[0];
    start = boundary;
  }
  return Value(std::move(s));
}

Value FilterUnique(Interpreter& in, const Value& v, CallArgs&) {
  List out;
  for (const Value& item : v.Iterate()) {
    in.Step();
    bool seen = false;
    for (const Value& o : out) seen = seen || o.Equals(item);
    if (!seen) out.push_back(item);
  }
  return Value(std::move(out));
}

Value FilterMinMax(Interpreter& in, const Value& v, bool max) {
  List items = v.Iterate();
  if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
  Value best = items[0];
  for (const Value& item : items) {
    if (BinaryOp(in, max ? ">" : "<", item, best).Truthy()) best = item;
  }
  return best;
}

Value FilterTrim(Interpreter&, const Value& v, CallArgs& a) {
  const Value* chars = Arg(a, 0, "chars");
  if (chars == nullptr || chars->is_none() || chars->is_undefined()) return Value(Trim(v.Str()));
  std::string set = chars->Str();
  return Value(PyStrip(v.Str(), &set, true, true));
}

Value FilterCapitalize(Interpreter&, const Value& v, CallArgs&) {
  std::string s = ToLower(v.Str());
  if (!s.empty()) s[0] = ToUpper(s.substr(0, 1))[0];
  return Value(std::move(s));
}

Value FilterDefault(Interpreter&, const Value& v, CallArgs& a) {
  const Value* def = Arg(a, 0, "default_value");
  bool boolean = ArgBool(a, 1, "boolean", false);
  bool use_default = v.is_undefined() || (boolean && !v.Truthy());
  return use_default ? (def ? *def : Value(std::string())) : v;
}

Value FilterReverse(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = SplitCodePoints(v.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out.append(*it);
    return Value(std::move(out));
  }
  List items = v.Iterate();
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value FilterAbs(Interpreter&, const Value& v, CallArgs&) {
  return v.is_int() ? Value(v.as_int() < 0 ? -v.as_int() : v.as_int())
                    : Value(std::fabs(v.as_number()));
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
      {"string", [](Interpreter&, const Value& v, CallArgs&) { return Value(v.Str()); }},
      {"safe", [](Interpreter&, const Value& v, CallArgs&) { return v; }},
      {"e", [](Interpreter&, const Value& v, CallArgs&) { return v; }},
      {"lower", [](Interpreter&, const Value& v, CallArgs&) { return Value(ToLower(v.Str())); }},
      {"upper", [](Interpreter&, const Value& v, CallArgs&) { return Value(ToUpper(v.Str())); }},
      {"title", [](Interpreter&, const Value& v, CallArgs&) { return FilterTitle(v.Str()); }},
      {"capitalize", FilterCapitalize},
      {"default", FilterDefault},
      {"first", [](Interpreter&, const Value& v, CallArgs&) { return FilterFirstLast(v, true); }},
      {"last", [](Interpreter&, const Value& v, CallArgs&) { return FilterFirstLast(v, false); }},
      {"list", [](Interpreter&, const Value& v, CallArgs&) { return Value(v.Iterate()); }},
      {"reverse", FilterReverse},
      {"abs", FilterAbs},
      {"sum", FilterSum},
      {"min",
       [](Interpreter& in, const Value& v, CallArgs&) { return FilterMinMax(in, v, false); }},
      {"max", [](Interpreter& in, const Value& v, CallArgs&) { return FilterMinMax(in, v, true); }},
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
      {"sequence", [](Interpreter&, const Value& v, CallArgs&) { return IsSequence(v); }},
      {"number",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_number() || v.is_bool(); }},
      {"integer", [](Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }},
      {"float", [](Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }},
      {"boolean", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }},
      {"true", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"callable", [](Interpreter&, const Value& v, CallArgs&) { return v.is_callable(); }},
      // Python `is`: identity; for the singletons none/true/false that is same kind and value.
      {"sameas",
       [](Interpreter&, const Value& v, CallArgs& a) {
         const Value* o = Arg(a, 0, "other");
         return o != nullptr && o->kind() == v.kind() && v.Equals(*o);
       }},
      {"odd",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_int() && v.as_int() % 2 != 0; }},
      {"even",
       [](Interpreter&, const Value& v, CallArgs&) { return v.is_int() && v.as_int() % 2 == 0; }},
      {"lower", [](Interpreter&, const Value& v,
                   CallArgs&) { return v.is_string() && ToLower(v.as_string()) == v.as_string(); }},
      {"upper", [](Interpreter&, const Value& v,
                   CallArgs&) { return v.is_string() && ToUpper(v.as_string()) == v.as_string(); }},
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
