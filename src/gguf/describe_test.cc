// `meshnet inspect` rendering: header fields, abbreviated arrays, and one
// table row per tensor carrying the reader's type, shape, size and offset.
#include "gguf/describe.h"

#include <gtest/gtest.h>

#include <span>
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

// True when `text` is well-formed UTF-8 with no control character other
// than '\n' (C0, DEL and the C1 range U+0080..U+009F): safe on a terminal.
bool TerminalSafe(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n') || c == 0x7f) return false;
      ++i;
      continue;
    }
    const int n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    }
    if (c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) return false;  // C1
    i += n;
  }
  return true;
}

// Keys, string values and tensor names carrying terminal escapes (ESC, OSC,
// a raw C1 CSI), invalid UTF-8 and DEL are printed escaped; valid UTF-8 text
// stays as it is.
TEST(GgufDescribe, FileContentIsEscapedEverywhere) {
  GgufWriter w;
  w.Set("evil.\x1b[2J\x1b]0;pwned\x07.key", WriterValue::String("v\xc2\x9b"
                                                                "31m\xff\xfe"));
  w.Set("caf\xc3\xa9", WriterValue::String("na\xc3\xafve \x7f"));
  const WriterValue names[] = {WriterValue::String("\x1b[31mred"), WriterValue::String("\x9b")};
  w.Set("arr", WriterValue::Array(ValueType::kString, names));
  const float data[2] = {1.0f, 2.0f};
  const int64_t dims[] = {2};
  w.AddTensor("blk.0.\x1b[8m\xc0\x80", GgmlType::kF32, dims, std::span<const float>(data));
  const std::string text = DescribeGguf(GgufFile::FromBytes(w.WriteToBytes(), "mem\x1b[1m"));
  EXPECT_TRUE(TerminalSafe(text)) << text;
  for (const char* shown : {"evil.\\x1b[2J\\x1b]0;pwned\\x07.key", "\"v\\xc2\\x9b31m\\xff\\xfe\"",
                            "caf\xc3\xa9", "\"na\xc3\xafve \\x7f\"", "\\x1b[31mred", "\\x9b",
                            "blk.0.\\x1b[8m\\xc0\\x80", "mem\\x1b[1m"}) {
    EXPECT_NE(text.find(shown), std::string::npos) << shown << "\n" << text;
  }
}

}  // namespace
}  // namespace meshnet::gguf
