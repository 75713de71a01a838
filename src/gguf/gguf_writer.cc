// GGUF v3 writer. Layout (all little-endian):
//   magic "GGUF", version u32 = 3, tensor count u64, metadata count u64,
//   metadata (key string, type u32, payload)*, tensor infos (name string,
//   n_dims u32, ne u64 * n_dims, type u32, offset u64)*, zero padding to the
//   alignment, tensor data each padded to the alignment.
// Strings are u64 length + bytes. Offsets are relative to the data section.
#include "gguf/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "gguf/internal.h"
#include "util/error.h"

namespace meshnet::gguf {

namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

template <typename T>
std::string Scalar(T v) {
  std::string s;
  Put<T>(&s, v);
  return s;
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

// ---------------------------------------------------------------------------
// WriterValue

WriterValue WriterValue::U8(uint8_t v) { return {ValueType::kU8, Scalar(v)}; }
WriterValue WriterValue::I8(int8_t v) { return {ValueType::kI8, Scalar(v)}; }
WriterValue WriterValue::U16(uint16_t v) { return {ValueType::kU16, Scalar(v)}; }
WriterValue WriterValue::I16(int16_t v) { return {ValueType::kI16, Scalar(v)}; }
WriterValue WriterValue::U32(uint32_t v) { return {ValueType::kU32, Scalar(v)}; }
WriterValue WriterValue::I32(int32_t v) { return {ValueType::kI32, Scalar(v)}; }
WriterValue WriterValue::F32(float v) { return {ValueType::kF32, Scalar(v)}; }
WriterValue WriterValue::Bool(bool v) { return {ValueType::kBool, Scalar<uint8_t>(v ? 1 : 0)}; }
WriterValue WriterValue::U64(uint64_t v) { return {ValueType::kU64, Scalar(v)}; }
WriterValue WriterValue::I64(int64_t v) { return {ValueType::kI64, Scalar(v)}; }
WriterValue WriterValue::F64(double v) { return {ValueType::kF64, Scalar(v)}; }

WriterValue WriterValue::String(std::string_view v) {
  std::string s;
  PutString(&s, v);
  return {ValueType::kString, std::move(s)};
}

WriterValue WriterValue::Array(ValueType elem_type, std::span<const WriterValue> elems) {
  std::string s;
  Put<uint32_t>(&s, static_cast<uint32_t>(elem_type));
  Put<uint64_t>(&s, elems.size());
  for (const WriterValue& e : elems) {
    if (e.type_ != elem_type) {
      ThrowInvalidArgument("GGUF array of " + std::string(ValueTypeName(elem_type)) +
                           " given an element of type " + std::string(ValueTypeName(e.type_)));
    }
    s += e.payload_;
  }
  return {ValueType::kArray, std::move(s)};
}

namespace {
template <typename Strings>
std::string StringArrayPayload(const Strings& v) {
  std::string s;
  Put<uint32_t>(&s, static_cast<uint32_t>(ValueType::kString));
  Put<uint64_t>(&s, v.size());
  for (const auto& e : v) PutString(&s, e);
  return s;
}
template <typename T>
std::string PodArrayPayload(ValueType t, std::span<const T> v) {
  std::string s;
  Put<uint32_t>(&s, static_cast<uint32_t>(t));
  Put<uint64_t>(&s, v.size());
  s.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  return s;
}
}  // namespace

WriterValue WriterValue::StringArray(std::span<const std::string> v) {
  return {ValueType::kArray, StringArrayPayload(v)};
}
WriterValue WriterValue::StringArray(std::span<const std::string_view> v) {
  return {ValueType::kArray, StringArrayPayload(v)};
}
WriterValue WriterValue::F32Array(std::span<const float> v) {
  return {ValueType::kArray, PodArrayPayload(ValueType::kF32, v)};
}
WriterValue WriterValue::I32Array(std::span<const int32_t> v) {
  return {ValueType::kArray, PodArrayPayload(ValueType::kI32, v)};
}

WriterValue WriterValue::From(const MetadataValue& v) {
  const ValueType t = v.type();
  if (t == ValueType::kString) return String(*v.AsString());
  if (t != ValueType::kArray) {
    // Scalars: re-encode the raw bits at the type's width (little-endian).
    const uint64_t n = internal::ScalarSize(t);
    uint64_t bits = 0;
    if (t == ValueType::kF32) {
      const float f = static_cast<float>(*v.AsDouble());
      std::memcpy(&bits, &f, 4);
    } else if (t == ValueType::kF64) {
      const double d = *v.AsDouble();
      std::memcpy(&bits, &d, 8);
    } else if (t == ValueType::kBool) {
      bits = *v.AsBool() ? 1 : 0;
    } else if (auto u = v.AsUint64()) {
      bits = *u;
    } else {
      bits = static_cast<uint64_t>(*v.AsInt64());  // two's complement, truncated below
    }
    std::string s(reinterpret_cast<const char*>(&bits), n);
    return {t, std::move(s)};
  }
  if (v.array_type() == ValueType::kString) return StringArray(v.string_array());
  std::vector<WriterValue> elems;
  elems.reserve(v.array_size());
  for (uint64_t i = 0; i < v.array_size(); ++i) elems.push_back(From(v.ArrayElement(i)));
  return Array(v.array_type(), elems);
}

// ---------------------------------------------------------------------------
// GgufWriter

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment)) {
    ThrowInvalidArgument("GGUF alignment " + std::to_string(alignment) + " is not a power of two");
  }
}

