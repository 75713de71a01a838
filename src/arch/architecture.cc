#include "arch/architecture.h"

#include <string>

#include "util/error.h"

namespace meshnet {

namespace {

const char* KeySuffix(ArchKey key) {
  switch (key) {
    case ArchKey::kContextLength:
      return "context_length";
    case ArchKey::kEmbeddingLength:
      return "embedding_length";
    case ArchKey::kBlockCount:
      return "block_count";
    case ArchKey::kFeedForwardLength:
      return "feed_forward_length";
    case ArchKey::kHeadCount:
      return "attention.head_count";
    case ArchKey::kHeadCountKv:
      return "attention.head_count_kv";
    case ArchKey::kRmsEpsilon:
      return "attention.layer_norm_rms_epsilon";
    case ArchKey::kRopeFreqBase:
      return "rope.freq_base";
    case ArchKey::kRopeDimensionCount:
      return "rope.dimension_count";
    case ArchKey::kVocabSize:
      return "vocab_size";
  }
  return "";
}

const char* LayerTensorStem(LayerTensor t) {
  switch (t) {
    case LayerTensor::kAttnNorm:
      return "attn_norm";
    case LayerTensor::kAttnQ:
      return "attn_q";
    case LayerTensor::kAttnK:
      return "attn_k";
    case LayerTensor::kAttnV:
      return "attn_v";
    case LayerTensor::kAttnOutput:
      return "attn_output";
    case LayerTensor::kFfnNorm:
      return "ffn_norm";
    case LayerTensor::kFfnGate:
      return "ffn_gate";
    case LayerTensor::kFfnUp:
      return "ffn_up";
    case LayerTensor::kFfnDown:
      return "ffn_down";
  }
  return "";
}

}  // namespace

std::string CertifiedArchitecture::Key(ArchKey key) const {
  return gguf_arch + "." + KeySuffix(key);
}

std::string CertifiedArchitecture::LayerTensorName(int layer, LayerTensor t) {
  return "blk." + std::to_string(layer) + "." + LayerTensorStem(t) + ".weight";
}

std::string CertifiedArchitecture::LayerBiasName(int layer, LayerTensor t) {
  return "blk." + std::to_string(layer) + "." + LayerTensorStem(t) + ".bias";
}

const std::vector<CertifiedArchitecture>& CertifiedArchitectures() {
  static const std::vector<CertifiedArchitecture> kTable = {
      {"llama", {"LlamaForCausalLM"}, "llama", kBoundarySchemaVersion, "residual", true, true},
      {"mistral",
       {"MistralForCausalLM"},
       "mistral",
       kBoundarySchemaVersion,
       "residual",
       true,
       true},
      // Qwen2 / Qwen2.5 (and DeepSeek-R1 Qwen distills): Llama blocks with
      // Q/K/V biases and NeoX RoPE; output tied or untied.
      {"qwen2",
       {"Qwen2ForCausalLM"},
       "qwen2",
       kBoundarySchemaVersion,
       "residual",
       true,
       true,
       RopeStyle::kNeox,
       /*qkv_bias=*/true},
  };
  return kTable;
}

const CertifiedArchitecture* FindCertifiedArchitecture(std::string_view name) {
  for (const auto& arch : CertifiedArchitectures()) {
    if (arch.adapter == name) return &arch;
    for (const auto& alias : arch.aliases) {
      if (alias == name) return &arch;
    }
  }
  return nullptr;
}

const CertifiedArchitecture& CertifiedArchitectureFor(std::string_view name) {
  if (const auto* arch = FindCertifiedArchitecture(name)) return *arch;
  std::string known;
  for (const auto& arch : CertifiedArchitectures()) {
    known += (known.empty() ? "" : ", ") + arch.adapter;
    for (const auto& alias : arch.aliases) known += ", " + alias;
  }
  throw Error(ErrorKind::kBoundaryContract,
              "architecture '" + std::string(name) + "' is not certified (known: " + known + ")");
}

}  // namespace meshnet
