// Reader tests against the shipped stories260K.gguf (values from
// models/README.md) and the typed-getter conversion rules.
#include "gguf/gguf_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <string>

#include "arch/architecture.h"
#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace meshnet::gguf {
namespace {

const std::string kStories = std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf";

template <typename F>
std::string MalformedMessage(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(GgufStories, HeaderAndHyperParameters) {
  const GgufFile f = GgufFile::Open(kStories);
  EXPECT_EQ(f.file_size(), 1185376u);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  const auto& arch = CertifiedArchitectureFor(f.RequireString(gguf_keys::kArchitecture));
  EXPECT_EQ(arch.gguf_arch, "llama");
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kEmbeddingLength)), 64u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kFeedForwardLength)), 172u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kBlockCount)), 5u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kHeadCount)), 8u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kHeadCountKv)), 4u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kRopeDimensionCount)), 8u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kContextLength)), 512u);
  EXPECT_NEAR(f.RequireF32(arch.Key(ArchKey::kRmsEpsilon)), 1e-5f, 1e-9f);
  EXPECT_FALSE(f.Has(arch.Key(ArchKey::kRopeFreqBase)));
  EXPECT_FLOAT_EQ(f.GetF32(arch.Key(ArchKey::kRopeFreqBase), 10000.0f), 10000.0f);
  // Integer getters accept any integer type that fits.
  EXPECT_EQ(f.RequireI64(arch.Key(ArchKey::kBlockCount)), 5);
  EXPECT_EQ(f.RequireU64(arch.Key(ArchKey::kBlockCount)), 5u);
}

TEST(GgufStories, Tokenizer) {
  const GgufFile f = GgufFile::Open(kStories);
  EXPECT_EQ(f.RequireString(gguf_keys::kTokenizerModel), "llama");
  EXPECT_EQ(f.RequireU32(gguf_keys::kBosId), 1u);
  EXPECT_EQ(f.RequireU32(gguf_keys::kEosId), 2u);
  EXPECT_EQ(f.RequireU32(gguf_keys::kUnknownId), 0u);
  const auto tokens = f.RequireStringArray(gguf_keys::kTokens);
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[432], ",");                  // README: ',' is id 432
  EXPECT_EQ(tokens[383], "\xe2\x96\x81there");  // README: ' there' is id 383 (SentencePiece '▁')
  EXPECT_EQ(f.RequireF32Array(gguf_keys::kScores).size(), 512u);
  const auto types = f.RequireI32Array(gguf_keys::kTokenType);
  ASSERT_EQ(types.size(), 512u);
  EXPECT_EQ(types[0], 2);  // unknown
  EXPECT_EQ(types[1], 3);  // control
  // Wrong-typed array access is an error naming the key.
  const std::string msg = MalformedMessage([&] { (void)f.RequireF32Array(gguf_keys::kTokens); });
  EXPECT_NE(msg.find(gguf_keys::kTokens), std::string::npos) << msg;
}

