// Writer round trips: every metadata value type (nested arrays too), every
// tensor type, alignments, file output; and the writer's own validation.
#include "gguf/gguf_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "util/error.h"

namespace meshnet::gguf {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(GgufWriter, AllMetadataTypesRoundTrip) {
  GgufWriter w;
  w.Set("t.u8", WriterValue::U8(255));
  w.Set("t.i8", WriterValue::I8(-128));
  w.Set("t.u16", WriterValue::U16(65535));
  w.Set("t.i16", WriterValue::I16(-32768));
  w.Set("t.u32", WriterValue::U32(4000000000u));
  w.Set("t.i32", WriterValue::I32(std::numeric_limits<int32_t>::min()));
  w.Set("t.f32", WriterValue::F32(1.5f));
  w.Set("t.bool", WriterValue::Bool(false));
  w.Set("t.str", WriterValue::String(std::string("a\0b", 3)));
  w.Set("t.empty", WriterValue::String(""));
  w.Set("t.u64", WriterValue::U64(~uint64_t{0}));
  w.Set("t.i64", WriterValue::I64(std::numeric_limits<int64_t>::min()));
  w.Set("t.f64", WriterValue::F64(-2.125));
  const std::vector<std::string> strs = {"x", "", "zz"};
  w.Set("a.str", WriterValue::StringArray(strs));
  const float fl[] = {0.5f, -1.0f};
  w.Set("a.f32", WriterValue::F32Array(fl));
  const WriterValue bools[] = {WriterValue::Bool(true), WriterValue::Bool(false)};
  w.Set("a.bool", WriterValue::Array(ValueType::kBool, bools));
  const WriterValue inner1[] = {WriterValue::I16(-3), WriterValue::I16(4)};
  const WriterValue inner2[] = {WriterValue::I16(5)};
  const WriterValue outer[] = {WriterValue::Array(ValueType::kI16, inner1),
                               WriterValue::Array(ValueType::kI16, inner2),
                               WriterValue::Array(ValueType::kI16, {})};
  w.Set("a.nested", WriterValue::Array(ValueType::kArray, outer));
  w.Set("a.empty", WriterValue::Array(ValueType::kU8, {}));
  w.Set("t.u8", WriterValue::U8(254));  // replaces in place, keeps the order

