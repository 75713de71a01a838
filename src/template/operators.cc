// Attribute/item access, slicing and binary operators with Python's semantics.
#include <cmath>

#include "template/interpreter.h"

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
  if (a.is_list() && b.is_list()) {
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

Value Arithmetic(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (!(a.is_number() || a.is_bool()) || !(b.is_number() || b.is_bool())) {
    ThrowRuntime("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" +
                 b.TypeName() + "'");
  }
  bool ints = IsIntLike(a) && IsIntLike(b);
  if (op == "/") {
    if (b.as_number() == 0) ThrowRuntime("division by zero");
    return Value(a.as_number() / b.as_number());
  }
  if (ints) {
    int64_t x = AsIntLike(a), y = AsIntLike(b), r = 0;
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
  double x = a.as_number(), y = b.as_number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) ThrowRuntime("float division by zero");
  double q = std::floor(x / y);
  return Value(op == "//" ? q : x - q * y);
}

Value Repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    in.CheckSize(seq.as_string().size() * static_cast<size_t>(n));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  in.CheckSize(0, seq.as_list().size() * static_cast<size_t>(n));
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return Value(std::move(out));
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      ThrowRuntime("'in <string>' requires string as left operand, not " + item.TypeName());
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict() || container.is_namespace()) {
    return item.is_string() && container.Find(item.as_string()) != nullptr;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list()) {
      if (v.Equals(item)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  ThrowRuntime("argument of type '" + container.TypeName() + "' is not iterable");
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
      auto cps = SplitCodePoints(obj.as_string());
      int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(std::string(cps[i]));
    }
    return Value(Undefined{obj.TypeName() + " index out of range"});
  }
  return Value(Undefined{"'" + obj.TypeName() + " object' has no item " + key.Repr()});
}

Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  auto get = [](const Value& v, int64_t def) {
    if (v.is_none() || v.is_undefined()) return def;
    if (!IsIntLike(v)) ThrowRuntime("slice indices must be integers or None");
    return AsIntLike(v);
  };
  int64_t st = get(step, 1);
  if (st == 0) ThrowRuntime("slice step cannot be zero");
  std::vector<std::string_view> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = SplitCodePoints(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else {
    ThrowRuntime("'" + obj.TypeName() + "' object is not subscriptable");
  }
  auto clamp = [&](int64_t i, bool is_start) {
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b =
      start.is_none() || start.is_undefined() ? (st > 0 ? 0 : n - 1) : clamp(get(start, 0), true);
  int64_t e =
      stop.is_none() || stop.is_undefined() ? (st > 0 ? n : -1) : clamp(get(stop, 0), false);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) out.append(cps[i]);
    return Value(std::move(out));
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.as_list()[i]);
  return Value(std::move(out));
}

Value BinaryOp(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value(a.Equals(b));
  if (op == "!=") return Value(!a.Equals(b));
  if (op == "in") return Value(Contains(b, a));
  if (op == "notin") return Value(!Contains(b, a));
  if (op == "~") {
    std::string s = a.Str() + b.Str();
    in.CheckSize(s.size());
    return Value(std::move(s));
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    int c = Compare(a, b, op);
    return Value(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
  }
  if (a.is_undefined()) ThrowUndefined(a);
  if (b.is_undefined()) ThrowUndefined(b);
  if (op == "+" && a.is_string() && b.is_string()) {
    in.CheckSize(a.as_string().size() + b.as_string().size());
    return Value(a.as_string() + b.as_string());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    in.CheckSize(0, a.as_list().size() + b.as_list().size());
    List out = a.as_list();
    out.insert(out.end(), b.as_list().begin(), b.as_list().end());
    return Value(std::move(out));
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
