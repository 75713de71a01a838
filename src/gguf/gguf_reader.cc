// GGUF reader implementation.
//
// Invariants after a successful parse:
//  - base_[0, size_) is the whole file; every string_view, array_data_ and
//    TensorInfo::data points inside it, with its full length inside it.
//  - Every bound is checked as `n <= size_ - pos_` (never `pos_ + n <= size_`),
//    so no check can overflow; counts are bounded by the bytes left before any
//    allocation, so a hostile count cannot exhaust memory.
//  - metadata_index_ / tensor_index_ hold views into the mapping / into
//    tensors_[i].name; both are built after their vectors stop growing.
#include "gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "gguf/internal.h"
#include "util/error.h"

static_assert(std::endian::native == std::endian::little, "meshnet reads GGUF in host order");

namespace meshnet::gguf {

using internal::Escaped;
using internal::ScalarSize;

namespace {

constexpr uint64_t kMaxNestingDepth = 8;
constexpr uint64_t kMaxTensorNameLen = 63;  // GGML_MAX_NAME - 1
constexpr uint64_t kMaxKeyLen = 65535;

bool IsValidValueType(uint32_t id) { return id <= static_cast<uint32_t>(ValueType::kF64); }

std::string SupportedTensorTypes() {
  std::string s;
  for (uint32_t id : {0u, 1u, 30u, 8u, 2u, 12u, 14u}) {
    if (auto info = GgmlTypeInfoFor(id)) {
      s += (s.empty() ? "" : ", ") + std::string(info->name) + "=" + std::to_string(id);
    }
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------
// Mapping

struct GgufFile::Mapping {
  void* mmap_addr = nullptr;  // when mapped
  size_t mmap_len = 0;
  uint8_t* heap = nullptr;  // when copied (exact size, 64-byte aligned)

  ~Mapping() {
    if (mmap_addr) munmap(mmap_addr, mmap_len);
    if (heap) ::operator delete[](heap, std::align_val_t(64));
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

// ---------------------------------------------------------------------------
// Parser

class GgufParser {
 public:
  explicit GgufParser(GgufFile* f) : f_(f), base_(f->base_), size_(f->size_) {}

  void Parse() {
    context_ = "header";
    if (size_ < 4) Fail("file too small to be GGUF (" + std::to_string(size_) + " bytes)");
    const uint32_t magic = Read<uint32_t>("magic");
    if (magic != kGgufMagic) Fail("not a GGUF file (bad magic)");
    const uint32_t version = Read<uint32_t>("version");
    if (version == 1) Fail("GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
      std::string msg = "unsupported GGUF version " + std::to_string(version);
      if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3)
        msg += " (big-endian file?)";
      Fail(msg + "; only versions 2 and 3 are supported");
    }
    f_->version_ = version;
    const uint64_t n_tensors = Read<uint64_t>("tensor count");
    const uint64_t n_kv = Read<uint64_t>("metadata count");
    // Smallest encodings: a KV is key(8+1) + type(4) + a 1-byte value; a tensor
    // info is name(8+1) + n_dims(4) + one dim(8) + type(4) + offset(8).
    if (n_kv > Left() / 14) {
      Fail("metadata count " + std::to_string(n_kv) + " cannot fit in the " +
           std::to_string(Left()) + " bytes left in the file");
    }
    if (n_tensors > Left() / 33) {
      Fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
           std::to_string(Left()) + " bytes left in the file");
    }
    ParseMetadata(n_kv);
    ParseAlignment();
    ParseTensorInfos(n_tensors);
    PlaceTensorData();
  }

 private:
  [[noreturn]] void Fail(const std::string& msg) const {
    throw Error(ErrorKind::kMalformedFile, f_->name_ + ": " + context_ + ": " + msg);
  }
  uint64_t Left() const { return size_ - pos_; }
  void Need(uint64_t n, const char* what) const {
    if (n > Left()) {
      Fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + " but only " + std::to_string(Left()) + " remain");
    }
  }
  template <typename T>
  T Read(const char* what) {
    Need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view ReadString(const char* what, uint64_t max_len) {
    const uint64_t len = Read<uint64_t>(what);
    if (len > max_len) {
      Fail(std::string(what) + " length " + std::to_string(len) + " exceeds the limit of " +
           std::to_string(max_len));
    }
    Need(len, what);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  void ParseMetadata(uint64_t n_kv) {
    auto& md = f_->metadata_;
    md.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
      context_ = "metadata entry #" + std::to_string(i);
      const std::string_view key = ReadString("key", kMaxKeyLen);
      if (key.empty()) Fail("empty key");
      context_ = "metadata key '" + Escaped(key) + "'";
      const uint32_t type_id = Read<uint32_t>("value type");
      if (!IsValidValueType(type_id)) Fail("unknown value type id " + std::to_string(type_id));
      MetadataValue v = ReadValue(static_cast<ValueType>(type_id), 0);
      if (!f_->metadata_index_.emplace(key, md.size()).second) Fail("duplicate key");
      md.push_back({key, std::move(v)});
    }
  }

  MetadataValue ReadValue(ValueType type, uint64_t depth) {
    MetadataValue v;
    v.type_ = type;
    if (type == ValueType::kString) {
      v.str_ = ReadString("string value", std::numeric_limits<uint64_t>::max());
      return v;
    }
    if (type != ValueType::kArray) {
      const uint64_t n = ScalarSize(type);
      Need(n, "scalar value");
      std::memcpy(&v.bits_, base_ + pos_, n);
      pos_ += n;
      if (type == ValueType::kBool && v.bits_ > 1) {
        Fail("bool value " + std::to_string(v.bits_) + " is neither 0 nor 1");
      }
      return v;
    }
    if (depth >= kMaxNestingDepth) {
      Fail("arrays nested deeper than " + std::to_string(kMaxNestingDepth));
    }
    const uint32_t elem_id = Read<uint32_t>("array element type");
    if (!IsValidValueType(elem_id)) {
      Fail("unknown array element type id " + std::to_string(elem_id));
    }
    const ValueType elem = static_cast<ValueType>(elem_id);
    const uint64_t count = Read<uint64_t>("array length");
    v.array_type_ = elem;
    v.array_size_ = count;
    // Minimum bytes per element: scalar size, 8 (string length), 12 (array header).
    const uint64_t min_elem = elem == ValueType::kString  ? 8
                              : elem == ValueType::kArray ? 12
                                                          : ScalarSize(elem);
    if (count > Left() / min_elem) {
      Fail("array length " + std::to_string(count) + " of " + std::string(ValueTypeName(elem)) +
           " cannot fit in the " + std::to_string(Left()) + " bytes left in the file");
    }
    if (elem == ValueType::kString) {
      v.strings_.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        v.strings_.push_back(ReadString("array string", std::numeric_limits<uint64_t>::max()));
      }
    } else if (elem == ValueType::kArray) {
      v.arrays_.reserve(count);
      for (uint64_t i = 0; i < count; ++i) v.arrays_.push_back(ReadValue(elem, depth + 1));
    } else {
      const uint64_t bytes = count * min_elem;  // cannot overflow: bounded by Left()
      v.array_data_ = base_ + pos_;
      if (elem == ValueType::kBool) {
        for (uint64_t i = 0; i < count; ++i) {
          if (v.array_data_[i] > 1) {
            Fail("bool array element " + std::to_string(i) + " is neither 0 nor 1");
          }
        }
      }
      pos_ += bytes;
    }
    return v;
  }

  void ParseAlignment() {
    context_ = std::string("metadata key '") + "general.alignment" + "'";
    const MetadataValue* v = f_->Find("general.alignment");
    if (!v) return;
    const auto a = v->AsUint64();
    if (!a) Fail("must be an unsigned integer, got " + std::string(ValueTypeName(v->type())));
    if (*a == 0 || *a > std::numeric_limits<uint32_t>::max() || !std::has_single_bit(*a)) {
      Fail("alignment " + std::to_string(*a) + " is not a power of two in [1, 2^31]");
    }
    f_->alignment_ = *a;
  }

  void ParseTensorInfos(uint64_t n_tensors) {
    context_ = "tensor table";
    if (n_tensors > Left() / 33) {
      Fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
           std::to_string(Left()) + " bytes left after the metadata");
    }
    auto& tensors = f_->tensors_;
    tensors.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      context_ = "tensor #" + std::to_string(i);
      const std::string_view name = ReadString("tensor name", kMaxTensorNameLen);
      if (name.empty()) Fail("empty tensor name");
      context_ = "tensor '" + Escaped(name) + "'";
      TensorInfo t;
      t.name = std::string(name);
      const uint32_t n_dims = Read<uint32_t>("n_dims");
      if (n_dims < 1 || n_dims > kMaxDims) {
        Fail("n_dims " + std::to_string(n_dims) + " is outside [1, " + std::to_string(kMaxDims) +
             "]");
      }
      t.n_dims = static_cast<int>(n_dims);
      int64_t n_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t ne = Read<uint64_t>("dimension");
        if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          Fail("dimension ne" + std::to_string(d) + " = " + std::to_string(ne) +
               " is out of range");
        }
        t.ne[d] = static_cast<int64_t>(ne);
        if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements)) {
          Fail("element count overflows 63 bits");
        }
      }
      t.n_elements = n_elements;
      const uint32_t type_id = Read<uint32_t>("tensor type");
      const auto info = GgmlTypeInfoFor(type_id);
      if (!info) {
        Fail("unknown or unsupported tensor type id " + std::to_string(type_id) +
             " (supported: " + SupportedTensorTypes() + ")");
      }
      t.type = info->type;
      if (t.ne[0] % info->block_elems != 0) {
        Fail("row length ne0 = " + std::to_string(t.ne[0]) + " is not a multiple of the " +
             std::string(info->name) + " block size " + std::to_string(info->block_elems));
      }
      int64_t n_bytes = 0;
      if (__builtin_mul_overflow(n_elements / info->block_elems, info->block_bytes, &n_bytes)) {
        Fail("byte size overflows 63 bits");
      }
      t.n_bytes = static_cast<uint64_t>(n_bytes);
      t.offset = Read<uint64_t>("data offset");  // relative for now; made absolute below
      tensors.push_back(std::move(t));
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!f_->tensor_index_.emplace(tensors[i].name, i).second) {
        context_ = "tensor '" + Escaped(tensors[i].name) + "'";
        Fail("duplicate tensor name");
      }
    }
  }

  void PlaceTensorData() {
    const uint64_t a = f_->alignment_;
    // pos_ <= size_ < 2^63 and a <= 2^32, so this cannot overflow.
    const uint64_t data_offset = (pos_ + a - 1) / a * a;
    f_->data_offset_ = data_offset;
    for (TensorInfo& t : f_->tensors_) {
      context_ = "tensor '" + Escaped(t.name) + "'";
      const uint64_t rel = t.offset;
      if (rel % a != 0) {
        Fail("data offset " + std::to_string(rel) + " is not a multiple of the alignment " +
             std::to_string(a));
      }
      if (data_offset > size_ || rel > size_ - data_offset ||
          t.n_bytes > size_ - data_offset - rel) {
        Fail("data [" + std::to_string(rel) + ", +" + std::to_string(t.n_bytes) +
             ") relative to the data section at " + std::to_string(data_offset) +
             " lies outside the file of " + std::to_string(size_) + " bytes");
      }
      t.offset = data_offset + rel;
      t.data = base_ + t.offset;
    }
    CheckNoOverlap();
  }

  // A tensor's bytes (from its type and shape) must end before the next
  // tensor's data begins: otherwise its size does not match what the file
  // laid out for it.
  void CheckNoOverlap() {
    std::vector<const TensorInfo*> by_offset;
    by_offset.reserve(f_->tensors_.size());
    for (const TensorInfo& t : f_->tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 0; i + 1 < by_offset.size(); ++i) {
      const TensorInfo& t = *by_offset[i];
      const TensorInfo& next = *by_offset[i + 1];
      if (t.n_bytes > next.offset - t.offset) {
        context_ = "tensor '" + Escaped(t.name) + "'";
        Fail("byte size " + std::to_string(t.n_bytes) + " of " +
             std::string(GgmlTypeInfoOf(t.type).name) + " " + t.ShapeString() +
             " overruns the data of tensor '" + Escaped(next.name) + "' " +
             std::to_string(next.offset - t.offset) + " bytes later");
      }
    }
  }

  GgufFile* f_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string context_;
};