TEST(GgufStories, TensorTable) {
  const GgufFile f = GgufFile::Open(kStories);
  ASSERT_EQ(f.tensors().size(), 48u);
  uint64_t total = 0;
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
    EXPECT_EQ(t.n_bytes, static_cast<uint64_t>(t.n_elements) * 4) << t.name;
    EXPECT_EQ((t.offset - f.data_offset()) % f.alignment(), 0u) << t.name;
    EXPECT_LE(t.offset + t.n_bytes, f.file_size()) << t.name;
    EXPECT_EQ(f.FindTensor(t.name), &t);
    total += static_cast<uint64_t>(t.n_elements);
  }
  // README: about 0.29 M parameters counting `output` twice.
  EXPECT_GT(total, 280000u);
  EXPECT_LT(total, 300000u);

  const TensorInfo& emb = f.RequireTensor(CertifiedArchitecture::kTokenEmbedding);
  EXPECT_EQ(emb.ShapeString(), "[64, 512]");
  EXPECT_EQ(emb.rows(), 512);
  EXPECT_EQ(emb.row_bytes(), 64u * 4);
  const TensorInfo& out = f.RequireTensor(CertifiedArchitecture::kOutput);
  ASSERT_EQ(out.n_bytes, emb.n_bytes);
  // README: output is a copy of the token embedding.
  EXPECT_EQ(std::memcmp(out.data, emb.data, emb.n_bytes), 0);
  EXPECT_EQ(f.RequireTensor(CertifiedArchitecture::kOutputNorm).ShapeString(), "[64]");
  for (int layer = 0; layer < 5; ++layer) {
    using LT = LayerTensor;
    auto shape = [&](LT t) {
      return f.RequireTensor(CertifiedArchitecture::LayerTensorName(layer, t)).ShapeString();
    };
    EXPECT_EQ(shape(LT::kAttnNorm), "[64]");
    EXPECT_EQ(shape(LT::kAttnQ), "[64, 64]");
    EXPECT_EQ(shape(LT::kAttnK), "[64, 32]");  // 4 KV heads * head_dim 8
    EXPECT_EQ(shape(LT::kAttnV), "[64, 32]");
    EXPECT_EQ(shape(LT::kAttnOutput), "[64, 64]");
    EXPECT_EQ(shape(LT::kFfnNorm), "[64]");
    EXPECT_EQ(shape(LT::kFfnGate), "[64, 172]");
    EXPECT_EQ(shape(LT::kFfnUp), "[64, 172]");
    EXPECT_EQ(shape(LT::kFfnDown), "[172, 64]");
  }
  // Norm weights of a trained model are finite and not all zero.
  const TensorInfo& norm = f.RequireTensor(CertifiedArchitecture::kOutputNorm);
  const float* w = static_cast<const float*>(norm.data);
  bool any_nonzero = false;
  for (int i = 0; i < 64; ++i) {
    EXPECT_TRUE(std::isfinite(w[i]));
    any_nonzero |= w[i] != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  f.WillNeed(norm);  // a hint; must not fail

  const std::string msg = MalformedMessage([&] { (void)f.RequireTensor("blk.9.attn_q.weight"); });
  EXPECT_NE(msg.find("blk.9.attn_q.weight"), std::string::npos) << msg;
  EXPECT_EQ(f.FindTensor("nope"), nullptr);
}

TEST(GgufStories, OpenErrors) {
  try {
    GgufFile::Open("/nonexistent/x.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.gguf"), std::string::npos);
  }
  // A directory is not a GGUF file.
  EXPECT_THROW(GgufFile::Open(MESHNET_SOURCE_DIR), Error);
}

