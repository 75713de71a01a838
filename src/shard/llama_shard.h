// LlamaShard: the computation of one shard's owned layers of a Llama-family
// model (the reference's "pinned worker"), on weights memory-mapped from GGUF.
//
// The forward pass reads top to bottom (llama2.c style):
//   head:  Embed(ids) -> hidden                                  // (n, n_embd)
//   every owned layer l:
//     xb = rmsnorm(hidden) ; q,k,v = xb Wq, xb Wk, xb Wv ; rope(q, k)
//     write k, v into the step's reserved KV rows
//     att = causal GQA attention of q over positions [0, start+n) ; hidden += att Wo
//     xb = rmsnorm(hidden) ; hidden += (silu(xb Wgate) * (xb Wup)) Wdown
//   tail:  Logits(last row) = final rmsnorm -> LM head          // (vocab)
//
// Scratch buffers live in Workspaces checked out from a small pool (a lock is
// held only to pop/push the free list, never across a kernel). A workspace
// grows only when a step has more tokens than any before it, so decode steps
// never allocate.
//
// Thread-safety: const methods are safe to call concurrently (each call
// checks out its own workspace).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "kv/hot_kv_state.h"
#include "kv/recipe.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "ops/matmul.h"
#include "ops/nn.h"
#include "shard/boundary.h"
#include "util/mutex.h"

namespace meshnet {
class ThreadPool;
}

namespace meshnet::shard {

// One session's rows in a batched forward pass: `n` consecutive rows of the
// stacked hidden state at positions start .. start+n-1 of `step`'s session
// (whose K/V rows for them are reserved by the step).
struct BatchSlice {
  const kv::KvStep* step = nullptr;
  int64_t start = 0;
  int64_t n = 0;
};

class LlamaShard {
 public:
  // Loads the owned layers [start_layer, end_layer] (inclusive) of `file`.
  // `pool` (may be null: single-threaded) must outlive the shard.
  // `ggml_parity`: compute RMSNorm, RoPE, SwiGLU and attention in the
  // arithmetic of llama.cpp's CPU backend (ops/nn.h), for bit-level parity
  // with its greedy text; needs an F16 KV cache; slower.
  LlamaShard(std::shared_ptr<const gguf::GgufFile> file, int start_layer, int end_layer,
             ThreadPool* pool, bool ggml_parity = false);
  ~LlamaShard();

  const model::LlamaHParams& hparams() const { return hparams_; }
  const model::LlamaWeights& weights() const { return weights_; }
  const CertifiedArchitecture& arch() const { return *hparams_.arch; }
  const ShardRole& role() const { return role_; }
  const gguf::GgufFile& file() const { return *file_; }
  ThreadPool* pool() const { return pool_; }  // may be null
  kv::KvCacheRecipe MakeRecipe(KvDtype kv_dtype) const;

  // Head only: hidden (n, n_embd) = embedding rows of ids. Throws
  // kInvalidArgument for an id outside the vocabulary.
  void Embed(std::span<const int32_t> ids, float* hidden) const;
  // Runs the owned layers over hidden (n_tokens, n_embd) in place, at positions
  // step.start_pos() .. +n_tokens, writing K/V into the step's reserved rows.
  // Checks shard::StepCancelled() between layers and between chunks of
  // kPrefillChunk positions; throws Error(kUnavailable) when cancelled (the
  // caller does not commit the step).
  void Forward(float* hidden, int64_t n_tokens, const kv::KvStep& step) const;
  static constexpr int64_t kPrefillChunk = 256;
  // The batched forward pass over the stacked rows of several sessions:
  // hidden (sum of slices' n, n_embd), slice after slice. The matmuls run over
  // all rows at once; RoPE, the K/V stores and attention run per slice against
  // that slice's own KV. Row for row the same bits as Forward of each slice
  // alone (the kernels are batch invariant, ops/matmul.h). Does not check
  // StepCancelled (the caller decides per session between batches); the
  // total rows must be >= 1. No error paths.
  void ForwardBatch(float* hidden, std::span<const BatchSlice> slices) const;
  // Tail only: logits (vocab) of one residual row (n_embd): final norm + LM head.
  void Logits(const float* hidden_row, float* logits) const;
  // Tail only: logits (n, vocab) of n residual rows (n, n_embd), as one matmul.
  void LogitsRows(const float* hidden_rows, int64_t n, float* logits) const;

 private:
  struct Workspace;
  // The owned layers over `n` stacked rows split into `slices`; stops before
  // a layer when `check_cancel` and StepCancelled().
  void ForwardRows(float* hidden, int64_t n, std::span<const BatchSlice> slices,
                   bool check_cancel) const;
  void Attend(Workspace& ws, const model::LayerWeights& lw,
              std::span<const BatchSlice> slices) const;
  ops::RopeConfig RopeCfg() const;
  void SwiGluRows(Workspace& ws, int64_t n) const;
  void RotateAndStore(Workspace& ws, size_t i) const;
  void RopeTable(Workspace& ws, std::span<const BatchSlice> slices) const;
  // The matrices this shard multiplies by (its layers', and the tail's output).
  std::vector<const model::MatrixView*> MatMulOperands() const;
  // m as a matmul operand, with its packed layout when it has one.
  ops::WeightMatrix Matrix(const model::MatrixView& m) const;
  // Packs the matrices ops::PackWeights has a layout for (not in ggml parity
  // mode, whose matmuls read the GGUF layout).
  void PackMatrices();
  std::unique_ptr<Workspace> Acquire(int64_t n_tokens) const;
  void Return(std::unique_ptr<Workspace> ws) const;

  std::shared_ptr<const gguf::GgufFile> file_;
  model::LlamaHParams hparams_;
  model::LlamaWeights weights_;
  ShardRole role_;
  ThreadPool* pool_;
  bool ggml_parity_;
  std::vector<std::pair<GgmlType, int64_t>> matmul_shapes_;
  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  // Packed copies of matrices, keyed by their GGUF data (immutable after
  // construction). Their GGUF pages are then not read again.
  std::vector<std::unique_ptr<uint8_t[], FreeAligned>> packed_store_;
  std::unordered_map<const void*, const void*> packed_;
  mutable Mutex ws_mu_;
  mutable std::vector<std::unique_ptr<Workspace>> free_ws_ GUARDED_BY(ws_mu_);
};

}  // namespace meshnet::shard
