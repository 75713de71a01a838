// GGUF writer: builds a GGUF v3 file (little-endian) from metadata values and
// tensors, laid out the way llama.cpp writes them: header, metadata, tensor
// infos, padding to the alignment, then each tensor's data padded to the
// alignment. Used by tests, the fuzz corpus generator and `meshnet make-model`.
//
// Contract:
//  - Metadata keys keep their insertion order; setting a key twice replaces
//    its value in place. When the alignment is not the default 32 and the
//    caller did not set general.alignment, the writer adds it (as u32);
//    setting general.alignment to anything else than that u32 throws.
//  - AddTensor validates the name (1..63 bytes, unique), 1..4 dimensions of
//    at least 1, ne0 a multiple of the type's block size and (for the copying
//    overload) the data size; violations throw Error(kInvalidArgument).
//  - The generator overload lets huge tensors be produced one at a time while
//    writing, so a file never has to be held in memory.
//  - WriteFile writes to "<path>.tmp" and renames it over `path`, so readers
//    never see a half-written file. I/O failures throw Error(kInvalidArgument)
//    naming the path.
//
// Thread-safety: not thread-safe; one writer per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "ops/ggml_type.h"

namespace meshnet::gguf {

// A metadata value to be written: its type and its encoded payload (the
// bytes that follow the type id in the file).
class WriterValue {
 public:
  static WriterValue U8(uint8_t v);
  static WriterValue I8(int8_t v);
  static WriterValue U16(uint16_t v);
  static WriterValue I16(int16_t v);
  static WriterValue U32(uint32_t v);
  static WriterValue I32(int32_t v);
  static WriterValue F32(float v);
  static WriterValue Bool(bool v);
  static WriterValue String(std::string_view v);
  static WriterValue U64(uint64_t v);
  static WriterValue I64(int64_t v);
  static WriterValue F64(double v);
  // An array whose elements all have type `elem_type` (throws
  // kInvalidArgument otherwise). Elements may themselves be arrays.
  static WriterValue Array(ValueType elem_type, std::span<const WriterValue> elems);
  static WriterValue StringArray(std::span<const std::string> v);
  static WriterValue StringArray(std::span<const std::string_view> v);
  static WriterValue F32Array(std::span<const float> v);
  static WriterValue I32Array(std::span<const int32_t> v);
  // A deep copy of a value read from a file (for copying keys between files).
  static WriterValue From(const MetadataValue& v);

  ValueType type() const { return type_; }
  const std::string& payload() const { return payload_; }

 private:
  WriterValue(ValueType t, std::string payload) : type_(t), payload_(std::move(payload)) {}
  ValueType type_;
  std::string payload_;
};

class GgufWriter {
 public:
  // Fills `dst` (exactly the tensor's byte size) with the tensor's data.
  using Generator = std::function<void(std::span<uint8_t> dst)>;

  // `alignment` must be a power of two (kInvalidArgument otherwise).
  explicit GgufWriter(uint32_t alignment = kDefaultAlignment);

  void Set(std::string_view key, WriterValue value);
  void SetU32(std::string_view key, uint32_t v) { Set(key, WriterValue::U32(v)); }
  void SetI32(std::string_view key, int32_t v) { Set(key, WriterValue::I32(v)); }
  void SetU64(std::string_view key, uint64_t v) { Set(key, WriterValue::U64(v)); }
  void SetF32(std::string_view key, float v) { Set(key, WriterValue::F32(v)); }
  void SetBool(std::string_view key, bool v) { Set(key, WriterValue::Bool(v)); }
  void SetString(std::string_view key, std::string_view v) { Set(key, WriterValue::String(v)); }

  // Copies `data` (must be exactly the tensor's byte size). `dims` in GGUF
  // order: dims[0] = row length.
  void AddTensor(std::string_view name, GgmlType type, std::span<const int64_t> dims,
                 std::span<const uint8_t> data);
  void AddTensor(std::string_view name, GgmlType type, std::span<const int64_t> dims,
                 std::span<const float> f32_data);  // type must be kF32
  // Data produced by `gen` at write time.
  void AddTensor(std::string_view name, GgmlType type, std::span<const int64_t> dims,
                 Generator gen);

  // Byte size of a tensor of `type` and `dims` (after validation).
  static uint64_t TensorBytes(GgmlType type, std::span<const int64_t> dims);

  void WriteFile(const std::string& path) const;
  std::vector<uint8_t> WriteToBytes() const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    uint64_t n_bytes;
    Generator gen;
  };
  // Streams the whole file to `sink(bytes)`.
  void Emit(const std::function<void(const void*, size_t)>& sink) const;

  uint32_t alignment_;
  std::vector<std::pair<std::string, WriterValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace meshnet::gguf
