#include "model/weights.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/synthetic_model.h"
#include "util/error.h"

namespace meshnet::model {
namespace {

using Arch = CertifiedArchitecture;

std::string LayerName(int l, LayerTensor t) { return Arch::LayerTensorName(l, t); }

constexpr LayerTensor kAllLayerTensors[] = {
    LayerTensor::kAttnNorm, LayerTensor::kAttnQ,      LayerTensor::kAttnK,
    LayerTensor::kAttnV,    LayerTensor::kAttnOutput, LayerTensor::kFfnNorm,
    LayerTensor::kFfnGate,  LayerTensor::kFfnUp,      LayerTensor::kFfnDown};

std::set<std::string> OwnedNames(const LlamaWeights& w) {
  std::set<std::string> names;
  for (const gguf::TensorInfo* t : w.owned_tensors()) names.insert(t->name);
  return names;
}

std::set<std::string> ExpectedNames(int start, int end, int n_layers, bool has_output) {
  std::set<std::string> names;
  if (start == 0) names.insert(Arch::kTokenEmbedding);
  for (int l = start; l <= end; ++l) {
    for (LayerTensor t : kAllLayerTensors) names.insert(LayerName(l, t));
  }
  if (end == n_layers - 1) {
    names.insert(Arch::kOutputNorm);
    names.insert(has_output ? Arch::kOutput : Arch::kTokenEmbedding);
  }
  return names;
}

using Dims2 = std::pair<int64_t, int64_t>;
Dims2 Dims(const MatrixView& m) { return {m.rows, m.cols}; }

class ShippedWeights : public ::testing::Test {
 protected:
  ShippedWeights()
      : file_(gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL)), hp_(LlamaHParams::FromGguf(file_)) {}
  gguf::GgufFile file_;
  LlamaHParams hp_;
};

TEST_F(ShippedWeights, WholeModelViewsPointIntoTheMapping) {
  const LlamaWeights w = LlamaWeights::Load(file_, hp_, 0, 4);
  EXPECT_TRUE(w.is_head());
  EXPECT_TRUE(w.is_tail());
  EXPECT_FALSE(w.output_tied());
  ASSERT_EQ(w.layers().size(), 5u);
  EXPECT_EQ(w.token_embd().data, file_.RequireTensor(Arch::kTokenEmbedding).data);
  EXPECT_EQ(w.token_embd().rows, 512);
  EXPECT_EQ(w.token_embd().cols, 64);
  EXPECT_EQ(w.output().data, file_.RequireTensor(Arch::kOutput).data);
  EXPECT_EQ(w.output_norm(), file_.RequireTensor(Arch::kOutputNorm).data);
  for (int l = 0; l < 5; ++l) {
    const LayerWeights& lw = w.layer(l);
    EXPECT_EQ(lw.layer, l);
    EXPECT_EQ(lw.attn_norm, file_.RequireTensor(LayerName(l, LayerTensor::kAttnNorm)).data);
    EXPECT_EQ(lw.ffn_norm, file_.RequireTensor(LayerName(l, LayerTensor::kFfnNorm)).data);
    EXPECT_EQ(lw.wk.data, file_.RequireTensor(LayerName(l, LayerTensor::kAttnK)).data);
    EXPECT_EQ(lw.w_down.data, file_.RequireTensor(LayerName(l, LayerTensor::kFfnDown)).data);
    // (rows = outputs, cols = inputs)
    EXPECT_EQ(Dims(lw.wq), Dims2(64, 64));
    EXPECT_EQ(Dims(lw.wk), Dims2(32, 64));
    EXPECT_EQ(Dims(lw.wv), Dims2(32, 64));
    EXPECT_EQ(Dims(lw.wo), Dims2(64, 64));
    EXPECT_EQ(Dims(lw.w_gate), Dims2(172, 64));
    EXPECT_EQ(Dims(lw.w_up), Dims2(172, 64));
    EXPECT_EQ(Dims(lw.w_down), Dims2(64, 172));
    EXPECT_EQ(lw.wq.type, GgmlType::kF32);
  }
  // Every tensor of the file is owned by the whole-model shard, once.
  EXPECT_EQ(w.owned_tensors().size(), file_.tensors().size());
  uint64_t total = 0;
  for (const auto& t : file_.tensors()) total += t.n_bytes;
  EXPECT_EQ(w.owned_bytes(), total);
}

TEST_F(ShippedWeights, ShardsOwnExactlyTheirTensorsAndPartitionTheFile) {
  const std::pair<int, int> ranges[] = {{0, 1}, {2, 2}, {3, 4}};
  std::multiset<std::string> all;
  uint64_t bytes = 0;
  for (auto [s, e] : ranges) {
    const LlamaWeights w = LlamaWeights::Load(file_, hp_, s, e);
    EXPECT_EQ(OwnedNames(w), ExpectedNames(s, e, 5, true)) << s << "-" << e;
    EXPECT_EQ(w.is_head(), s == 0);
    EXPECT_EQ(w.is_tail(), e == 4);
    EXPECT_EQ(w.token_embd().data != nullptr, s == 0);
    EXPECT_EQ(w.output().data != nullptr, e == 4);
    EXPECT_EQ(w.output_norm() != nullptr, e == 4);
    EXPECT_EQ(w.num_layers(), e - s + 1);
    for (const auto& name : OwnedNames(w)) all.insert(name);
    bytes += w.owned_bytes();
  }
  std::multiset<std::string> file_names;
  for (const auto& t : file_.tensors()) file_names.insert(t.name);
  EXPECT_EQ(all, file_names);
  EXPECT_EQ(bytes, file_.file_size() - file_.data_offset());  // F32 tensors need no padding
}

TEST_F(ShippedWeights, LayerAccessorAndRangeErrors) {
  const LlamaWeights w = LlamaWeights::Load(file_, hp_, 2, 3);
  EXPECT_EQ(w.layer(2).layer, 2);
  EXPECT_EQ(w.layer(3).layer, 3);
  for (int bad : {1, 4, -1}) {
    try {
      w.layer(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
  }
  for (auto [s, e] : {std::pair{-1, 1}, std::pair{3, 2}, std::pair{0, 5}}) {
    try {
      LlamaWeights::Load(file_, hp_, s, e);
      ADD_FAILURE() << s << "-" << e;
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument) << err.what();
    }
  }
}

gguf::GgufFile Build(const SyntheticLlamaSpec& spec) {
  return gguf::GgufFile::FromBytes(SyntheticLlamaWriter(spec).WriteToBytes(), "synthetic.gguf");
}

TEST(Weights, TiedOutputAliasesTheEmbedding) {
  SyntheticLlamaSpec spec;
  spec.tie_output = true;
  const auto file = Build(spec);
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  const void* embd = file.RequireTensor(Arch::kTokenEmbedding).data;

  const LlamaWeights tail = LlamaWeights::Load(file, hp, 2, 3);
  EXPECT_TRUE(tail.output_tied());
  EXPECT_EQ(tail.output().data, embd);
  EXPECT_EQ(tail.token_embd().data, nullptr);  // not the head: no embedding lookup
  EXPECT_EQ(OwnedNames(tail), ExpectedNames(2, 3, 4, false));

  const LlamaWeights whole = LlamaWeights::Load(file, hp, 0, 3);
  EXPECT_EQ(whole.output().data, whole.token_embd().data);
  uint64_t total = 0;
  for (const auto& t : file.tensors()) total += t.n_bytes;
  EXPECT_EQ(whole.owned_bytes(), total);  // the shared tensor counts once

  const LlamaWeights head = LlamaWeights::Load(file, hp, 0, 1);
  EXPECT_FALSE(head.output_tied());
  EXPECT_EQ(head.output().data, nullptr);
}

TEST(Weights, QuantizedMatricesKeepTheirType) {
  SyntheticLlamaSpec spec;
  spec.weight_type = GgmlType::kQ8_0;
  const auto file = Build(spec);
  const LlamaWeights w = LlamaWeights::Load(file, LlamaHParams::FromGguf(file), 0, 3);
  EXPECT_EQ(w.layer(1).wq.type, GgmlType::kQ8_0);
  EXPECT_EQ(w.layer(1).w_down.type, GgmlType::kQ8_0);
  EXPECT_EQ(w.token_embd().type, GgmlType::kQ8_0);
  EXPECT_EQ(w.layer(1).w_down.cols, spec.n_ff);
}

// Loads [start, end] of `spec` and expects kMalformedFile mentioning `needles`.
void ExpectLoadRefused(const SyntheticLlamaSpec& spec, int start, int end,
                       std::initializer_list<std::string> needles) {
  const auto file = Build(spec);
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  try {
    LlamaWeights::Load(file, hp, start, end);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << e.what() << "' does not mention '" << needle << "'";
    }
  }
}

TEST(Weights, WrongShapesNameTheTensorAndBothShapes) {
  struct Case {
    std::string tensor;
    std::vector<int64_t> dims;
    std::string expected;
  };
  // Defaults: n_embd 64, 8 heads, 4 KV heads (kv_dim 32), n_ff 128, vocab 300.
  const Case cases[] = {
      {LayerName(1, LayerTensor::kAttnK), {64, 64}, "expected [64, 32]"},
      {LayerName(1, LayerTensor::kAttnV), {32, 64}, "expected [64, 32]"},
      {LayerName(1, LayerTensor::kAttnQ), {64, 32}, "expected [64, 64]"},
      {LayerName(1, LayerTensor::kAttnOutput), {64, 64, 2}, "expected [64, 64]"},
      {LayerName(1, LayerTensor::kFfnGate), {128, 64}, "expected [64, 128]"},
      {LayerName(1, LayerTensor::kFfnUp), {64, 127}, "expected [64, 128]"},
      {LayerName(1, LayerTensor::kFfnDown), {64, 128}, "expected [128, 64]"},
      {LayerName(1, LayerTensor::kAttnNorm), {32}, "expected [64]"},
      {LayerName(1, LayerTensor::kFfnNorm), {64, 2}, "expected [64]"},
      {Arch::kTokenEmbedding, {64, 299}, "expected [64, 300]"},
  };
  for (const Case& c : cases) {
    SyntheticLlamaSpec spec;
    spec.dims_override[c.tensor] = c.dims;
    std::string actual = "[";
    for (size_t i = 0; i < c.dims.size(); ++i) {
      actual += (i ? ", " : "") + std::to_string(c.dims[i]);
    }
    actual += "]";
    SCOPED_TRACE(c.tensor);
    ExpectLoadRefused(spec, 0, 1, {"synthetic.gguf", "'" + c.tensor + "'", c.expected, actual});
  }
  SyntheticLlamaSpec spec;
  spec.dims_override[Arch::kOutput] = {64, 301};
  ExpectLoadRefused(spec, 2, 3, {"'" + std::string(Arch::kOutput) + "'", "[64, 301]"});
}

TEST(Weights, NormsMustBeF32) {
  SyntheticLlamaSpec spec;
  spec.type_override[LayerName(2, LayerTensor::kFfnNorm)] = GgmlType::kF16;
  ExpectLoadRefused(spec, 1, 2, {LayerName(2, LayerTensor::kFfnNorm), "F16", "expected F32"});
  spec.type_override = {{Arch::kOutputNorm, GgmlType::kBF16}};
  ExpectLoadRefused(spec, 3, 3, {Arch::kOutputNorm, "BF16"});
}

TEST(Weights, OnlyOwnedTensorsAreLookedUp) {
  // A file missing layer 0's and the LM head's tensors still serves layers
  // 1-2; the shards that own them name the missing tensor.
  SyntheticLlamaSpec spec;
  spec.omit_tensors = {LayerName(0, LayerTensor::kFfnUp), Arch::kOutputNorm, Arch::kTokenEmbedding};
  const auto file = Build(spec);
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  EXPECT_EQ(OwnedNames(LlamaWeights::Load(file, hp, 1, 2)), ExpectedNames(1, 2, 4, true));
  ExpectLoadRefused(spec, 0, 0, {"'" + std::string(Arch::kTokenEmbedding) + "'", "missing"});
  spec.omit_tensors.erase(Arch::kTokenEmbedding);
  ExpectLoadRefused(spec, 0, 0, {"'" + LayerName(0, LayerTensor::kFfnUp) + "'", "missing"});
  ExpectLoadRefused(spec, 3, 3, {"'" + std::string(Arch::kOutputNorm) + "'", "missing"});
}

// A file whose block_count claims 2^31-1 layers but holds 4: refused with a
// malformed-file error before anything is sized by the claimed count (was:
// std::bad_alloc from reserving 2^31-1 layer slots).
TEST(Weights, DeclaredLayerCountBeyondTheFileIsRefused) {
  SyntheticLlamaSpec spec;
  gguf::GgufWriter w = SyntheticLlamaWriter(spec);
  w.Set(CertifiedArchitectureFor("llama").Key(ArchKey::kBlockCount),
        gguf::WriterValue::U32(2147483647u));
  const auto file = gguf::GgufFile::FromBytes(w.WriteToBytes(), "huge-layers.gguf");
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  ASSERT_EQ(hp.n_layers, 2147483647);
  for (const auto& [start, end] : {std::pair{0, 715827882}, std::pair{1431655765, 2147483646}}) {
    try {
      LlamaWeights::Load(file, hp, start, end);
      ADD_FAILURE() << "accepted layers " << start << "-" << end;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
      EXPECT_NE(std::string(e.what()).find("2147483647 layers"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshnet::model
