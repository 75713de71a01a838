// make-model library: tiny models of every weight type are re-read and
// checked against the registry's names/shapes, the tokenizer they copy and
// the weight statistics they promise; flag validation names the bad flag.
#include "gguf/make_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "ops/quantize.h"
#include "util/error.h"

namespace meshnet::gguf {
namespace {

const std::string kStories = std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf";

MakeModelOptions Tiny(GgmlType type) {
  MakeModelOptions o;
  const bool k_quant = GgmlTypeInfoOf(type).block_elems == 256;
  o.n_embd = k_quant ? 256 : 64;
  o.n_ff = k_quant ? 512 : 128;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.type = type;
  o.seed = 7;
  o.context = 256;
  o.rope_base = 5000.0f;
  return o;
}

std::vector<uint8_t> Build(const MakeModelOptions& o, const GgufFile& tok,
                           MakeModelSummary* summary = nullptr) {
  GgufWriter w;
  const MakeModelSummary s = BuildModel(o, tok, &w);
  if (summary) *summary = s;
  return w.WriteToBytes();
}

// Mean and standard deviation of a dequantized tensor.
void Stats(const TensorInfo& t, double* mean, double* sd) {
  std::vector<float> row(static_cast<size_t>(t.ne[0]));
  double s = 0, s2 = 0;
  for (int64_t r = 0; r < t.rows(); ++r) {
    ops::DequantizeRow(t.type, static_cast<const uint8_t*>(t.data) + r * t.row_bytes(), t.ne[0],
                       row.data());
    for (float x : row) {
      ASSERT_TRUE(std::isfinite(x)) << t.name;
      s += x;
      s2 += static_cast<double>(x) * x;
    }
  }
  const double n = static_cast<double>(t.n_elements);
  *mean = s / n;
  *sd = std::sqrt(s2 / n - *mean * *mean);
}

class MakeModelTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MakeModelTypes, ReReadsWithRegistryNamesAndSaneWeights) {
  const GgufFile tok = GgufFile::Open(kStories);
  const MakeModelOptions o = Tiny(GetParam());
  MakeModelSummary summary;
  const GgufFile f = GgufFile::FromBytes(Build(o, tok, &summary), "tiny.gguf");
  const auto& arch = CertifiedArchitectureFor(f.RequireString(gguf_keys::kArchitecture));
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kEmbeddingLength)), o.n_embd);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kBlockCount)), 2u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kFeedForwardLength)), o.n_ff);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kHeadCount)), 4u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kHeadCountKv)), 2u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kContextLength)), 256u);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kRopeDimensionCount)), o.n_embd / 4);
  EXPECT_EQ(f.RequireF32(arch.Key(ArchKey::kRopeFreqBase)), 5000.0f);
  EXPECT_EQ(f.RequireF32(arch.Key(ArchKey::kRmsEpsilon)), 1e-5f);
  EXPECT_EQ(f.RequireU32(arch.Key(ArchKey::kVocabSize)), 512u);

  // Every tokenizer.* key is copied verbatim.
  int copied = 0;
  for (const auto& e : tok.metadata()) {
    if (!e.key.starts_with("tokenizer.")) continue;
    const MetadataValue* v = f.Find(e.key);
    ASSERT_NE(v, nullptr) << e.key;
    EXPECT_EQ(v->ToString(1 << 20), e.value.ToString(1 << 20)) << e.key;
    ++copied;
  }
  EXPECT_GE(copied, 6);

  const int64_t vocab = 512, head_dim = o.n_embd / 4, kv = head_dim * 2;
  ASSERT_EQ(f.tensors().size(), 3u + 9u * 2);
  EXPECT_EQ(summary.n_tensors, 21);
  EXPECT_EQ(summary.vocab_size, vocab);
  int64_t n_params = 0;
  for (const auto& t : f.tensors()) n_params += t.n_elements;
  EXPECT_EQ(summary.n_params, n_params);

  auto expect = [&](const std::string& name, GgmlType type, int64_t ne0, int64_t ne1) {
    const TensorInfo& t = f.RequireTensor(name);
    EXPECT_EQ(t.type, type) << name;
    EXPECT_EQ(t.ne[0], ne0) << name;
    EXPECT_EQ(t.n_dims == 1 ? 1 : t.ne[1], ne1) << name;
  };
  expect(CertifiedArchitecture::kTokenEmbedding, o.type, o.n_embd, vocab);
  expect(CertifiedArchitecture::kOutputNorm, GgmlType::kF32, o.n_embd, 1);
  expect(CertifiedArchitecture::kOutput, o.type, o.n_embd, vocab);
  for (int l = 0; l < 2; ++l) {
    auto n = [l](LayerTensor t) { return CertifiedArchitecture::LayerTensorName(l, t); };
    expect(n(LayerTensor::kAttnNorm), GgmlType::kF32, o.n_embd, 1);
    expect(n(LayerTensor::kAttnQ), o.type, o.n_embd, o.n_embd);
    expect(n(LayerTensor::kAttnK), o.type, o.n_embd, kv);
    expect(n(LayerTensor::kAttnV), o.type, o.n_embd, kv);
    expect(n(LayerTensor::kAttnOutput), o.type, o.n_embd, o.n_embd);
    expect(n(LayerTensor::kFfnNorm), GgmlType::kF32, o.n_embd, 1);
    expect(n(LayerTensor::kFfnGate), o.type, o.n_embd, o.n_ff);
    expect(n(LayerTensor::kFfnUp), o.type, o.n_embd, o.n_ff);
    expect(n(LayerTensor::kFfnDown), o.type, o.n_ff, o.n_embd);
  }

  // Norms are ones; matrices are N(0, (scale / sqrt(fan_in))^2).
  const TensorInfo& norm = f.RequireTensor(CertifiedArchitecture::kOutputNorm);
  for (int64_t i = 0; i < norm.n_elements; ++i) {
    ASSERT_EQ(static_cast<const float*>(norm.data)[i], 1.0f);
  }
  const double residual = 1.0 / std::sqrt(4.0);
  const struct {
    std::string name;
    double expected_sd;
  } checks[] = {
      {CertifiedArchitecture::kTokenEmbedding, 1.0 / std::sqrt(o.n_embd)},
      {CertifiedArchitecture::LayerTensorName(1, LayerTensor::kAttnQ), 1.0 / std::sqrt(o.n_embd)},
      {CertifiedArchitecture::LayerTensorName(0, LayerTensor::kAttnOutput),
       residual / std::sqrt(o.n_embd)},
      {CertifiedArchitecture::LayerTensorName(0, LayerTensor::kFfnDown),
       residual / std::sqrt(o.n_ff)},
  };
  // Low-bit types add quantization noise; the spread still tracks the target.
  const double tol = (o.type == GgmlType::kQ4_0 || o.type == GgmlType::kQ4_K) ? 0.15 : 0.06;
  for (const auto& c : checks) {
    double mean = 0, sd = 0;
    Stats(f.RequireTensor(c.name), &mean, &sd);
    EXPECT_NEAR(sd / c.expected_sd, 1.0, tol) << c.name;
    EXPECT_LT(std::abs(mean), 0.1 * c.expected_sd) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MakeModelTypes,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K,
                                           GgmlType::kQ6_K),
                         [](const auto& info) {
                           return std::string(GgmlTypeInfoOf(info.param).name);
                         });

