// Attribute/item access, slicing and binary operators with Python's semantics.
#include <algorithm>
#include <cmath>

#include "template/interpreter.h"
#include "template/markup.h"

namespace meshnet::jinja {
namespace {

[[noreturn]] void ThrowUndefined(const Value& v) { ThrowRuntime(v.undefined_hint()); }

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t AsIntLike(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

int Compare(const Value& a, const Value& b, const std::string& op) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (IsIntLike(a) && IsIntLike(b)) {
      return AsIntLike(a) < AsIntLike(b) ? -1 : AsIntLike(a) > AsIntLike(b) ? 1 : 0;
    }
    double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].Equals(y[i])) return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) ThrowUndefined(a);
  if (b.is_undefined()) ThrowUndefined(b);
  ThrowRuntime("'" + op + "' not supported between instances of '" + a.TypeName() + "' and '" +
               b.TypeName() + "'");
}

Value IntArithmetic(Interpreter& in, const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (op == "//" || op == "%") {
    if (y == 0) ThrowRuntime("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) ThrowRuntime("integer overflow");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    r = op == "//" ? q : m;
  } else if (op == "**") {
    if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    r = 1;
    for (int64_t i = 0; i < y && !overflow; ++i) {
      in.Step();
      overflow = __builtin_mul_overflow(r, x, &r);
    }
  }
  if (overflow) ThrowRuntime("integer overflow in '" + op + "'");
  return Value(r);
}

// CPython's float divmod: the remainder from fmod, the quotient rounded from (x - mod) / y.
Value FloatFloorDivMod(const std::string& op, double x, double y) {
  if (y == 0) ThrowRuntime("float division by zero");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floordiv = 0;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  return Value(op == "//" ? floordiv : mod);
}

Value Arithmetic(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (!(a.is_number() || a.is_bool()) || !(b.is_number() || b.is_bool())) {
    ThrowRuntime("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" +
                 b.TypeName() + "'");
  }
  if (op == "/") {
    if (b.as_number() == 0) ThrowRuntime("division by zero");
    return Value(a.as_number() / b.as_number());
  }
  if (IsIntLike(a) && IsIntLike(b)) return IntArithmetic(in, op, AsIntLike(a), AsIntLike(b));
  double x = a.as_number(), y = b.as_number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  return FloatFloorDivMod(op, x, y);
}

Value Repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  const size_t times = static_cast<size_t>(n);
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    in.CheckSize(s.empty() ? 0 : ScaledSize(s.size(), times));
    std::string out;
    out.reserve(s.empty() ? 0 : s.size() * times);
    for (size_t i = 0; i < times && !s.empty(); ++i) out += s;
    return StrLike(seq, std::move(out));
  }
  const List& l = seq.as_list();
  in.CheckSize(0, l.empty() ? 0 : ScaledSize(l.size(), times));
  List out;
  out.reserve(l.empty() ? 0 : l.size() * times);
  for (size_t i = 0; i < times && !l.empty(); ++i) out.insert(out.end(), l.begin(), l.end());
  return seq.is_tuple() ? Value::Tuple(std::move(out)) : Value(std::move(out));
}

bool Contains(Interpreter& in, const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      ThrowRuntime("'in <string>' requires string as left operand, not " + item.TypeName());
    }
    return FindText(container.as_string(), item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) {
    if (!item.Hashable()) {
      ThrowRuntime("unhashable type: '" + item.TypeName() + "'");
    }
    return item.is_string() && container.Find(item.as_string()) != nullptr;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list()) {
      in.Charge(Interpreter::kItemCost + std::min(v.weight(), item.weight()));
      if (v.Equals(item)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  ThrowRuntime("argument of type '" + container.TypeName() + "' is not iterable");
}

// The `count` code points b, b + st, ... of s, which has n code points.
std::string SliceString(const std::string& s, int64_t n, int64_t b, int64_t count, int64_t st) {
  std::string out;
  if (count == 0) return out;
  if (st == 1) {
    size_t from = CodePointOffset(s, static_cast<size_t>(b));
    return s.substr(from, CodePointOffset(s, static_cast<size_t>(count), from) - from);
  }
  out.reserve(static_cast<size_t>(count));
  if (static_cast<size_t>(n) == s.size()) {  // ASCII: a code point is a byte
    for (int64_t k = 0; k < count; ++k) out += s[static_cast<size_t>(b + k * st)];
    return out;
  }
  std::vector<uint32_t> starts;  // code point offsets (strings are far below 4 GiB)
  starts.reserve(static_cast<size_t>(n) + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) {
      starts.push_back(static_cast<uint32_t>(i));
    }
  }
  starts.push_back(static_cast<uint32_t>(s.size()));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = b + k * st;
    out.append(s, starts[i], starts[i + 1] - starts[i]);
  }
  return out;
}

}  // namespace

