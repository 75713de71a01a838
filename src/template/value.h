// Runtime values of the Jinja interpreter: JSON-like data plus undefined, none, callables and
// namespaces, with Python's semantics for truth, equality, str() and json.dumps where chat
// templates can observe them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "util/error.h"

namespace meshnet::jinja {

class Value;
using List = std::vector<Value>;
// Insertion-ordered string-keyed map (Python dicts keep insertion order).
using Dict = std::vector<std::pair<std::string, Value>>;
struct Undefined {
  std::string hint;  // what was looked up, for error messages
};
struct None {};
struct Namespace {
  Dict attrs;
};
struct CallArgs;
class Interpreter;
using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;
struct Callable {
  std::string name;
  NativeFn fn;
};

// A template-level error (syntax or runtime). Converted to meshnet::Error at the API edge.
class TemplateError : public meshnet::Error {
 public:
  TemplateError(meshnet::ErrorKind kind, const std::string& message) : Error(kind, message) {}
};
[[noreturn]] void ThrowRuntime(const std::string& message);

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCall, kNs };

  Value() : v_(Undefined{}) {}
  Value(Undefined u) : v_(std::move(u)) {}       // NOLINT: value-like conversions are intended
  Value(None) : v_(None{}) {}                    // NOLINT
  Value(bool b) : v_(b) {}                       // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(int64_t i) : v_(i) {}                    // NOLINT
  Value(double d) : v_(d) {}                     // NOLINT
  // Strings are shared: copying a Value never copies its text.
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                                  // NOLINT
  // Containers record their nesting depth and whether they hold a namespace: values deeper
  // than kMaxValueDepth are refused (recursive printing/destruction stays bounded), and a
  // namespace may not hold a namespace or a function (no reference cycles, and a call block's
  // `caller` cannot outlive the block).
  Value(List l);                                                                   // NOLINT
  Value(Dict d);                                                                   // NOLINT
  Value(std::shared_ptr<const Callable> c) : v_(std::move(c)), holds_ns_(true) {}  // NOLINT
  Value(std::shared_ptr<Namespace> n) : v_(std::move(n)), holds_ns_(true) {}       // NOLINT

  static constexpr int kMaxValueDepth = 256;
  // The most items a list, a dict or an iteration may hold.
  static constexpr size_t kMaxItems = size_t{1} << 20;
  // Repr and Str refuse to print more than this many bytes (the interpreter's output limit,
  // usually smaller, applies after).
  static constexpr size_t kMaxPrintBytes = size_t{32} << 20;
  static Value FromJson(const nlohmann::ordered_json& j, int depth = 0);
  // A Python tuple: a list that prints as (a, b).
  static Value Tuple(List l) {
    Value v(std::move(l));
    v.tuple_ = true;
    return v;
  }
  // A markupsafe.Markup string (`|safe`, `|e`): a str whose + * % join and format HTML-escape
  // the plain strings they combine it with (see markup.h).
  static Value Markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }  // bool excluded (see tests)
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_callable() const { return kind() == Kind::kCall; }
  bool is_namespace() const { return kind() == Kind::kNs; }
  bool is_markup() const { return markup_; }
  bool is_tuple() const { return tuple_; }
  bool holds_namespace() const { return holds_ns_; }
  int nesting_depth() const { return depth_; }
  // The size of the value as a tree: a string's bytes, 1 for a scalar, 1 plus the weights of
  // a container's items (and a dict's key bytes), saturating; a list holding one list a million
  // times weighs what printing or comparing it would cost, not what it occupies.
  uint64_t weight() const;
  // The items of a list or dict, the bytes of a string, else 1: what one pass over it costs.
  uint64_t width() const;

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  double as_number() const;  // int, float or bool as double
  const std::string& as_string() const { return *std::get<5>(v_); }
  const List& as_list() const { return *std::get<6>(v_); }
  const Dict& as_dict() const { return *std::get<7>(v_); }
  const Callable& as_callable() const { return *std::get<8>(v_); }
  Namespace& as_namespace() const { return *std::get<9>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  bool Truthy() const;
  // Python str(): what {{ value }} prints. Undefined prints "" (jinja2's default Undefined).
  std::string Str() const;
  // Python repr(), used for items inside lists and dicts.
  std::string Repr() const;
  // Python ==, deep, with 1 == 1.0 == True. Costs at most min(weight(), other.weight()).
  bool Equals(const Value& other) const;
  // Dict/namespace lookup; nullptr when absent.
  const Value* Find(std::string_view key) const;
  // The items of an iterable (list, dict keys, string characters; undefined has none); throws
  // for others and for more than kMaxItems.
  List Iterate() const;
  // Whether Python can hash it (a dict key, a set item): not a list or dict, nor a tuple
  // holding one.
  bool Hashable() const;
  // A type name as Python's error messages spell it ("str", "dict", ...).
  std::string TypeName() const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>,
               std::shared_ptr<const Callable>, std::shared_ptr<Namespace>>
      v_;
  bool tuple_ = false;   // a list that is a Python tuple (prints as (a, b))
  bool markup_ = false;  // a string that is a Markup
  bool holds_ns_ = false;
  uint16_t depth_ = 0;
  uint64_t weight_ = 1;  // containers; strings and scalars compute theirs
};

struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keywords;
  // The argument at `index` or named `name`, or nullopt; marks nothing (no strict arity checks).
  const Value* Get(size_t index, std::string_view name) const;
};

// Python float repr (shortest round-trip, "1.0", "1e+16").
std::string FormatFloat(double d);
// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys) (HF's tojson).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None (single line)
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // a longer result is refused as it grows
};
std::string ToJson(const Value& v, const JsonDumpOptions& opts);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<std::string_view> SplitCodePoints(std::string_view s);
size_t CodePointCount(std::string_view s);
// The byte offset of the code point `n` code points after the one at byte `from` (s.size()
// when there are fewer), counting as CodePointCount does.
size_t CodePointOffset(std::string_view s, size_t n, size_t from = 0);
// Byte length of the Python whitespace character (str.isspace(): ASCII whitespace, U+001C-001F,
// U+0085, U+00A0, U+1680, U+2000-200A, U+2028/9, U+202F, U+205F, U+3000) starting at s[i] /
// ending at s[end-1]; 0 if there is none.
size_t WhitespaceAt(std::string_view s, size_t i);
size_t WhitespaceBefore(std::string_view s, size_t end);
// The first occurrence of `needle` in `hay` at or after `pos` (npos if none), in time linear in
// their sizes (std::string::find is quadratic on inputs such as "aaa...ab").
size_t FindText(std::string_view hay, std::string_view needle, size_t pos = 0);
// Python's str.strip/lstrip/rstrip: with `chars` null, Unicode whitespace; else those code points.
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace meshnet::jinja