TEST(MakeModel, DeterministicInSeedAndF32Embedding) {
  const GgufFile tok = GgufFile::Open(kStories);
  MakeModelOptions o = Tiny(GgmlType::kQ8_0);
  const auto a = Build(o, tok);
  EXPECT_EQ(Build(o, tok), a);
  o.seed = 8;
  const auto b = Build(o, tok);
  ASSERT_EQ(b.size(), a.size());
  EXPECT_NE(b, a);
  o.embedding_type = GgmlType::kF32;
  const GgufFile f = GgufFile::FromBytes(Build(o, tok));
  EXPECT_EQ(f.RequireTensor(CertifiedArchitecture::kTokenEmbedding).type, GgmlType::kF32);
  EXPECT_EQ(f.RequireTensor(CertifiedArchitecture::kOutput).type, GgmlType::kQ8_0);
}

TEST(MakeModel, WritesFileThatReopens) {
  const std::string path =
      ::testing::TempDir() + "/make_model_test_" + std::to_string(::getpid()) + ".gguf";
  const MakeModelSummary s = MakeModel(Tiny(GgmlType::kF16), kStories, path);
  const GgufFile f = GgufFile::Open(path);
  EXPECT_EQ(s.file_bytes, f.file_size());
  EXPECT_EQ(f.tensors().size(), 21u);
  std::remove(path.c_str());
}

void ExpectInvalid(const MakeModelOptions& o, const std::string& needle) {
  try {
    ValidateMakeModelOptions(o);
    ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MakeModel, ValidatesFlags) {
  const MakeModelOptions base = Tiny(GgmlType::kQ8_0);
  EXPECT_NO_THROW(ValidateMakeModelOptions(base));
  MakeModelOptions o = base;
  o.n_heads = 3;
  o.n_kv_heads = 3;
  ExpectInvalid(o, "not divisible by --n-heads");
  o = base;
  o.n_kv_heads = 3;
  ExpectInvalid(o, "--n-kv-heads");
  o = base;
  o.n_embd = 48;  // 48 % 32 != 0
  o.n_heads = 4;
  ExpectInvalid(o, "--n-embd 48 is not a multiple of the Q8_0 block size 32");
  o = base;
  o.n_ff = 172;
  ExpectInvalid(o, "--n-ff 172");
  o = Tiny(GgmlType::kF32);
  o.type = GgmlType::kQ6_K;  // n_embd 64 < 256
  ExpectInvalid(o, "Q6_K block size 256");
  o = base;
  o.n_layers = 0;
  ExpectInvalid(o, "--n-layers 0");
  o = base;
  o.n_heads = 64;  // head_dim 1
  o.n_kv_heads = 64;
  ExpectInvalid(o, "must be even");
  o = base;
  o.rope_base = -1.0f;
  ExpectInvalid(o, "--rope-base");
  o = base;
  o.context = 0;
  ExpectInvalid(o, "--context");
  o = base;
  o.architecture = "gpt2";
  EXPECT_THROW(ValidateMakeModelOptions(o), Error);
  // A tokenizer file without tokens is refused.
  GgufWriter empty;
  const GgufFile no_tok = GgufFile::FromBytes(empty.WriteToBytes(), "empty.gguf");
  GgufWriter w;
  EXPECT_THROW(BuildModel(base, no_tok, &w), Error);
}

}  // namespace
}  // namespace meshnet::gguf
