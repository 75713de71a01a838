// MetadataValue conversions and rendering, and GgufFile's typed getters.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "gguf/gguf_reader.h"
#include "gguf/internal.h"
#include "util/error.h"

namespace meshnet::gguf {

using internal::Escaped;
using internal::ScalarSize;

// ---------------------------------------------------------------------------
// ValueType / MetadataValue

std::string_view ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kU8:
      return "u8";
    case ValueType::kI8:
      return "i8";
    case ValueType::kU16:
      return "u16";
    case ValueType::kI16:
      return "i16";
    case ValueType::kU32:
      return "u32";
    case ValueType::kI32:
      return "i32";
    case ValueType::kF32:
      return "f32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kU64:
      return "u64";
    case ValueType::kI64:
      return "i64";
    case ValueType::kF64:
      return "f64";
  }
  return "unknown";
}

bool IsIntegerType(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

namespace {
bool IsSignedType(ValueType t) {
  return t == ValueType::kI8 || t == ValueType::kI16 || t == ValueType::kI32 ||
         t == ValueType::kI64;
}
// Sign-extends raw zero-extended bits of a signed type.
int64_t SignedValue(ValueType t, uint64_t bits) {
  switch (t) {
    case ValueType::kI8:
      return static_cast<int8_t>(bits);
    case ValueType::kI16:
      return static_cast<int16_t>(bits);
    case ValueType::kI32:
      return static_cast<int32_t>(bits);
    default:
      return static_cast<int64_t>(bits);
  }
}
}  // namespace

std::optional<int64_t> MetadataValue::AsInt64() const {
  if (!IsIntegerType(type_)) return std::nullopt;
  if (IsSignedType(type_)) return SignedValue(type_, bits_);
  if (bits_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(bits_);
}

std::optional<uint64_t> MetadataValue::AsUint64() const {
  if (!IsIntegerType(type_)) return std::nullopt;
  if (IsSignedType(type_)) {
    const int64_t v = SignedValue(type_, bits_);
    if (v < 0) return std::nullopt;
    return static_cast<uint64_t>(v);
  }
  return bits_;
}

std::optional<double> MetadataValue::AsDouble() const {
  if (type_ == ValueType::kF32) {
    float f;
    const uint32_t b = static_cast<uint32_t>(bits_);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (type_ == ValueType::kF64) {
    double d;
    std::memcpy(&d, &bits_, 8);
    return d;
  }
  if (IsSignedType(type_)) return static_cast<double>(SignedValue(type_, bits_));
  if (IsIntegerType(type_)) return static_cast<double>(bits_);
  return std::nullopt;
}

std::optional<bool> MetadataValue::AsBool() const {
  if (type_ != ValueType::kBool) return std::nullopt;
  return bits_ != 0;
}

std::optional<std::string_view> MetadataValue::AsString() const {
  if (type_ != ValueType::kString) return std::nullopt;
  return str_;
}

MetadataValue MetadataValue::ArrayElement(uint64_t i) const {
  MetadataValue v;
  if (!is_array() || i >= array_size_) return v;
  v.type_ = array_type_;
  if (array_type_ == ValueType::kString) {
    v.str_ = strings_[i];
  } else if (array_type_ == ValueType::kArray) {
    return arrays_[i];
  } else {
    const uint64_t n = ScalarSize(array_type_);
    std::memcpy(&v.bits_, array_data_ + i * n, n);  // little-endian host: zero-extends
  }
  return v;
}

std::string MetadataValue::ToString(size_t max_elems) const {
  switch (type_) {
    case ValueType::kString:
      return "\"" + Escaped(str_) + "\"";
    case ValueType::kBool:
      return bits_ ? "true" : "false";
    case ValueType::kF32:
    case ValueType::kF64: {
      // Shortest %g rendering that reads back as the same value.
      const double d = *AsDouble();
      char buf[64];
      if (d == std::floor(d) && std::fabs(d) < 1e15) {
        std::snprintf(buf, sizeof buf, "%.0f", d);
        return buf;
      }
      for (int prec = 1; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, d);
        const double back = std::strtod(buf, nullptr);
        if (type_ == ValueType::kF32 ? static_cast<float>(back) == static_cast<float>(d)
                                     : back == d) {
          break;
        }
      }
      return buf;
    }
    case ValueType::kArray: {
      std::string s = "[";
      const uint64_t shown = std::min<uint64_t>(array_size_, max_elems);
      for (uint64_t i = 0; i < shown; ++i) {
        if (i) s += ", ";
        s += ArrayElement(i).ToString(max_elems);
      }
      if (shown < array_size_) {
        s += ", ... (" + std::to_string(array_size_) + " total)";
      }
      return s + "]";
    }
    default:
      if (IsSignedType(type_)) return std::to_string(SignedValue(type_, bits_));
      return std::to_string(bits_);
  }
}

std::string TensorInfo::ShapeString() const {
  std::string s = "[";
  for (int i = 0; i < n_dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------
// GgufFile typed getters

namespace {

[[noreturn]] void BadValue(const GgufFile& f, std::string_view key, const std::string& msg) {
  throw Error(ErrorKind::kMalformedFile,
              f.name() + ": metadata key '" + std::string(key) + "': " + msg);
}

[[noreturn]] void Missing(const GgufFile& f, std::string_view key) {
  throw Error(ErrorKind::kMalformedFile,
              f.name() + ": missing required metadata key '" + std::string(key) + "'");
}

template <typename T>
const char* IntName() {
  if constexpr (std::is_same_v<T, uint32_t>) return "u32";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, uint64_t>) return "u64";
  return "i64";
}

// Converts an integer value to T; nullopt when it is not an integer or does not fit.
template <typename T>
std::optional<T> FitInt(const MetadataValue& v) {
  if constexpr (std::is_signed_v<T>) {
    const auto x = v.AsInt64();
    if (!x || *x < std::numeric_limits<T>::min() || *x > std::numeric_limits<T>::max()) {
      return std::nullopt;
    }
    return static_cast<T>(*x);
  } else {
    const auto x = v.AsUint64();
    if (!x || *x > std::numeric_limits<T>::max()) return std::nullopt;
    return static_cast<T>(*x);
  }
}

template <typename T>
std::optional<T> GetInt(const GgufFile& f, std::string_view key) {
  const MetadataValue* v = f.Find(key);
  if (!v) return std::nullopt;
  if (!IsIntegerType(v->type())) {
    BadValue(f, key,
             std::string("expected an integer, found ") + std::string(ValueTypeName(v->type())));
  }
  const auto x = FitInt<T>(*v);
  if (!x) BadValue(f, key, "value " + v->ToString() + " does not fit " + IntName<T>());
  return x;
}

template <typename T>
T Require(const GgufFile& f, std::string_view key, std::optional<T> v) {
  if (!v) Missing(f, key);
  return *v;
}

const MetadataValue* FindArray(const GgufFile& f, std::string_view key) {
  const MetadataValue* v = f.Find(key);
  if (v && !v->is_array()) {
    BadValue(f, key,
             std::string("expected an array, found ") + std::string(ValueTypeName(v->type())));
  }
  return v;
}

template <typename T>
std::optional<std::vector<T>> GetIntArray(const GgufFile& f, std::string_view key) {
  const MetadataValue* v = FindArray(f, key);
  if (!v) return std::nullopt;
  if (!IsIntegerType(v->array_type())) {
    BadValue(f, key,
             std::string("expected an integer array, found an array of ") +
                 std::string(ValueTypeName(v->array_type())));
  }
  std::vector<T> out;
  out.reserve(v->array_size());
  for (uint64_t i = 0; i < v->array_size(); ++i) {
    const MetadataValue e = v->ArrayElement(i);
    const auto x = FitInt<T>(e);
    if (!x) {
      BadValue(
          f, key,
          "element " + std::to_string(i) + " = " + e.ToString() + " does not fit " + IntName<T>());
    }
    out.push_back(*x);
  }
  return out;
}

}  // namespace

std::optional<uint32_t> GgufFile::GetU32(std::string_view key) const {
  return GetInt<uint32_t>(*this, key);
}
std::optional<int32_t> GgufFile::GetI32(std::string_view key) const {
  return GetInt<int32_t>(*this, key);
}
std::optional<uint64_t> GgufFile::GetU64(std::string_view key) const {
  return GetInt<uint64_t>(*this, key);
}
std::optional<int64_t> GgufFile::GetI64(std::string_view key) const {
  return GetInt<int64_t>(*this, key);
}

std::optional<float> GgufFile::GetF32(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (!v) return std::nullopt;
  const auto d = v->AsDouble();
  if (!d) {
    BadValue(*this, key,
             std::string("expected a number, found ") + std::string(ValueTypeName(v->type())));
  }
  return static_cast<float>(*d);
}

std::optional<bool> GgufFile::GetBool(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (!v) return std::nullopt;
  const auto b = v->AsBool();
  if (!b) {
    BadValue(*this, key,
             std::string("expected a bool, found ") + std::string(ValueTypeName(v->type())));
  }
  return b;
}

std::optional<std::string_view> GgufFile::GetString(std::string_view key) const {
  const MetadataValue* v = Find(key);
  if (!v) return std::nullopt;
  const auto s = v->AsString();
  if (!s) {
    BadValue(*this, key,
             std::string("expected a string, found ") + std::string(ValueTypeName(v->type())));
  }
  return s;
}

uint32_t GgufFile::RequireU32(std::string_view key) const {
  return Require(*this, key, GetU32(key));
}
int32_t GgufFile::RequireI32(std::string_view key) const {
  return Require(*this, key, GetI32(key));
}
uint64_t GgufFile::RequireU64(std::string_view key) const {
  return Require(*this, key, GetU64(key));
}
int64_t GgufFile::RequireI64(std::string_view key) const {
  return Require(*this, key, GetI64(key));
}
float GgufFile::RequireF32(std::string_view key) const { return Require(*this, key, GetF32(key)); }
bool GgufFile::RequireBool(std::string_view key) const { return Require(*this, key, GetBool(key)); }
std::string_view GgufFile::RequireString(std::string_view key) const {
  return Require(*this, key, GetString(key));
}

std::optional<std::span<const std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  const MetadataValue* v = FindArray(*this, key);
  if (!v) return std::nullopt;
  if (v->array_type() != ValueType::kString) {
    BadValue(*this, key,
             std::string("expected an array of strings, found an array of ") +
                 std::string(ValueTypeName(v->array_type())));
  }
  return v->string_array();
}

std::span<const std::string_view> GgufFile::RequireStringArray(std::string_view key) const {
  return Require(*this, key, GetStringArray(key));
}

std::optional<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  const MetadataValue* v = FindArray(*this, key);
  if (!v) return std::nullopt;
  if (v->array_type() != ValueType::kF32 && v->array_type() != ValueType::kF64) {
    BadValue(*this, key,
             std::string("expected an array of f32, found an array of ") +
                 std::string(ValueTypeName(v->array_type())));
  }
  std::vector<float> out(v->array_size());
  for (uint64_t i = 0; i < v->array_size(); ++i) {
    out[i] = static_cast<float>(*v->ArrayElement(i).AsDouble());
  }
  return out;
}

std::vector<float> GgufFile::RequireF32Array(std::string_view key) const {
  return Require(*this, key, GetF32Array(key));
}

std::optional<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  return GetIntArray<int32_t>(*this, key);
}

std::vector<int32_t> GgufFile::RequireI32Array(std::string_view key) const {
  return Require(*this, key, GetI32Array(key));
}

std::optional<std::vector<int64_t>> GgufFile::GetI64Array(std::string_view key) const {
  return GetIntArray<int64_t>(*this, key);
}

}  // namespace meshnet::gguf
