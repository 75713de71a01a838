// Malformed input: every truncation of small files, targeted corruption of
// each header/metadata/tensor field, and random mutations. Each must give
// Error(kMalformedFile) with a message naming the culprit; none may crash
// (run under ASan/UBSan in CI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace meshnet::gguf {
namespace {

// ---- a raw GGUF builder that can express invalid files ----

template <typename T>
std::string Le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
std::string Str(std::string_view s) { return Le<uint64_t>(s.size()) + std::string(s); }
std::string Kv(std::string_view key, uint32_t type, const std::string& payload) {
  return Str(key) + Le<uint32_t>(type) + payload;
}
std::string ArrHeader(uint32_t elem, uint64_t count) {
  return Le<uint32_t>(9) + Le<uint32_t>(elem) + Le<uint64_t>(count);
}

struct RawTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

struct RawFile {
  uint32_t magic = kGgufMagic;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;
  std::vector<std::string> kvs = {Kv("general.architecture", 8, Str("llama"))};
  std::vector<RawTensor> tensors = {{"a", {8, 2}, 0, 0}, {"b", {32}, 8, 64}};
  uint64_t alignment = 32;
  uint64_t data_bytes = 128;  // a: 64 bytes at 0; b: Q8_0 34 bytes at 64

  std::vector<uint8_t> Build() const {
    std::string s = Le(magic) + Le(version) + Le<uint64_t>(n_tensors.value_or(tensors.size())) +
                    Le<uint64_t>(n_kv.value_or(kvs.size()));
    for (const auto& kv : kvs) s += kv;
    for (const auto& t : tensors) {
      s += Str(t.name) + Le<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) s += Le(d);
      s += Le(t.type) + Le(t.offset);
    }
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    s.resize(s.size() + data_bytes, '\x11');
    return {s.begin(), s.end()};
  }
};

void ExpectMalformed(const std::vector<uint8_t>& bytes, const std::string& needle,
                     const std::string& what) {
  try {
    (void)GgufFile::FromBytes(bytes, "bad.gguf");
    ADD_FAILURE() << what << ": parsed without error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << what << ": " << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos)
        << what << ": message '" << msg << "' lacks '" << needle << "'";
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
  }
}

TEST(GgufMalformed, BaselineIsValid) {
  const GgufFile f = GgufFile::FromBytes(RawFile{}.Build());
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.RequireTensor("b").n_bytes, 34u);
  EXPECT_EQ(f.RequireTensor("b").offset, f.data_offset() + 64);
}

constexpr uint64_t kHuge = uint64_t{1} << 61;

struct Case {
  const char* what;
  std::function<void(RawFile*)> mutate;
  const char* needle;
};