  const auto bytes = w.WriteToBytes();
  const GgufFile f = GgufFile::FromBytes(bytes);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 18u);  // 13 scalars + 5 arrays
  EXPECT_EQ(f.metadata()[0].key, "t.u8");
  EXPECT_EQ(f.RequireU32("t.u8"), 254u);
  EXPECT_EQ(f.RequireI32("t.i8"), -128);
  EXPECT_EQ(f.RequireU32("t.u16"), 65535u);
  EXPECT_EQ(f.RequireI32("t.i16"), -32768);
  EXPECT_EQ(f.RequireU32("t.u32"), 4000000000u);
  EXPECT_EQ(f.RequireI32("t.i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f.RequireF32("t.f32"), 1.5f);
  EXPECT_FALSE(f.RequireBool("t.bool"));
  EXPECT_EQ(f.RequireString("t.str"), std::string_view("a\0b", 3));
  EXPECT_EQ(f.RequireString("t.empty"), "");
  EXPECT_EQ(f.RequireU64("t.u64"), ~uint64_t{0});
  EXPECT_EQ(f.RequireI64("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.Find("t.f64")->AsDouble(), -2.125);
  for (const auto& e : f.metadata()) {
    EXPECT_EQ(e.value.is_array(), e.key.starts_with("a.")) << e.key;
  }
  EXPECT_EQ(f.Find("t.u16")->type(), ValueType::kU16);
  EXPECT_EQ(f.Find("t.f64")->type(), ValueType::kF64);

  const auto s = f.RequireStringArray("a.str");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], "x");
  EXPECT_EQ(s[1], "");
  EXPECT_EQ(s[2], "zz");
  EXPECT_EQ(f.RequireF32Array("a.f32"), (std::vector<float>{0.5f, -1.0f}));
  const MetadataValue* b = f.Find("a.bool");
  ASSERT_EQ(b->array_size(), 2u);
  EXPECT_EQ(b->ArrayElement(0).AsBool(), true);
  EXPECT_EQ(b->ArrayElement(1).AsBool(), false);
  const MetadataValue* n = f.Find("a.nested");
  ASSERT_TRUE(n->is_array());
  EXPECT_EQ(n->array_type(), ValueType::kArray);
  ASSERT_EQ(n->array_size(), 3u);
  EXPECT_EQ(n->ArrayElement(0).array_type(), ValueType::kI16);
  EXPECT_EQ(n->ArrayElement(0).ArrayElement(0).AsInt64(), -3);
  EXPECT_EQ(n->ArrayElement(0).ArrayElement(1).AsInt64(), 4);
  EXPECT_EQ(n->ArrayElement(1).ArrayElement(0).AsInt64(), 5);
  EXPECT_EQ(n->ArrayElement(2).array_size(), 0u);
  EXPECT_EQ(n->ToString(), "[[-3, 4], [5], []]");
  EXPECT_EQ(f.Find("a.empty")->array_size(), 0u);

  // Copying every value through WriterValue::From reproduces the file exactly.
  GgufWriter copy;
  for (const auto& e : f.metadata()) copy.Set(e.key, WriterValue::From(e.value));
  EXPECT_EQ(copy.WriteToBytes(), bytes);
}

struct TypeCase {
  GgmlType type;
  int64_t ne0;
};

TEST(GgufWriter, EveryTensorTypeRoundTrips) {
  const TypeCase cases[] = {{GgmlType::kF32, 3},   {GgmlType::kF16, 5},   {GgmlType::kBF16, 7},
                            {GgmlType::kQ8_0, 64}, {GgmlType::kQ4_0, 32}, {GgmlType::kQ4_K, 256},
                            {GgmlType::kQ6_K, 512}};
  for (uint32_t alignment : {1u, 32u, 64u, 4096u}) {
    GgufWriter w(alignment);
    std::vector<std::vector<uint8_t>> datas;
    int i = 0;
    for (const auto& c : cases) {
      const int64_t dims[] = {c.ne0, 3, 2};
      const GgmlTypeInfo info = GgmlTypeInfoOf(c.type);
      const uint64_t n = static_cast<uint64_t>(c.ne0 * 6 / info.block_elems * info.block_bytes);
      EXPECT_EQ(GgufWriter::TensorBytes(c.type, dims), n);
      datas.push_back(RandomBytes(n, static_cast<uint32_t>(i)));
      w.AddTensor("tensor." + std::string(info.name), c.type, dims, datas.back());
      ++i;
    }
    const float one[] = {1.0f};
    const int64_t one_dim[] = {1};
    w.AddTensor("scalar", GgmlType::kF32, one_dim, std::span<const float>(one));
    const GgufFile f = GgufFile::FromBytes(w.WriteToBytes());
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.Has("general.alignment"), alignment != 32u);
    ASSERT_EQ(f.tensors().size(), std::size(cases) + 1);
    for (size_t k = 0; k < std::size(cases); ++k) {
      const TensorInfo& t = f.tensors()[k];
      EXPECT_EQ(t.type, cases[k].type);
      EXPECT_EQ(t.n_dims, 3);
      EXPECT_EQ(t.ne[0], cases[k].ne0);
      EXPECT_EQ(t.ne[1], 3);
      EXPECT_EQ(t.ne[2], 2);
      EXPECT_EQ(t.n_elements, cases[k].ne0 * 6);
      EXPECT_EQ(t.rows(), 6);
      EXPECT_EQ(t.offset % alignment, 0u);
      ASSERT_EQ(t.n_bytes, datas[k].size());
      EXPECT_EQ(std::memcmp(t.data, datas[k].data(), t.n_bytes), 0) << t.name;
    }
    float scalar = 0;  // with alignment 1 the data may be misaligned for a float load
    std::memcpy(&scalar, f.RequireTensor("scalar").data, 4);
    EXPECT_EQ(scalar, 1.0f);
  }
}

TEST(GgufWriter, WriteFileAndOpen) {
  const std::string path =
      ::testing::TempDir() + "/gguf_writer_test_" + std::to_string(::getpid()) + ".gguf";
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  const int64_t dims[] = {32, 4};
  int calls = 0;
  w.AddTensor("gen", GgmlType::kQ8_0, dims, [&calls](std::span<uint8_t> dst) {
    ++calls;
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>(i * 7);
  });
  w.WriteFile(path);
  EXPECT_EQ(calls, 1);
  {
    GgufFile f = GgufFile::Open(path);
    EXPECT_EQ(f.RequireString("general.architecture"), "llama");
    const TensorInfo& t = f.RequireTensor("gen");
    ASSERT_EQ(t.n_bytes, 4u * 34);
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (size_t i = 0; i < t.n_bytes; ++i) ASSERT_EQ(p[i], static_cast<uint8_t>(i * 7));
    // Moving the file keeps views valid.
    const void* data = t.data;
    GgufFile moved = std::move(f);
    EXPECT_EQ(moved.RequireTensor("gen").data, data);
    EXPECT_EQ(moved.RequireString("general.architecture"), "llama");
  }
  EXPECT_NE(::access((path + ".tmp").c_str(), F_OK), 0);  // no temp file left behind
  std::remove(path.c_str());
  EXPECT_THROW(w.WriteFile("/nonexistent-dir/x.gguf"), Error);
}

TEST(GgufWriter, RejectsInvalidInput) {
  EXPECT_THROW(GgufWriter(0), Error);
  EXPECT_THROW(GgufWriter(48), Error);
  GgufWriter w;
  const int64_t ok[] = {32, 2};
  const int64_t bad_block[] = {16, 2};
  const int64_t zero[] = {32, 0};
  const int64_t five[] = {1, 1, 1, 1, 1};
  const std::vector<uint8_t> data(68);
  auto expect_invalid = [](auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  };
  w.AddTensor("a", GgmlType::kQ8_0, ok, data);
  expect_invalid([&] { w.AddTensor("a", GgmlType::kQ8_0, ok, data); });  // duplicate
  expect_invalid([&] { w.AddTensor("b", GgmlType::kQ8_0, bad_block, data); });
  expect_invalid([&] { w.AddTensor("c", GgmlType::kQ8_0, zero, data); });
  expect_invalid([&] { w.AddTensor("d", GgmlType::kF32, five, data); });
  expect_invalid([&] { w.AddTensor("e", GgmlType::kQ8_0, ok, std::vector<uint8_t>(67)); });
  expect_invalid([&] { w.AddTensor("", GgmlType::kQ8_0, ok, data); });
  expect_invalid([&] { w.AddTensor(std::string(64, 'n'), GgmlType::kQ8_0, ok, data); });
  expect_invalid([&] { w.Set("", WriterValue::U8(1)); });
  expect_invalid([&] { w.Set("general.alignment", WriterValue::U32(64)); });  // writer has 32
  expect_invalid([&] { w.Set("general.alignment", WriterValue::U64(32)); });
  w.Set("general.alignment", WriterValue::U32(32));
  const WriterValue mixed[] = {WriterValue::U8(1), WriterValue::I8(1)};
  expect_invalid([&] { (void)WriterValue::Array(ValueType::kU8, mixed); });
  EXPECT_EQ(GgufFile::FromBytes(w.WriteToBytes()).tensors().size(), 1u);
}

}  // namespace
}  // namespace meshnet::gguf
