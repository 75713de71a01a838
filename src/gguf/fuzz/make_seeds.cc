// Writes the GGUF fuzz seed corpus: a few tiny valid files made by the writer
// (every tensor type, every metadata type, nested arrays, a non-default
// alignment) plus truncated copies. Usage: gguf_fuzz_seeds OUT_DIR
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"

namespace {

using meshnet::GgmlType;
using meshnet::gguf::GgufWriter;
using meshnet::gguf::ValueType;
using meshnet::gguf::WriterValue;

void Save(const std::string& path, const std::vector<uint8_t>& bytes, size_t len) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, len, f) != len) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

std::vector<uint8_t> Fill(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 37);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  {  // every metadata type
    GgufWriter w;
    w.Set("general.architecture", WriterValue::String("llama"));
    w.Set("a.u8", WriterValue::U8(1));
    w.Set("a.i8", WriterValue::I8(-1));
    w.Set("a.u16", WriterValue::U16(2));
    w.Set("a.i16", WriterValue::I16(-2));
    w.Set("a.u32", WriterValue::U32(3));
    w.Set("a.i32", WriterValue::I32(-3));
    w.Set("a.f32", WriterValue::F32(0.5f));
    w.Set("a.bool", WriterValue::Bool(true));
    w.Set("a.u64", WriterValue::U64(4));
    w.Set("a.i64", WriterValue::I64(-4));
    w.Set("a.f64", WriterValue::F64(0.25));
    const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "a"};
    w.Set("tokenizer.ggml.tokens", WriterValue::StringArray(toks));
    const float scores[] = {0, 0, 0, -1};
    w.Set("tokenizer.ggml.scores", WriterValue::F32Array(scores));
    const int32_t types[] = {2, 3, 3, 1};
    w.Set("tokenizer.ggml.token_type", WriterValue::I32Array(types));
    const WriterValue in[] = {WriterValue::U8(7), WriterValue::U8(8)};
    const WriterValue out[] = {WriterValue::Array(ValueType::kU8, in)};
    w.Set("a.nested", WriterValue::Array(ValueType::kArray, out));
    const int64_t d[] = {4, 2};
    w.AddTensor("t.f32", GgmlType::kF32, d, Fill(32, 1));
    files.emplace_back("metadata", w.WriteToBytes());
  }
  {  // every tensor type, 64-byte alignment
    GgufWriter w(64);
    struct {
      const char* name;
      GgmlType type;
      int64_t ne0;
      size_t bytes;
    } const ts[] = {{"f32", GgmlType::kF32, 2, 8},      {"f16", GgmlType::kF16, 2, 4},
                    {"bf16", GgmlType::kBF16, 2, 4},    {"q8_0", GgmlType::kQ8_0, 32, 34},
                    {"q4_0", GgmlType::kQ4_0, 32, 18},  {"q4_k", GgmlType::kQ4_K, 256, 144},
                    {"q6_k", GgmlType::kQ6_K, 256, 210}};
    uint8_t seed = 0;
    for (const auto& t : ts) {
      const int64_t d[] = {t.ne0};
      w.AddTensor(t.name, t.type, d, Fill(t.bytes, seed++));
    }
    files.emplace_back("types", w.WriteToBytes());
  }
  {  // minimal: no metadata, one tiny tensor, 4-D
    GgufWriter w;
    const int64_t d[] = {1, 1, 1, 2};
    w.AddTensor("x", GgmlType::kF16, d, Fill(4, 9));
    files.emplace_back("minimal", w.WriteToBytes());
  }
  for (const auto& [name, bytes] : files) {
    Save(dir + "/" + name + ".gguf", bytes, bytes.size());
    for (size_t cut : {size_t{4}, size_t{16}, size_t{24}, bytes.size() / 3, bytes.size() / 2,
                       bytes.size() - 1}) {
      Save(dir + "/" + name + "-cut" + std::to_string(cut) + ".gguf", bytes, cut);
    }
  }
  return 0;
}
