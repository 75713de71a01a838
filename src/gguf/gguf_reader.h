// GGUF reader: a read-only, validated view of a GGUF v2/v3 file.
//
// Contract:
//  - GgufFile::Open() memory-maps the file read-only and parses the header,
//    metadata and tensor table eagerly. Every count, string length, offset,
//    size, dimension and type id is validated against the file before use;
//    any violation throws meshnet::Error(kMalformedFile) with a message naming
//    the offending field, key or tensor. A malformed file never crashes the
//    reader and never makes it read outside the mapping.
//  - Accepted: little-endian GGUF v2 and v3 (v1 is refused), every metadata
//    value type (including nested arrays), general.alignment (default 32,
//    must be a power of two), tensor types F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K,
//    n_dims 1..4, ne0 a multiple of the type's block size, unique names,
//    every tensor's data aligned and inside the file.
//  - Tensor data is NOT copied: TensorInfo::data points into the mapping and
//    stays valid for the lifetime of the GgufFile (moving the GgufFile keeps
//    it valid). Strings returned as std::string_view point into the mapping
//    too and have the same lifetime.
//  - Typed getters: GetX(key) -> nullopt when the key is absent; GetX(key, def)
//    -> def when absent; RequireX(key) throws kMalformedFile naming the key
//    when absent. All of them throw kMalformedFile when the key is present
//    with an incompatible type or a value that does not fit the requested
//    type. Integer getters accept any stored integer type whose value fits;
//    float getters accept F32 and F64 (and integers).
//
// Thread-safety: a GgufFile is immutable after construction; all const
// methods are safe to call concurrently from any number of threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ops/ggml_type.h"

namespace meshnet::gguf {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

// GGUF metadata value type ids (as stored in the file).
enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u8", "i32", "f32", "bool", "string", "array", ...
std::string_view ValueTypeName(ValueType t);
bool IsIntegerType(ValueType t);

// One metadata value: a scalar, a string or an array (whose elements may
// themselves be arrays). Cheap to copy for scalars; arrays of strings and
// nested arrays hold their elements in vectors of views.
class MetadataValue {
 public:
  MetadataValue() = default;

  ValueType type() const { return type_; }
  bool is_array() const { return type_ == ValueType::kArray; }

  // Scalar conversions; nullopt when the stored type is not convertible or
  // the value does not fit.
  std::optional<int64_t> AsInt64() const;            // any integer type
  std::optional<uint64_t> AsUint64() const;          // any integer type, value >= 0
  std::optional<double> AsDouble() const;            // F32, F64 or any integer type
  std::optional<bool> AsBool() const;                // kBool only
  std::optional<std::string_view> AsString() const;  // kString only

  // Arrays (only meaningful when is_array()).
  ValueType array_type() const { return array_type_; }
  uint64_t array_size() const { return array_size_; }
  // Element i (i < array_size()). Returns a scalar/string/array value.
  MetadataValue ArrayElement(uint64_t i) const;
  // Fast views for the common tokenizer arrays; empty when array_type()
  // does not match.
  std::span<const std::string_view> string_array() const { return strings_; }

  // Human-readable rendering: scalars as-is, strings quoted, arrays show at
  // most `max_elems` elements then "... (N total)".
  std::string ToString(size_t max_elems = 8) const;

 private:
  friend class GgufParser;
  ValueType type_ = ValueType::kU8;
  uint64_t bits_ = 0;     // scalars: raw little-endian bits, zero-extended
  std::string_view str_;  // kString
  ValueType array_type_ = ValueType::kU8;
  uint64_t array_size_ = 0;
  const uint8_t* array_data_ = nullptr;    // numeric/bool arrays: packed elements
  std::vector<std::string_view> strings_;  // string arrays
  std::vector<MetadataValue> arrays_;      // arrays of arrays
};

struct MetadataEntry {
  std::string_view key;
  MetadataValue value;
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  int n_dims = 0;
  std::array<int64_t, kMaxDims> ne = {1, 1, 1, 1};  // GGUF order: ne[0] = row length
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t offset = 0;  // absolute byte offset in the file
  // Into the mapping; n_bytes long. Open() maps page-aligned and FromBytes()
  // copies 64-byte aligned, so data is aligned to min(alignment, page or 64)
  // (>= 32 unless general.alignment says less).
  const void* data = nullptr;

