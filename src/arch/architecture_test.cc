#include "arch/architecture.h"

#include <gtest/gtest.h>

#include "util/error.h"

namespace meshnet {
namespace {

TEST(Architecture, AliasResolvesToSameObject) {
  EXPECT_EQ(&CertifiedArchitectureFor("llama"), &CertifiedArchitectureFor("LlamaForCausalLM"));
  EXPECT_EQ(&CertifiedArchitectureFor("mistral"), &CertifiedArchitectureFor("MistralForCausalLM"));
  EXPECT_NE(&CertifiedArchitectureFor("llama"), &CertifiedArchitectureFor("mistral"));
}

TEST(Architecture, FieldsOfLlama) {
  const auto& a = CertifiedArchitectureFor("LlamaForCausalLM");
  EXPECT_EQ(a.adapter, "llama");
  EXPECT_EQ(a.boundary_schema_version, 1);
  EXPECT_EQ(a.boundary_tensor_name, "residual");
  EXPECT_TRUE(a.prunes_rows_at_tail);
  EXPECT_TRUE(a.normalizes_before_head);
  EXPECT_EQ(a.Key(ArchKey::kHeadCountKv), "llama.attention.head_count_kv");
  EXPECT_EQ(CertifiedArchitecture::LayerTensorName(3, LayerTensor::kAttnQ), "blk.3.attn_q.weight");
}

TEST(Architecture, FieldsOfQwen2) {
  const auto& a = CertifiedArchitectureFor("Qwen2ForCausalLM");
  EXPECT_EQ(&a, &CertifiedArchitectureFor("qwen2"));
  EXPECT_NE(&a, &CertifiedArchitectureFor("llama"));
  EXPECT_EQ(a.adapter, "qwen2");
  EXPECT_EQ(a.gguf_arch, "qwen2");
  EXPECT_EQ(a.boundary_schema_version, 1);
  EXPECT_EQ(a.boundary_tensor_name, "residual");
  EXPECT_TRUE(a.prunes_rows_at_tail);
  EXPECT_TRUE(a.normalizes_before_head);
  EXPECT_EQ(a.rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(a.qkv_bias);
  EXPECT_EQ(CertifiedArchitectureFor("llama").rope_style, RopeStyle::kNormal);
  EXPECT_FALSE(CertifiedArchitectureFor("llama").qkv_bias);
  EXPECT_EQ(a.Key(ArchKey::kRopeFreqBase), "qwen2.rope.freq_base");
  EXPECT_EQ(CertifiedArchitecture::LayerBiasName(2, LayerTensor::kAttnK), "blk.2.attn_k.bias");
}

TEST(Architecture, UnknownFailsClosed) {
  for (const char* bad : {"gpt2", "", "Llama", "llama "}) {
    try {
      CertifiedArchitectureFor(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBoundaryContract);
      EXPECT_NE(std::string(e.what()).find("not certified"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace meshnet