// A FIFO is refused at once, not waited on for a writer (which would block
// the caller, and with it signal handling, forever).
TEST(GgufStories, FifoIsRefusedWithoutBlocking) {
  char dir[] = "/tmp/meshnet-fifo-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/model.gguf";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto opened = std::async(std::launch::async, [&] {
    try {
      GgufFile::Open(fifo);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  if (opened.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // Unblock the reader so the test can end, then fail.
    const int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
    opened.wait();
    ADD_FAILURE() << "GgufFile::Open blocked on a FIFO";
  } else {
    EXPECT_NE(opened.get().find("not a regular file"), std::string::npos);
  }
  unlink(fifo.c_str());
  rmdir(dir);
}

GgufFile GetterFile() {
  GgufWriter w;
  w.Set("u8", WriterValue::U8(200));
  w.Set("i8", WriterValue::I8(-5));
  w.Set("i32.neg", WriterValue::I32(-1));
  w.Set("i32.pos", WriterValue::I32(7));
  w.Set("u64.big", WriterValue::U64(uint64_t{1} << 40));
  w.Set("u64.max", WriterValue::U64(~uint64_t{0}));
  w.Set("f64", WriterValue::F64(0.25));
  w.Set("bool", WriterValue::Bool(true));
  w.Set("str", WriterValue::String("hello"));
  const int32_t ints[] = {1, -2, 3};
  w.Set("ints", WriterValue::I32Array(ints));
  const WriterValue bigs[] = {WriterValue::U64(1), WriterValue::U64(uint64_t{1} << 33)};
  w.Set("bigs", WriterValue::Array(ValueType::kU64, bigs));
  const auto bytes = w.WriteToBytes();
  return GgufFile::FromBytes(bytes, "getters.gguf");
}

TEST(GgufGetters, IntegerConversions) {
  const GgufFile f = GetterFile();
  EXPECT_EQ(f.RequireU32("u8"), 200u);
  EXPECT_EQ(f.RequireI32("u8"), 200);
  EXPECT_EQ(f.RequireI32("i8"), -5);
  EXPECT_EQ(f.RequireI64("i8"), -5);
  EXPECT_EQ(f.RequireU32("i32.pos"), 7u);
  EXPECT_EQ(f.RequireU64("u64.big"), uint64_t{1} << 40);
  EXPECT_EQ(f.RequireU64("u64.max"), ~uint64_t{0});
  // Values that do not fit are errors naming the key, not silent truncation.
  for (const char* bad : {"i8", "i32.neg"}) {
    const std::string m = MalformedMessage([&] { (void)f.RequireU32(bad); });
    EXPECT_NE(m.find(bad), std::string::npos) << m;
  }
  MalformedMessage([&] { (void)f.RequireU32("u64.big"); });
  MalformedMessage([&] { (void)f.RequireI32("u64.big"); });
  MalformedMessage([&] { (void)f.RequireI64("u64.max"); });
  MalformedMessage([&] { (void)f.GetU32("str"); });
  MalformedMessage([&] { (void)f.GetU32("f64"); });
  MalformedMessage([&] { (void)f.GetU32("ints"); });
}

TEST(GgufGetters, DefaultsAndRequired) {
  const GgufFile f = GetterFile();
  EXPECT_FALSE(f.GetU32("absent").has_value());
  EXPECT_EQ(f.GetU32("absent", 42u), 42u);
  EXPECT_EQ(f.GetString("absent", "dflt"), "dflt");
  EXPECT_EQ(f.GetU32("i32.pos", 42u), 7u);
  const std::string m = MalformedMessage([&] { (void)f.RequireString("absent.key"); });
  EXPECT_NE(m.find("absent.key"), std::string::npos) << m;
  EXPECT_NE(m.find("getters.gguf"), std::string::npos) << m;
  // A present key of the wrong type does not fall back to the default.
  MalformedMessage([&] { (void)f.GetString("u8", "x"); });
  MalformedMessage([&] { (void)f.GetBool("u8", false); });
  EXPECT_TRUE(f.RequireBool("bool"));
  EXPECT_FLOAT_EQ(f.RequireF32("f64"), 0.25f);
  EXPECT_FLOAT_EQ(f.RequireF32("u8"), 200.0f);  // integers convert to float
  EXPECT_EQ(f.RequireString("str"), "hello");
}

TEST(GgufGetters, Arrays) {
  const GgufFile f = GetterFile();
  EXPECT_EQ(f.RequireI32Array("ints"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(*f.GetI64Array("bigs"), (std::vector<int64_t>{1, int64_t{1} << 33}));
  const std::string m = MalformedMessage([&] { (void)f.RequireI32Array("bigs"); });
  EXPECT_NE(m.find("element 1"), std::string::npos) << m;
  MalformedMessage([&] { (void)f.GetStringArray("ints"); });
  MalformedMessage([&] { (void)f.GetF32Array("ints"); });
  MalformedMessage([&] { (void)f.GetI32Array("str"); });  // not an array
  EXPECT_FALSE(f.GetStringArray("absent").has_value());
  MalformedMessage([&] { (void)f.RequireStringArray("absent"); });
}

TEST(GgufGetters, ToStringAbbreviatesArrays) {
  const GgufFile f = GgufFile::Open(kStories);
  const std::string s = f.Find(gguf_keys::kTokens)->ToString(3);
  EXPECT_EQ(s, "[\"<unk>\", \"<s>\", \"</s>\", ... (512 total)]");
  EXPECT_EQ(f.Find(gguf_keys::kBosId)->ToString(), "1");
}

}  // namespace
}  // namespace meshnet::gguf