Value GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  if (const Value* v = obj.Find(name)) return *v;
  std::string owner = obj.is_dict() ? "dict object" : obj.TypeName() + " object";
  return Value(Undefined{"'" + owner + "' has no attribute '" + name + "'"});
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  if (key.is_string()) return GetAttr(obj, key.as_string());
  if ((obj.is_list() || obj.is_string()) && IsIntLike(key)) {
    int64_t i = AsIntLike(key);
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[i];
    } else {
      const std::string& s = obj.as_string();
      if (i < 0) i += static_cast<int64_t>(CodePointCount(s));
      if (size_t b = i >= 0 ? CodePointOffset(s, static_cast<size_t>(i)) : s.size(); b < s.size()) {
        return StrLike(obj, s.substr(b, CodePointOffset(s, 1, b) - b));
      }
    }
    return Value(Undefined{obj.TypeName() + " index out of range"});
  }
  return Value(Undefined{"'" + obj.TypeName() + " object' has no item " + key.Repr()});
}

Value Slice(Interpreter& in, const Value& obj, const Value& start, const Value& stop,
            const Value& step, bool lenient) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  bool bad = false;
  auto get = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    if (!IsIntLike(v)) bad = true;
    return IsIntLike(v) ? AsIntLike(v) : def;
  };
  int64_t st = get(step, 1);
  get(start, 0);
  get(stop, 0);
  if (bad || !(obj.is_string() || obj.is_list())) {
    if (lenient) return Value(Undefined{"'" + obj.TypeName() + " object' cannot be sliced"});
    ThrowRuntime(bad ? "slice indices must be integers or None"
                     : "'" + obj.TypeName() + "' object is not subscriptable");
  }
  if (st == 0) ThrowRuntime("slice step cannot be zero");
  const int64_t n = static_cast<int64_t>(obj.is_string() ? CodePointCount(obj.as_string())
                                                         : obj.as_list().size());
  auto clamp = [&](int64_t i) {
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = start.is_none() ? (st > 0 ? 0 : n - 1) : clamp(get(start, 0));
  int64_t e = stop.is_none() ? (st > 0 ? n : -1) : clamp(get(stop, 0));
  // The number of picked indices, without stepping past INT64_MAX.
  const __int128 span = st > 0 ? static_cast<__int128>(e) - b : static_cast<__int128>(b) - e;
  const __int128 stride = st > 0 ? st : -static_cast<__int128>(st);
  const int64_t count = span > 0 ? static_cast<int64_t>((span + stride - 1) / stride) : 0;
  if (st != 1) in.Charge(static_cast<uint64_t>(count) * Interpreter::kItemCost);
  if (obj.is_string()) return StrLike(obj, SliceString(obj.as_string(), n, b, count, st));
  List out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) out.push_back(obj.as_list()[b + k * st]);
  return obj.is_tuple() ? Value::Tuple(std::move(out)) : Value(std::move(out));
}

Value BinaryOp(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "==" || op == "!=") {
    in.Charge(std::min(a.weight(), b.weight()));
    return Value(a.Equals(b) == (op == "=="));
  }
  if (op == "in") return Value(Contains(in, b, a));
  if (op == "notin") return Value(!Contains(in, b, a));
  if (op == "~") {
    std::string s = a.Str() + b.Str();
    in.CheckSize(s.size());
    return Value(std::move(s));
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    int c = Compare(a, b, op);
    return Value(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
  }
  if (op == "%" && a.is_string()) return PercentFormat(in, a, b);  // str % Undefined is fine
  if (a.is_undefined()) ThrowUndefined(a);
  if (b.is_undefined()) ThrowUndefined(b);
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.is_markup() || b.is_markup()) {  // Markup.__add__ / __radd__ escape the plain side
      std::string s = Escape(a).as_string() + Escape(b).as_string();
      in.CheckSize(s.size());
      return Value::Markup(std::move(s));
    }
    in.CheckSize(a.as_string().size() + b.as_string().size());
    return Value(a.as_string() + b.as_string());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    if (a.is_tuple() != b.is_tuple()) {
      ThrowRuntime("can only concatenate " + a.TypeName() + " (not \"" + b.TypeName() + "\") to " +
                   a.TypeName());
    }
    in.CheckSize(0, a.as_list().size() + b.as_list().size());  // each at most kMaxItems
    List out = a.as_list();
    out.insert(out.end(), b.as_list().begin(), b.as_list().end());
    return a.is_tuple() ? Value::Tuple(std::move(out)) : Value(std::move(out));
  }
  if (op == "+" && (a.is_string() || b.is_string())) {
    const Value& other = a.is_string() ? b : a;
    ThrowRuntime(a.is_string()
                     ? "can only concatenate str (not \"" + other.TypeName() + "\") to str"
                     : "unsupported operand type(s) for +: '" + a.TypeName() + "' and 'str'");
  }
  if (op == "*" && (a.is_string() || a.is_list()) && IsIntLike(b)) {
    return Repeat(in, a, AsIntLike(b));
  }
  if (op == "*" && (b.is_string() || b.is_list()) && IsIntLike(a)) {
    return Repeat(in, b, AsIntLike(a));
  }
  return Arithmetic(in, op, a, b);
}

}  // namespace meshnet::jinja
