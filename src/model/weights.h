// LlamaWeights: zero-copy views of the tensors ONE shard owns, inside a mapped
// GGUF file.
//
// Contract:
//  - Load() looks up only the owned tensors by their registry names: the token
//    embedding for the head (start_layer == 0), the final norm and the LM head
//    for the tail (end_layer == n_layers - 1; a missing output.weight is tied
//    to token_embd.weight), the nine per-layer tensors of each owned layer,
//    the Q/K/V biases (required when the architecture says qkv_bias, else
//    loaded when present) and rope_freqs.weight when present.
//    It checks each one's type (norms F32) and shape against the hparams and
//    throws Error(kMalformedFile) naming the tensor, the expected and the actual
//    shape, or Error(kInvalidArgument) for a bad layer range.
//  - Loading reads only the tensor table (parsed when the file was opened),
//    never tensor data: pages are faulted in lazily by the first kernel that
//    reads them, and other layers' data is never touched. Prefetch() asks the
//    kernel to read the owned tensors ahead (madvise WILLNEED) when a warm start
//    matters more than a lazy one.
//  - Views point into the GgufFile's mapping: the file must outlive the
//    weights (moving the GgufFile keeps them valid).
//
// Matrix convention (GGML): a GGUF tensor with ne0 = row length is stored row
// major; MatrixView.cols = ne0 (inputs) and rows = ne1 (outputs), so y = W x
// computes y[r] = dot(row r, x). Every row is RowBytes(type, cols) bytes.
//
// Thread-safety: immutable after Load(); safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/hparams.h"
#include "ops/ggml_type.h"

namespace meshnet::gguf {
class GgufFile;
struct TensorInfo;
}  // namespace meshnet::gguf

namespace meshnet::model {

// An ops-style weight matrix: `rows` rows of `cols` elements of `type`.
struct MatrixView {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct LayerWeights {
  int layer = -1;                    // absolute layer index
  const float* attn_norm = nullptr;  // (n_embd)
  MatrixView wq;                     // (n_embd, n_embd): rows = q_dim, cols = n_embd
  MatrixView wk;                     // (kv_dim, n_embd)
  MatrixView wv;                     // (kv_dim, n_embd)
  const float* bq = nullptr;         // (q_dim) Q bias, or nullptr (qwen2: required)
  const float* bk = nullptr;         // (kv_dim)
  const float* bv = nullptr;         // (kv_dim)
  MatrixView wo;                     // (n_embd, q_dim)
  const float* ffn_norm = nullptr;   // (n_embd)
  MatrixView w_gate;                 // (n_ff, n_embd)
  MatrixView w_up;                   // (n_ff, n_embd)
  MatrixView w_down;                 // (n_embd, n_ff)
};

class LlamaWeights {
 public:
  // end_layer is inclusive. See the contract above.
  static LlamaWeights Load(const gguf::GgufFile& file, const LlamaHParams& hparams, int start_layer,
                           int end_layer);

  int start_layer() const { return start_layer_; }
  int end_layer() const { return end_layer_; }
  int num_layers() const { return end_layer_ - start_layer_ + 1; }
  bool is_head() const { return is_head_; }  // owns the token embedding
  bool is_tail() const { return is_tail_; }  // owns the final norm and LM head

  // Head only (nullptr-data view otherwise): (vocab_size, n_embd).
  const MatrixView& token_embd() const { return token_embd_; }
  // Tail only: (n_embd) and (vocab_size, n_embd).
  const float* output_norm() const { return output_norm_; }
  const MatrixView& output() const { return output_; }
  bool output_tied() const { return output_tied_; }  // output aliases token_embd.weight
  // Llama 3 RoPE frequency factors (n_rot / 2), or nullptr when the file has none.
  const float* rope_freqs() const { return rope_freqs_; }

  // Layer `layer` (absolute index in [start_layer, end_layer]); throws
  // Error(kInvalidArgument) otherwise.
  const LayerWeights& layer(int layer) const;
  std::span<const LayerWeights> layers() const { return layers_; }

  // Bytes of every distinct owned tensor (a tied LM head counts once).
  uint64_t owned_bytes() const { return owned_bytes_; }
  // The distinct owned tensors, in load order (for tests and `inspect`).
  const std::vector<const gguf::TensorInfo*>& owned_tensors() const { return owned_; }

  // Hints the kernel to read every owned tensor ahead (madvise WILLNEED).
  void Prefetch() const;

 private:
  const gguf::GgufFile* file_ = nullptr;
  int start_layer_ = 0;
  int end_layer_ = -1;
  bool is_head_ = false;
  bool is_tail_ = false;
  bool output_tied_ = false;
  MatrixView token_embd_;
  const float* output_norm_ = nullptr;
  const float* rope_freqs_ = nullptr;
  MatrixView output_;
  std::vector<LayerWeights> layers_;
  std::vector<const gguf::TensorInfo*> owned_;
  uint64_t owned_bytes_ = 0;
};

}  // namespace meshnet::model