  std::span<const int64_t> dims() const { return {ne.data(), static_cast<size_t>(n_dims)}; }
  int64_t rows() const { return n_elements / ne[0]; }  // product of ne[1..]
  uint64_t row_bytes() const { return n_bytes / static_cast<uint64_t>(rows()); }
  std::string ShapeString() const;  // "[64, 512]"
};

class GgufFile {
 public:
  enum class Access {
    kRandom,      // madvise(MADV_RANDOM): no readahead (a shard reads only its layers)
    kSequential,  // default kernel readahead
  };

  // Maps and validates `path`. Throws Error(kMalformedFile) for a malformed
  // file and Error(kInvalidArgument) when the file cannot be opened/mapped.
  static GgufFile Open(const std::string& path, Access access = Access::kRandom);
  // Parses a copy of `bytes` (tests, fuzzing). `name` appears in messages.
  static GgufFile FromBytes(std::span<const uint8_t> bytes, std::string name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& name() const { return name_; }  // path or FromBytes name
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  // ---- metadata ----
  const std::vector<MetadataEntry>& metadata() const { return metadata_; }  // file order
  const MetadataValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  std::optional<uint32_t> GetU32(std::string_view key) const;
  std::optional<int32_t> GetI32(std::string_view key) const;
  std::optional<uint64_t> GetU64(std::string_view key) const;
  std::optional<int64_t> GetI64(std::string_view key) const;
  std::optional<float> GetF32(std::string_view key) const;
  std::optional<bool> GetBool(std::string_view key) const;
  std::optional<std::string_view> GetString(std::string_view key) const;

  uint32_t GetU32(std::string_view key, uint32_t def) const { return GetU32(key).value_or(def); }
  int32_t GetI32(std::string_view key, int32_t def) const { return GetI32(key).value_or(def); }
  uint64_t GetU64(std::string_view key, uint64_t def) const { return GetU64(key).value_or(def); }
  int64_t GetI64(std::string_view key, int64_t def) const { return GetI64(key).value_or(def); }
  float GetF32(std::string_view key, float def) const { return GetF32(key).value_or(def); }
  bool GetBool(std::string_view key, bool def) const { return GetBool(key).value_or(def); }
  std::string_view GetString(std::string_view key, std::string_view def) const {
    return GetString(key).value_or(def);
  }

  uint32_t RequireU32(std::string_view key) const;
  int32_t RequireI32(std::string_view key) const;
  uint64_t RequireU64(std::string_view key) const;
  int64_t RequireI64(std::string_view key) const;
  float RequireF32(std::string_view key) const;
  bool RequireBool(std::string_view key) const;
  std::string_view RequireString(std::string_view key) const;

  // Arrays. Get*: nullopt when absent; Require*: throws when absent. Both
  // throw kMalformedFile when the key is not an array of a compatible type
  // (string arrays: kString elements; F32 arrays: F32/F64 elements; integer
  // arrays: any integer element type whose every value fits).
  std::optional<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  std::span<const std::string_view> RequireStringArray(std::string_view key) const;
  std::optional<std::vector<float>> GetF32Array(std::string_view key) const;
  std::vector<float> RequireF32Array(std::string_view key) const;
  std::optional<std::vector<int32_t>> GetI32Array(std::string_view key) const;
  std::vector<int32_t> RequireI32Array(std::string_view key) const;
  std::optional<std::vector<int64_t>> GetI64Array(std::string_view key) const;

  // ---- tensors ----
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // file order
  const TensorInfo* FindTensor(std::string_view name) const;
  // Throws Error(kMalformedFile) "<file>: missing tensor '<name>'".
  const TensorInfo& RequireTensor(std::string_view name) const;
  // Hints the kernel to page in a tensor's bytes (madvise WILLNEED); no-op
  // for in-memory files. Never fails.
  void WillNeed(const TensorInfo& t) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  struct Mapping;

  std::string name_;
  std::unique_ptr<Mapping> mapping_;  // owns the bytes (mmap or heap copy)
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<MetadataEntry> metadata_;
  std::unordered_map<std::string_view, size_t> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // views into tensors_[i].name
};

}  // namespace meshnet::gguf
