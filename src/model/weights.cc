// Owned-tensor lookup and validation. Only TensorInfo records (the parsed
// tensor table) are read here; a data pointer is stored, never dereferenced.
#include "model/weights.h"

#include <cstdint>
#include <string>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "util/error.h"

namespace meshnet::model {

namespace {

std::string Shape2(int64_t ne0, int64_t ne1) {
  return "[" + std::to_string(ne0) + ", " + std::to_string(ne1) + "]";
}

class Loader {
 public:
  Loader(const gguf::GgufFile& file, std::vector<const gguf::TensorInfo*>& owned,
         uint64_t& owned_bytes)
      : file_(file), owned_(owned), owned_bytes_(owned_bytes) {}

  const gguf::TensorInfo& Require(const std::string& name) {
    const gguf::TensorInfo* t = file_.FindTensor(name);
    if (t == nullptr) Fail(name, "is missing");
    return *t;
  }

  // An F32 vector of n elements.
  const float* Norm(const std::string& name, int64_t n) {
    const gguf::TensorInfo& t = Require(name);
    if (t.type != GgmlType::kF32) {
      Fail(name, "has type " + std::string(GgmlTypeInfoOf(t.type).name) + ", expected F32");
    }
    if (t.ne[0] != n || t.n_elements != n) {
      Fail(name, "has shape " + t.ShapeString() + ", expected [" + std::to_string(n) + "]");
    }
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(float) != 0) {
      Fail(name, "data is not 4-byte aligned");
    }
    Own(t);
    return static_cast<const float*>(t.data);
  }

  // Norm() when `required` or when the tensor exists; nullptr otherwise.
  const float* OptionalVector(const std::string& name, int64_t n, bool required) {
    if (!required && file_.FindTensor(name) == nullptr) return nullptr;
    return Norm(name, n);
  }

  // A matrix with GGUF shape [ne0, ne1] of any supported type. `meaning`
  // spells the expected shape in hparams terms for the error message.
  MatrixView Matrix(const std::string& name, int64_t ne0, int64_t ne1, const char* meaning) {
    const gguf::TensorInfo& t = Require(name);
    if (t.ne[0] != ne0 || t.ne[1] != ne1 || t.n_elements != ne0 * ne1) {
      Fail(name, "has shape " + t.ShapeString() + ", expected " + Shape2(ne0, ne1) + " (" +
                     meaning + ")");
    }
    Own(t);
    return MatrixView{t.type, t.data, ne1, ne0};
  }

 private:
  [[noreturn]] void Fail(const std::string& name, const std::string& what) {
    throw Error(ErrorKind::kMalformedFile, file_.name() + ": tensor '" + name + "' " + what);
  }
  void Own(const gguf::TensorInfo& t) {
    for (const gguf::TensorInfo* o : owned_) {
      if (o == &t) return;
    }
    owned_.push_back(&t);
    owned_bytes_ += t.n_bytes;
  }

  const gguf::GgufFile& file_;
  std::vector<const gguf::TensorInfo*>& owned_;
  uint64_t& owned_bytes_;
};

LayerWeights LoadLayer(Loader& load, const LlamaHParams& hp, int l) {
  auto name = [l](LayerTensor t) { return CertifiedArchitecture::LayerTensorName(l, t); };
  auto bias = [l](LayerTensor t) { return CertifiedArchitecture::LayerBiasName(l, t); };
  const int64_t n_embd = hp.n_embd;
  const int64_t q_dim = hp.q_dim();
  const int64_t kv_dim = hp.kv_dim();
  const int64_t n_ff = hp.n_ff;
  LayerWeights lw;
  lw.layer = l;
  lw.attn_norm = load.Norm(name(LayerTensor::kAttnNorm), n_embd);
  lw.wq = load.Matrix(name(LayerTensor::kAttnQ), n_embd, q_dim, "ne0 = n_embd, ne1 = n_embd");
  lw.wk = load.Matrix(name(LayerTensor::kAttnK), n_embd, kv_dim,
                      "ne0 = n_embd, ne1 = n_kv_heads * head_dim");
  lw.wv = load.Matrix(name(LayerTensor::kAttnV), n_embd, kv_dim,
                      "ne0 = n_embd, ne1 = n_kv_heads * head_dim");
  const bool need_bias = hp.arch->qkv_bias;
  lw.bq = load.OptionalVector(bias(LayerTensor::kAttnQ), q_dim, need_bias);
  lw.bk = load.OptionalVector(bias(LayerTensor::kAttnK), kv_dim, need_bias);
  lw.bv = load.OptionalVector(bias(LayerTensor::kAttnV), kv_dim, need_bias);
  lw.wo = load.Matrix(name(LayerTensor::kAttnOutput), q_dim, n_embd, "ne0 = n_embd, ne1 = n_embd");
  lw.ffn_norm = load.Norm(name(LayerTensor::kFfnNorm), n_embd);
  lw.w_gate = load.Matrix(name(LayerTensor::kFfnGate), n_embd, n_ff, "ne0 = n_embd, ne1 = n_ff");
  lw.w_up = load.Matrix(name(LayerTensor::kFfnUp), n_embd, n_ff, "ne0 = n_embd, ne1 = n_ff");
  lw.w_down = load.Matrix(name(LayerTensor::kFfnDown), n_ff, n_embd, "ne0 = n_ff, ne1 = n_embd");
  return lw;
}

}  // namespace