// ---------------------------------------------------------------------------
// GgufFile

GgufFile GgufFile::Open(const std::string& path, Access access) {
  GgufFile f;
  f.name_ = path;
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; such
  // files are refused just below, before anything is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    ThrowInvalidArgument("cannot open '" + path + "': " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    ThrowInvalidArgument("'" + path + "' is not a regular file");
  }
  f.mapping_ = std::make_unique<Mapping>();
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* addr = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      ThrowInvalidArgument("cannot map '" + path + "': " + std::strerror(err));
    }
    f.mapping_->mmap_addr = addr;
    f.mapping_->mmap_len = f.size_;
    if (access == Access::kRandom) ::madvise(addr, f.size_, MADV_RANDOM);
    f.base_ = static_cast<const uint8_t*>(addr);
  }
  ::close(fd);
  GgufParser(&f).Parse();
  return f;
}

GgufFile GgufFile::FromBytes(std::span<const uint8_t> bytes, std::string name) {
  GgufFile f;
  f.name_ = std::move(name);
  f.mapping_ = std::make_unique<Mapping>();
  f.size_ = bytes.size();
  if (!bytes.empty()) {
    // Exactly sized so that sanitizers catch any read past the end.
    f.mapping_->heap = static_cast<uint8_t*>(::operator new[](bytes.size(), std::align_val_t(64)));
    std::memcpy(f.mapping_->heap, bytes.data(), bytes.size());
    f.base_ = f.mapping_->heap;
  }
  GgufParser(&f).Parse();
  return f;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::RequireTensor(std::string_view name) const {
  if (const TensorInfo* t = FindTensor(name)) return *t;
  throw Error(ErrorKind::kMalformedFile, name_ + ": missing tensor '" + std::string(name) + "'");
}

void GgufFile::WillNeed(const TensorInfo& t) const {
  if (!mapping_ || !mapping_->mmap_addr || t.n_bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(t.data) + t.n_bytes;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

const MetadataValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

}  // namespace meshnet::gguf
