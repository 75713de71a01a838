// Q/K/V biases and RoPE frequency factors: what LlamaWeights loads for qwen2
// and Llama 3 style models written by make-model.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "gguf/make_model.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "util/error.h"

namespace meshnet::model {
namespace {

using Arch = CertifiedArchitecture;

gguf::MakeModelOptions Options(const std::string& arch) {
  gguf::MakeModelOptions o;
  o.architecture = arch;
  o.n_embd = 32;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.n_ff = 64;
  o.type = GgmlType::kF32;
  o.rope_base = 500000.0f;
  return o;
}

// The model as bytes, minus the tensor `drop` (if any).
gguf::GgufFile Build(const gguf::MakeModelOptions& o, const std::string& drop = "") {
  static const gguf::GgufFile tok =
      gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf");
  gguf::GgufWriter w;
  gguf::BuildModel(o, tok, &w);
  static std::vector<std::vector<uint8_t>> keep;  // files view these bytes
  keep.push_back(w.WriteToBytes());
  if (drop.empty()) return gguf::GgufFile::FromBytes(keep.back(), "model.gguf");
  const gguf::GgufFile full = gguf::GgufFile::FromBytes(keep.back(), "full.gguf");
  gguf::GgufWriter copy;
  for (const auto& e : full.metadata()) copy.Set(e.key, gguf::WriterValue::From(e.value));
  for (const gguf::TensorInfo& t : full.tensors()) {
    if (t.name == drop) continue;
    copy.AddTensor(t.name, t.type, t.dims(),
                   std::span(static_cast<const uint8_t*>(t.data), t.n_bytes));
  }
  keep.push_back(copy.WriteToBytes());
  return gguf::GgufFile::FromBytes(keep.back(), "dropped.gguf");
}

TEST(Qwen2Weights, BiasesLoadedForEveryOwnedLayer) {
  const auto file = Build(Options("qwen2"));
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  EXPECT_EQ(hp.arch, &CertifiedArchitectureFor("Qwen2ForCausalLM"));
  const LlamaWeights w = LlamaWeights::Load(file, hp, 1, 1);
  const LayerWeights& l = w.layer(1);
  ASSERT_NE(l.bq, nullptr);
  ASSERT_NE(l.bk, nullptr);
  ASSERT_NE(l.bv, nullptr);
  const auto* t = file.FindTensor(Arch::LayerBiasName(1, LayerTensor::kAttnK));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_elements, hp.kv_dim());
  EXPECT_EQ(static_cast<const void*>(l.bk), t->data);
  EXPECT_EQ(w.rope_freqs(), nullptr);
}

TEST(Qwen2Weights, MissingBiasIsRefusedByName) {
  const std::string bias = Arch::LayerBiasName(0, LayerTensor::kAttnV);
  const auto file = Build(Options("qwen2"), bias);
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  try {
    LlamaWeights::Load(file, hp, 0, 1);
    FAIL() << "loaded without " << bias;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile);
    EXPECT_NE(std::string(e.what()).find("'" + bias + "' is missing"), std::string::npos)
        << e.what();
  }
  // Layer 1 alone does not need layer 0's bias.
  EXPECT_NO_THROW(LlamaWeights::Load(file, hp, 1, 1));
}

TEST(Qwen2Weights, LlamaHasNoBiasesAndOptionalRopeFactors) {
  gguf::MakeModelOptions o = Options("llama");
  const auto plain = Build(o);
  const LlamaHParams hp = LlamaHParams::FromGguf(plain);
  const LlamaWeights w = LlamaWeights::Load(plain, hp, 0, 1);
  EXPECT_EQ(w.layer(0).bq, nullptr);
  EXPECT_EQ(w.rope_freqs(), nullptr);

  o.rope_freqs = true;
  const auto with = Build(o);
  const LlamaWeights wf = LlamaWeights::Load(with, hp, 1, 1);  // a middle/tail shard needs them too
  ASSERT_NE(wf.rope_freqs(), nullptr);
  const std::vector<float> want = gguf::Llama3RopeFactors(hp.n_rot, hp.rope_freq_base);
  ASSERT_EQ(static_cast<int>(want.size()), hp.n_rot / 2);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), wf.rope_freqs()));
  // Llama 3.1: high frequencies unscaled, low frequencies divided by 8.
  EXPECT_EQ(want.front(), 1.0f);
  EXPECT_EQ(want.back(), 8.0f);
}

}  // namespace
}  // namespace meshnet::model