LlamaWeights LlamaWeights::Load(const gguf::GgufFile& file, const LlamaHParams& hp, int start_layer,
                                int end_layer) {
  hp.Validate();
  hp.ValidateLayerRange(start_layer, end_layer);
  LlamaWeights w;
  w.file_ = &file;
  w.start_layer_ = start_layer;
  w.end_layer_ = end_layer;
  w.is_head_ = start_layer == 0;
  w.is_tail_ = end_layer == hp.n_layers - 1;
  Loader load(file, w.owned_, w.owned_bytes_);

  const int64_t n_embd = hp.n_embd;
  const int64_t vocab = hp.vocab_size;
  if (w.is_head_) {
    w.token_embd_ = load.Matrix(CertifiedArchitecture::kTokenEmbedding, n_embd, vocab,
                                "ne0 = n_embd, ne1 = vocab_size");
  }
  // Every layer holds several tensors: a count the file cannot back is a lie
  // (a huge block_count), refused before anything is sized by it.
  const int64_t n_owned = int64_t{end_layer} - start_layer + 1;
  if (n_owned > static_cast<int64_t>(file.tensors().size())) {
    throw Error(ErrorKind::kMalformedFile,
                file.name() + ": the model declares " + std::to_string(hp.n_layers) +
                    " layers (layers " + std::to_string(start_layer) + "-" +
                    std::to_string(end_layer) + " asked for) but the file holds only " +
                    std::to_string(file.tensors().size()) + " tensors");
  }
  w.layers_.reserve(static_cast<size_t>(n_owned));
  for (int l = start_layer; l <= end_layer; ++l) w.layers_.push_back(LoadLayer(load, hp, l));
  // Llama 3 RoPE factors: every shard rotates its own layers' Q and K.
  w.rope_freqs_ = load.OptionalVector(CertifiedArchitecture::kRopeFreqs, hp.n_rot / 2, false);
  if (w.is_tail_) {
    w.output_norm_ = load.Norm(CertifiedArchitecture::kOutputNorm, n_embd);
    if (file.FindTensor(CertifiedArchitecture::kOutput) != nullptr) {
      w.output_ = load.Matrix(CertifiedArchitecture::kOutput, n_embd, vocab,
                              "ne0 = n_embd, ne1 = vocab_size");
    } else {
      w.output_tied_ = true;
      w.output_ = load.Matrix(CertifiedArchitecture::kTokenEmbedding, n_embd, vocab,
                              "ne0 = n_embd, ne1 = vocab_size (tied LM head)");
    }
  }
  return w;
}

const LayerWeights& LlamaWeights::layer(int layer) const {
  if (layer < start_layer_ || layer > end_layer_) {
    ThrowInvalidArgument("layer " + std::to_string(layer) + " is not owned by this shard (" +
                         std::to_string(start_layer_) + "-" + std::to_string(end_layer_) + ")");
  }
  return layers_[static_cast<size_t>(layer - start_layer_)];
}

void LlamaWeights::Prefetch() const {
  if (file_ == nullptr) return;
  for (const gguf::TensorInfo* t : owned_) file_->WillNeed(*t);
}

}  // namespace meshnet::model