void GgufWriter::Set(std::string_view key, WriterValue value) {
  if (key.empty()) ThrowInvalidArgument("empty GGUF metadata key");
  if (key == "general.alignment" && (value.type() != ValueType::kU32 ||
                                     value.payload() != WriterValue::U32(alignment_).payload())) {
    ThrowInvalidArgument("general.alignment must be the u32 " + std::to_string(alignment_) +
                         " given to the GgufWriter constructor");
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::string(key), std::move(value));
}

uint64_t GgufWriter::TensorBytes(GgmlType type, std::span<const int64_t> dims) {
  const GgmlTypeInfo info = GgmlTypeInfoOf(type);
  if (dims.empty() || dims.size() > static_cast<size_t>(kMaxDims)) {
    ThrowInvalidArgument("tensor needs 1 to 4 dimensions, got " + std::to_string(dims.size()));
  }
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 1) ThrowInvalidArgument("tensor dimension " + std::to_string(d) + " < 1");
    if (__builtin_mul_overflow(n, d, &n)) ThrowInvalidArgument("tensor element count overflows");
  }
  if (dims[0] % info.block_elems != 0) {
    ThrowInvalidArgument("row length " + std::to_string(dims[0]) + " is not a multiple of the " +
                         std::string(info.name) + " block size " +
                         std::to_string(info.block_elems));
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n / info.block_elems, info.block_bytes, &bytes)) {
    ThrowInvalidArgument("tensor byte size overflows");
  }
  return static_cast<uint64_t>(bytes);
}

void GgufWriter::AddTensor(std::string_view name, GgmlType type, std::span<const int64_t> dims,
                           Generator gen) {
  if (name.empty() || name.size() > 63) {
    ThrowInvalidArgument("tensor name '" + std::string(name) + "' must be 1 to 63 bytes");
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) ThrowInvalidArgument("duplicate tensor name '" + std::string(name) + "'");
  }
  uint64_t n_bytes = 0;
  try {
    n_bytes = TensorBytes(type, dims);
  } catch (const Error& e) {
    ThrowInvalidArgument("tensor '" + std::string(name) + "': " + e.what());
  }
  tensors_.push_back(
      {std::string(name), type, {dims.begin(), dims.end()}, n_bytes, std::move(gen)});
}

void GgufWriter::AddTensor(std::string_view name, GgmlType type, std::span<const int64_t> dims,
                           std::span<const uint8_t> data) {
  const uint64_t n_bytes = TensorBytes(type, dims);
  if (data.size() != n_bytes) {
    ThrowInvalidArgument("tensor '" + std::string(name) + "': data has " +
                         std::to_string(data.size()) + " bytes, expected " +
                         std::to_string(n_bytes));
  }
  auto copy = std::make_shared<std::vector<uint8_t>>(data.begin(), data.end());
  AddTensor(name, type, dims,
            [copy](std::span<uint8_t> dst) { std::memcpy(dst.data(), copy->data(), dst.size()); });
}

void GgufWriter::AddTensor(std::string_view name, GgmlType type, std::span<const int64_t> dims,
                           std::span<const float> f32_data) {
  if (type != GgmlType::kF32) {
    ThrowInvalidArgument("tensor '" + std::string(name) + "': float data needs type F32");
  }
  AddTensor(name, type, dims,
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(f32_data.data()),
                                     f32_data.size_bytes()));
}

void GgufWriter::Emit(const std::function<void(const void*, size_t)>& sink) const {
  const bool add_alignment = alignment_ != kDefaultAlignment &&
                             std::none_of(metadata_.begin(), metadata_.end(), [](const auto& kv) {
                               return kv.first == "general.alignment";
                             });
  std::string head;
  Put<uint32_t>(&head, kGgufMagic);
  Put<uint32_t>(&head, 3);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, metadata_.size() + (add_alignment ? 1 : 0));
  auto put_kv = [&head](std::string_view key, const WriterValue& v) {
    PutString(&head, key);
    Put<uint32_t>(&head, static_cast<uint32_t>(v.type()));
    head += v.payload();
  };
  for (const auto& [k, v] : metadata_) put_kv(k, v);
  if (add_alignment) put_kv("general.alignment", WriterValue::U32(alignment_));
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&head, static_cast<uint64_t>(d));
    Put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&head, offset);
    offset = AlignUp(offset + t.n_bytes, alignment_);
  }
  head.resize(AlignUp(head.size(), alignment_), '\0');
  sink(head.data(), head.size());
  std::vector<uint8_t> buf;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const Tensor& t : tensors_) {
    buf.assign(t.n_bytes, 0);
    t.gen(std::span<uint8_t>(buf));
    sink(buf.data(), buf.size());
    const uint64_t pad = AlignUp(t.n_bytes, alignment_) - t.n_bytes;
    if (pad) sink(zeros.data(), pad);
  }
}

std::vector<uint8_t> GgufWriter::WriteToBytes() const {
  std::vector<uint8_t> out;
  Emit([&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  return out;
}

void GgufWriter::WriteFile(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) ThrowInvalidArgument("cannot create '" + tmp + "': " + std::strerror(errno));
  bool ok = true;
  try {
    Emit([&](const void* p, size_t n) {
      if (ok && std::fwrite(p, 1, n, f) != n) ok = false;
    });
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  const int err = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    ThrowInvalidArgument("cannot write '" + tmp + "': " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    std::remove(tmp.c_str());
    ThrowInvalidArgument("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(rerr));
  }
}

}  // namespace meshnet::gguf