TEST(GgufMalformed, TargetedCorruptions) {
  const Case cases[] = {
      {"bad magic", [](RawFile* r) { r->magic = 0x46554746; }, "bad magic"},
      {"version 1", [](RawFile* r) { r->version = 1; }, "version 1 is not supported"},
      {"version 4", [](RawFile* r) { r->version = 4; }, "unsupported GGUF version 4"},
      {"big-endian", [](RawFile* r) { r->version = 0x03000000; }, "big-endian"},
      {"huge kv count", [](RawFile* r) { r->n_kv = kHuge; }, "metadata count"},
      {"huge tensor count", [](RawFile* r) { r->n_tensors = kHuge; }, "tensor count"},
      {"kv count + 1", [](RawFile* r) { r->n_kv = r->kvs.size() + 1; }, "bad.gguf"},
      {"tensor count + 1", [](RawFile* r) { r->n_tensors = 3; }, "tensor"},
      {"huge key length",
       [](RawFile* r) { r->kvs[0] = Le<uint64_t>(kHuge) + "general.architecture"; }, "key length"},
      {"key past end", [](RawFile* r) { r->kvs[0] = Le<uint64_t>(60000) + "x"; }, "truncated: key"},
      {"empty key", [](RawFile* r) { r->kvs.push_back(Kv("", 4, Le<uint32_t>(1))); }, "empty key"},
      {"value type 13", [](RawFile* r) { r->kvs.push_back(Kv("k.t", 13, Le<uint32_t>(1))); },
       "'k.t': unknown value type id 13"},
      {"array elem type 99",
       [](RawFile* r) { r->kvs.push_back(Str("k.a") + ArrHeader(99, 1) + Le<uint32_t>(0)); },
       "unknown array element type id 99"},
      {"huge u32 array",
       [](RawFile* r) { r->kvs.push_back(Str("k.a") + ArrHeader(4, kHuge) + Le<uint32_t>(0)); },
       "'k.a': array length"},
      {"huge string array",
       [](RawFile* r) { r->kvs.push_back(Str("k.s") + ArrHeader(8, kHuge) + Str("x")); },
       "'k.s': array length"},
      {"huge nested array", [](RawFile* r) { r->kvs.push_back(Str("k.n") + ArrHeader(9, kHuge)); },
       "array length"},
      {"string array elem past end",
       [](RawFile* r) { r->kvs.push_back(Str("k.s") + ArrHeader(8, 1) + Le<uint64_t>(kHuge)); },
       "'k.s'"},
      {"huge string value",
       [](RawFile* r) { r->kvs.push_back(Kv("k.str", 8, Le<uint64_t>(kHuge) + "abc")); },
       "'k.str': truncated: string value"},
      {"nesting too deep",
       [](RawFile* r) {
         std::string v = Str("k.deep");
         for (int i = 0; i < 9; ++i) v += ArrHeader(9, 1).substr(i ? 4 : 0);
         r->kvs.push_back(v + Le<uint32_t>(4) + Le<uint64_t>(0));
       },
       "nested deeper"},
      {"bool 2", [](RawFile* r) { r->kvs.push_back(Kv("k.b", 7, Le<uint8_t>(2))); },
       "'k.b': bool value 2"},
      {"bool array 5",
       [](RawFile* r) {
         r->kvs.push_back(Str("k.b") + ArrHeader(7, 3) + Le<uint8_t>(1) + Le<uint8_t>(0) +
                          Le<uint8_t>(5));
       },
       "bool array element 2"},
      {"duplicate key", [](RawFile* r) { r->kvs.push_back(r->kvs[0]); },
       "'general.architecture': duplicate key"},
      {"alignment 0", [](RawFile* r) { r->kvs.push_back(Kv("general.alignment", 4, Le(0u))); },
       "alignment 0"},
      {"alignment 48", [](RawFile* r) { r->kvs.push_back(Kv("general.alignment", 4, Le(48u))); },
       "power of two"},
      {"alignment 2^40",
       [](RawFile* r) {
         r->kvs.push_back(Kv("general.alignment", 10, Le<uint64_t>(uint64_t{1} << 40)));
       },
       "power of two"},
      {"alignment -32",
       [](RawFile* r) { r->kvs.push_back(Kv("general.alignment", 5, Le<int32_t>(-32))); },
       "general.alignment"},
      {"alignment string",
       [](RawFile* r) { r->kvs.push_back(Kv("general.alignment", 8, Str("32"))); },
       "'general.alignment': must be an unsigned integer"},
      {"n_dims 0", [](RawFile* r) { r->tensors[1].dims = {}; }, "tensor 'b': n_dims 0"},
      {"n_dims 5",
       [](RawFile* r) {
         r->tensors[0].dims = {8, 2, 1, 1, 1};
       },
       "n_dims 5"},
      {"dim 0",
       [](RawFile* r) {
         r->tensors[0].dims = {8, 0};
       },
       "tensor 'a': dimension ne1"},
      {"dim > int64",
       [](RawFile* r) {
         r->tensors[0].dims = {8, ~uint64_t{0}};
       },
       "out of range"},
      {"element overflow",
       [](RawFile* r) {
         r->tensors[0].dims = {uint64_t{1} << 40, uint64_t{1} << 40};
       },
       "overflows"},
      {"byte overflow", [](RawFile* r) { r->tensors[0].dims = {uint64_t{1} << 62}; },
       "byte size overflows"},
      {"type IQ2_XXS (16)", [](RawFile* r) { r->tensors[1].type = 16; },
       "tensor 'b': unknown or unsupported tensor type id 16"},
      {"type 999", [](RawFile* r) { r->tensors[0].type = 999; }, "type id 999"},
      {"Q8_0 ne0 16",
       [](RawFile* r) {
         r->tensors[1].dims = {16, 2};
       },
       "not a multiple of the Q8_0 block size 32"},
      {"misaligned offset", [](RawFile* r) { r->tensors[1].offset = 68; },
       "tensor 'b': data offset 68 is not a multiple of the alignment 32"},
      {"offset past end", [](RawFile* r) { r->tensors[1].offset = 4096; },
       "tensor 'b': data [4096"},
      {"offset near 2^64", [](RawFile* r) { r->tensors[1].offset = ~uint64_t{31}; },
       "outside the file"},
      {"data cut short", [](RawFile* r) { r->data_bytes = 97; }, "tensor 'b'"},
      {"no data section", [](RawFile* r) { r->data_bytes = 0; }, "outside the file"},
      {"duplicate tensor", [](RawFile* r) { r->tensors[1].name = "a"; },
       "tensor 'a': duplicate tensor name"},
      {"empty tensor name", [](RawFile* r) { r->tensors[1].name = ""; }, "empty tensor name"},
      {"long tensor name", [](RawFile* r) { r->tensors[1].name = std::string(64, 'x'); },
       "tensor name length 64"},
  };
  for (const Case& c : cases) {
    RawFile r;
    c.mutate(&r);
    ExpectMalformed(r.Build(), c.needle, c.what);
  }
}

