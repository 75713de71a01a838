// `meshnet inspect` rendering: header fields, abbreviated arrays, and one
// table row per tensor carrying the reader's type, shape, size and offset.
#include "gguf/describe.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "gguf/gguf_writer.h"

namespace meshnet::gguf {
namespace {

TEST(GgufDescribe, Stories) {
  const GgufFile f = GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf");
  DescribeOptions o;
  o.max_array_elems = 3;
  const std::string text = DescribeGguf(f, o);
  EXPECT_NE(text.find("GGUF v3"), std::string::npos);
  EXPECT_NE(text.find("metadata (19 keys)"), std::string::npos) << text;
  EXPECT_NE(text.find("array[string; 512]  = [\"<unk>\", \"<s>\", \"</s>\", ... (512 total)]"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("= 1e-05\n"), std::string::npos) << text;  // rms eps, shortest form
  EXPECT_NE(text.find("tensors (48,"), std::string::npos) << text;
  // Exactly one row per tensor, with the reader's values in order.
  std::istringstream in(text);
  std::string line;
  size_t rows = 0;
  while (std::getline(in, line)) {
    std::istringstream cols(line);
    std::string name, type, shape_or_more;
    cols >> name >> type;
    const TensorInfo* t = f.FindTensor(name);
    if (!t) continue;
    ++rows;
    EXPECT_EQ(type, "F32") << line;
    const size_t at = line.find(t->ShapeString());
    ASSERT_NE(at, std::string::npos) << line;
    std::istringstream rest(line.substr(at + t->ShapeString().size()));
    uint64_t bytes = 0, offset = 0;
    rest >> bytes >> offset;
    EXPECT_EQ(bytes, t->n_bytes) << line;
    EXPECT_EQ(offset, t->offset) << line;
  }
  EXPECT_EQ(rows, 48u);
  o.tensors = false;
  EXPECT_EQ(DescribeGguf(f, o).find("token_embd.weight"), std::string::npos);
}

TEST(GgufDescribe, NestedAndEmpty) {
  GgufWriter w;
  const WriterValue in[] = {WriterValue::U8(1), WriterValue::U8(2)};
  const WriterValue out[] = {WriterValue::Array(ValueType::kU8, in)};
  w.Set("n", WriterValue::Array(ValueType::kArray, out));
  w.Set("s", WriterValue::String("tab\there"));
  const std::string text = DescribeGguf(GgufFile::FromBytes(w.WriteToBytes(), "mem"));
  EXPECT_NE(text.find("array[array; 1]  = [[1, 2]]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"tab\\x09here\""), std::string::npos) << text;
  EXPECT_NE(text.find("tensors (0,"), std::string::npos) << text;
}

}  // namespace
}  // namespace meshnet::gguf