// The block formats of llama.cpp's presets load with their byte sizes; a
// tensor whose size (from type and shape) disagrees with the file's layout,
// or whose rows are not whole blocks, is rejected naming the tensor.
TEST(GgufMalformed, QuantTypeSizesAreChecked) {
  struct Type {
    uint32_t id;
    uint64_t block_elems, block_bytes;
  };
  for (const Type& t :
       {Type{3, 32, 20}, Type{6, 32, 22}, Type{7, 32, 24}, Type{20, 32, 18}, Type{10, 256, 84},
        Type{11, 256, 110}, Type{13, 256, 176}, Type{23, 256, 136}}) {
    RawFile r;
    r.tensors[1] = {"b", {t.block_elems, 2}, t.id, 64};
    r.data_bytes = 64 + 2 * t.block_bytes;
    const GgufFile f = GgufFile::FromBytes(r.Build());
    EXPECT_EQ(f.RequireTensor("b").n_bytes, 2 * t.block_bytes) << t.id;
    r.data_bytes -= 1;  // one byte short
    ExpectMalformed(r.Build(), "tensor 'b'", "short " + std::to_string(t.id));
    r.data_bytes += 1;
    r.tensors[1].dims = {t.block_elems + 16, 2};  // a partial block per row
    ExpectMalformed(r.Build(), "is not a multiple of the", "partial " + std::to_string(t.id));
  }
  RawFile r;  // a: F32 [8, 2] = 64 bytes, but b starts 32 bytes after it
  r.tensors[1].offset = 32;
  ExpectMalformed(r.Build(),
                  "tensor 'a': byte size 64 of F32 [8, 2] overruns the data of tensor 'b'",
                  "overlap");
}

// A writer-made file with varied metadata and two tensors, the last of which
// ends exactly on the alignment, so that every strict prefix is invalid.
std::vector<uint8_t> SmallValidFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 2);
  w.SetF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.SetBool("flag", true);
  const std::vector<std::string> toks = {"<unk>", "a", "bc"};
  w.Set("tokenizer.ggml.tokens", WriterValue::StringArray(toks));
  const WriterValue inner[] = {WriterValue::I64(-1)};
  const WriterValue outer[] = {WriterValue::Array(ValueType::kI64, inner)};
  w.Set("nested", WriterValue::Array(ValueType::kArray, outer));
  const int64_t d1[] = {32, 1};
  w.AddTensor("q", GgmlType::kQ8_0, d1, std::vector<uint8_t>(34, 3));
  const int64_t d2[] = {8, 4};
  w.AddTensor("f", GgmlType::kF32, d2, std::vector<uint8_t>(128, 5));
  return w.WriteToBytes();
}

TEST(GgufMalformed, EveryTruncationOfASmallFile) {
  const auto full = SmallValidFile();
  const GgufFile ok = GgufFile::FromBytes(full);
  const TensorInfo& last = ok.tensors().back();
  ASSERT_EQ(last.offset + last.n_bytes, full.size());
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<ptrdiff_t>(len));
    try {
      (void)GgufFile::FromBytes(prefix);
      ADD_FAILURE() << "prefix of " << len << " bytes parsed";
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::kMalformedFile) << len << ": " << e.what();
    }
  }
}

TEST(GgufMalformed, EveryTruncationOfRawFileOutsideTrailingPadding) {
  const auto full = RawFile{}.Build();
  const GgufFile ok = GgufFile::FromBytes(full);
  const uint64_t end = ok.RequireTensor("b").offset + 34;  // last byte of real data
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<ptrdiff_t>(len));
    if (len >= end) {
      EXPECT_NO_THROW((void)GgufFile::FromBytes(prefix)) << len;
    } else {
      EXPECT_THROW((void)GgufFile::FromBytes(prefix), Error) << len;
    }
  }
}

TEST(GgufMalformed, TruncatedAndEmptyFilesOnDisk) {
  const std::string path =
      ::testing::TempDir() + "/gguf_malformed_" + std::to_string(::getpid()) + ".gguf";
  const auto full = SmallValidFile();
  for (size_t len : {size_t{0}, size_t{3}, size_t{24}, full.size() / 2, full.size() - 1}) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    if (len) {
      ASSERT_EQ(std::fwrite(full.data(), 1, len, f), len);
    }
    std::fclose(f);
    try {
      (void)GgufFile::Open(path);
      ADD_FAILURE() << len;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  std::remove(path.c_str());
}

// Random byte mutations: either a valid parse (then every view is in range)
// or kMalformedFile; never another exception, never a sanitizer report.
TEST(GgufMalformed, RandomMutations) {
  const auto base = SmallValidFile();
  std::mt19937_64 rng(12345);
  const uint64_t interesting[] = {
      0, 1, 4, 31, 32, 0x7fffffff, 0xffffffff, uint64_t{1} << 32, uint64_t{1} << 63, ~uint64_t{0}};
  int parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto bytes = base;
    const int n_mut = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < n_mut; ++m) {
      const size_t pos = rng() % bytes.size();
      if (rng() % 2 == 0) {
        bytes[pos] = static_cast<uint8_t>(rng());
      } else {
        const uint64_t v = interesting[rng() % std::size(interesting)];
        const size_t width = (rng() % 2) ? 8 : 4;
        std::memcpy(bytes.data() + pos, &v, std::min(width, bytes.size() - pos));
      }
    }
    try {
      const GgufFile f = GgufFile::FromBytes(bytes);
      ++parsed;
      for (const TensorInfo& t : f.tensors()) {
        ASSERT_LE(t.offset + t.n_bytes, f.file_size());
        ASSERT_EQ(t.offset % f.alignment(), 0u);
      }
      for (const auto& e : f.metadata()) (void)e.value.ToString();
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
    }
  }
  EXPECT_GT(parsed, 0);  // some mutations only touch tensor data
}

}  // namespace
}  // namespace meshnet::gguf
