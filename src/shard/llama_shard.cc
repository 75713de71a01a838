#include "shard/llama_shard.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <span>
#include <string>

#include "ops/matmul.h"
#include "ops/nn.h"
#include "ops/quantize.h"
#include "shard/step_cancel.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace meshnet::shard {

// Scratch of one in-flight step; sized for `capacity` tokens.
struct LlamaShard::Workspace {
  int64_t capacity = 0;
  std::vector<float> xb;                // (n, n_embd)   normed input of a sublayer
  std::vector<float> q;                 // (n, q_dim)
  std::vector<float> k;                 // (n, kv_dim)
  std::vector<float> v;                 // (n, kv_dim)
  std::vector<float> att;               // (n, q_dim)    attention output, pre-Wo
  std::vector<float> proj;              // (n, n_embd)   Wo / Wdown output
  std::vector<float> gate;              // (n, n_ff)
  std::vector<float> up;                // (n, n_ff)
  std::vector<uint8_t> mm;              // MatMul scratch (activation quantization)
  std::vector<float> rope_cs, rope_sn;  // (n, n_rot / 2) each: the rows' RoPE cos and sin
  std::vector<ops::PagedKvLayer> kv;    // per slice: its KV view of the current layer
  std::vector<ops::AttentionSeq> seqs;  // per slice: its attention arguments

  void ReserveSlices(size_t n) {
    if (kv.size() >= n) return;
    kv.resize(std::max(n, kv.size() * 2));
    seqs.resize(kv.size());
  }

  void Reserve(const model::LlamaHParams& hp, int64_t n) {
    if (n <= capacity) return;
    capacity = std::max<int64_t>(n, capacity * 2);
    const size_t c = static_cast<size_t>(capacity);
    xb.resize(c * hp.n_embd);
    q.resize(c * hp.q_dim());
    k.resize(c * hp.kv_dim());
    v.resize(c * hp.kv_dim());
    att.resize(c * hp.q_dim());
    proj.resize(c * hp.n_embd);
    gate.resize(c * hp.n_ff);
    up.resize(c * hp.n_ff);
    rope_cs.resize(c * (hp.n_rot / 2));
    rope_sn.resize(c * (hp.n_rot / 2));
  }
};

namespace {
// MatMul, or in ggml_parity mode ggml's arithmetic where ops has it.
void Mm(bool ggml_parity, const ops::WeightMatrix& w, const float* x, int64_t n, float* y,
        void* scratch, ThreadPool* pool) {
  if (ggml_parity && ops::MatMulGgmlSupports(w.type)) return ops::MatMulGgml(w, x, n, y, pool);
  ops::MatMul(w, x, n, y, scratch, pool);
}

// Matrices of the same input x (Q, K and V; gate and up): one MatMulMany (the
// activations prepared once, one parallel job), or in ggml_parity mode one
// Mm each.
void MmMany(bool ggml_parity, std::initializer_list<ops::WeightMatrix> ws, const float* x,
            int64_t n, std::initializer_list<float*> ys, void* scratch, ThreadPool* pool) {
  const ops::WeightMatrix* w[ops::kMaxMany];
  float* y[ops::kMaxMany];
  size_t k = 0;
  for (const ops::WeightMatrix& m : ws) w[k++] = &m;
  k = 0;
  for (float* o : ys) y[k++] = o;
  if (ggml_parity) {
    for (size_t i = 0; i < k; ++i) Mm(true, *w[i], x, n, y[i], scratch, pool);
    return;
  }
  ops::MatMulMany(std::span(w, k), x, n, std::span(y, k), scratch, pool);
}

// y (n, dim) += bias (dim) per row; nothing when the layer has no bias.
void AddBias(float* y, const float* bias, int64_t n, int64_t dim) {
  if (bias == nullptr) return;
  for (int64_t t = 0; t < n; ++t) ops::Add(y + t * dim, bias, dim, y + t * dim);
}
}  // namespace

LlamaShard::LlamaShard(std::shared_ptr<const gguf::GgufFile> file, int start_layer, int end_layer,
                       ThreadPool* pool, bool ggml_parity)
    : file_(std::move(file)),
      hparams_(model::LlamaHParams::FromGguf(*file_)),
      weights_(model::LlamaWeights::Load(*file_, hparams_, start_layer, end_layer)),
      role_(RoleForRange(start_layer, end_layer, hparams_.n_layers)),
      pool_(pool),
      ggml_parity_(ggml_parity) {
  // The (type, row length) of every matrix this shard multiplies: MatMul
  // scratch is sized for the largest of them.
  for (const model::MatrixView* m : MatMulOperands()) {
    if (m->data != nullptr) matmul_shapes_.emplace_back(m->type, m->cols);
  }
  if (!ggml_parity_) PackMatrices();
}

LlamaShard::~LlamaShard() = default;

void LlamaShard::FreeAligned::operator()(uint8_t* p) const { std::free(p); }

std::vector<const model::MatrixView*> LlamaShard::MatMulOperands() const {
  std::vector<const model::MatrixView*> all;
  for (const auto& l : weights_.layers()) {
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      all.push_back(m);
    }
  }
  if (role_.is_tail()) all.push_back(&weights_.output());
  return all;
}

void LlamaShard::PackMatrices() {
  std::vector<std::pair<const model::MatrixView*, uint8_t*>> jobs;
  for (const model::MatrixView* m : MatMulOperands()) {
    if (m->data == nullptr || packed_.count(m->data) != 0) continue;
    const ops::WeightMatrix w{m->type, m->data, m->rows, m->cols};
    const size_t bytes = ops::PackedWeightBytes(w);
    if (bytes == 0) continue;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (p == nullptr) throw std::bad_alloc();
    packed_store_.emplace_back(p);
    packed_[m->data] = p;
    jobs.emplace_back(m, p);
  }
  auto pack = [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const model::MatrixView& m = *jobs[static_cast<size_t>(j)].first;
      ops::PackWeights({m.type, m.data, m.rows, m.cols}, jobs[static_cast<size_t>(j)].second);
    }
  };
  const auto n = static_cast<int64_t>(jobs.size());
  ParallelForOrInline(pool_, n, pack);
}

ops::WeightMatrix LlamaShard::Matrix(const model::MatrixView& m) const {
  ops::WeightMatrix w{m.type, m.data, m.rows, m.cols};
  if (auto it = packed_.find(m.data); it != packed_.end()) w.packed = it->second;
  return w;
}

kv::KvCacheRecipe LlamaShard::MakeRecipe(KvDtype kv_dtype) const {
  kv::KvCacheRecipe r;
  r.architecture_adapter = arch().adapter;
  r.kv_dtype = kv_dtype;
  r.n_kv_heads = hparams_.n_kv_heads;
  r.head_dim = hparams_.head_dim;
  r.total_layers = hparams_.n_layers;
  r.start_layer = role_.start_layer;
  r.end_layer = role_.end_layer;
  r.boundary_schema_version = arch().boundary_schema_version;
  r.Validate();
  return r;
}

std::unique_ptr<LlamaShard::Workspace> LlamaShard::Acquire(int64_t n_tokens) const {
  std::unique_ptr<Workspace> ws;
  {
    MutexLock lock(&ws_mu_);
    if (!free_ws_.empty()) {
      ws = std::move(free_ws_.back());
      free_ws_.pop_back();
    }
  }
  if (!ws) ws = std::make_unique<Workspace>();
  if (n_tokens > ws->capacity) {
    ws->Reserve(hparams_, n_tokens);
    size_t mm_bytes = 0;
    for (const auto& [type, cols] : matmul_shapes_) {
      mm_bytes = std::max(mm_bytes, ops::MatMulScratchBytes(type, ws->capacity, cols));
    }
    ws->mm.resize(mm_bytes);
  }
  return ws;
}

void LlamaShard::Return(std::unique_ptr<Workspace> ws) const {
  MutexLock lock(&ws_mu_);
  free_ws_.push_back(std::move(ws));
}

void LlamaShard::Embed(std::span<const int32_t> ids, float* hidden) const {
  if (!role_.is_head()) {
    throw Error(ErrorKind::kBoundaryContract, "only the head shard owns the token embedding");
  }
  const model::MatrixView& e = weights_.token_embd();
  for (int32_t id : ids) {
    if (id < 0 || id >= e.rows) {
      ThrowInvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                           std::to_string(e.rows - 1) + ")");
    }
  }
  ops::EmbeddingLookup(Matrix(e), ids.data(), static_cast<int64_t>(ids.size()),
                       hidden);  // (n, n_embd)
}

void LlamaShard::Forward(float* hidden, int64_t n, const kv::KvStep& step) const {
  // Long prefills run in chunks (through every layer each, the K/V of earlier
  // chunks already in place): bounded scratch, and a cancelled step stops
  // within one layer of one chunk (shard/step_cancel.h).
  const int64_t d = hparams_.n_embd;
  for (int64_t c = 0; c < n; c += kPrefillChunk) {
    const BatchSlice slice{&step, step.start_pos() + c, std::min(kPrefillChunk, n - c)};
    ForwardRows(hidden + c * d, slice.n, {&slice, 1}, /*check_cancel=*/true);
  }
}

void LlamaShard::ForwardBatch(float* hidden, std::span<const BatchSlice> slices) const {
  int64_t n = 0;
  for (const BatchSlice& s : slices) n += s.n;
  ForwardRows(hidden, n, slices, /*check_cancel=*/false);
}

// RoPE, the K/V stores and attention of one layer, slice by slice over the
// workspace's q/k/v rows: RoPE and stores of the slices in parallel, then
// attention of every slice as one parallel job.
void LlamaShard::Attend(Workspace& ws, const model::LayerWeights& lw,
                        std::span<const BatchSlice> slices) const {
  const model::LlamaHParams& hp = hparams_;
  const int64_t q_dim = hp.q_dim();
  int64_t row = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const BatchSlice& s = slices[i];
    ws.kv[i] = s.step->Layer(lw.layer);
    ws.seqs[i] = {ws.q.data() + row * q_dim, s.n, s.start, &ws.kv[i], ws.att.data() + row * q_dim};
    row += s.n;
  }
  auto rotate_and_store = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) RotateAndStore(ws, static_cast<size_t>(i));
  };
  ParallelForOrInline(pool_, static_cast<int64_t>(slices.size()), rotate_and_store);
  ops::AttentionConfig attn{hp.n_heads, hp.head_dim, 0.0f};
  attn.ggml_f16 = ggml_parity_;
  ops::AttentionBatch(ws.seqs.data(), static_cast<int64_t>(slices.size()), attn, pool_);
}

// Slice i of Attend (its seqs[i] and kv[i] set): RoPE on its Q and K rows and
// its K and V rows stored at its reserved positions.
void LlamaShard::RotateAndStore(Workspace& ws, size_t i) const {
  const model::LlamaHParams& hp = hparams_;
  const ops::RopeConfig rope = RopeCfg();
  const ops::AttentionSeq& seq = ws.seqs[i];
  const int64_t q_dim = hp.q_dim(), kv_dim = hp.kv_dim(), half = hp.n_rot / 2;
  const int64_t row = (seq.q - ws.q.data()) / q_dim;
  float* q = ws.q.data() + row * q_dim;
  float* k = ws.k.data() + row * kv_dim;
  const float* v = ws.v.data() + row * kv_dim;
  if (ggml_parity_) {
    ops::RopeGgml(q, seq.n_tokens, hp.n_heads, hp.head_dim, rope, seq.start_pos);
    ops::RopeGgml(k, seq.n_tokens, hp.n_kv_heads, hp.head_dim, rope, seq.start_pos);
  } else {  // the angles ForwardRows computed once for every layer
    const float* cs = ws.rope_cs.data() + row * half;
    const float* sn = ws.rope_sn.data() + row * half;
    ops::RopeRotate(q, seq.n_tokens, hp.n_heads, hp.head_dim, rope, cs, sn);
    ops::RopeRotate(k, seq.n_tokens, hp.n_kv_heads, hp.head_dim, rope, cs, sn);
  }
  for (int64_t t = 0; t < seq.n_tokens; ++t) {  // the step's reserved rows
    ops::StoreKvRow(ws.kv[i], /*key=*/true, seq.start_pos + t, k + t * kv_dim);
    ops::StoreKvRow(ws.kv[i], /*key=*/false, seq.start_pos + t, v + t * kv_dim);
  }
}

// gate = silu(gate) * up, rows in parallel, one row per call: the kernel's
// last n_ff % lanes values of a call take its scalar path, so this way a row's
// SiLU does not depend on which rows share its batch (stories260K: n_ff 172).
void LlamaShard::SwiGluRows(Workspace& ws, int64_t n) const {
  const int64_t ff = hparams_.n_ff;
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      ops::SwiGlu(ws.gate.data() + r * ff, ws.up.data() + r * ff, ff, ws.gate.data() + r * ff);
    }
  };
  ParallelForOrInline(pool_, n, rows);
}

ops::RopeConfig LlamaShard::RopeCfg() const {
  return {hparams_.n_rot, hparams_.rope_freq_base, 1.0f,
          hparams_.arch->rope_style == RopeStyle::kNeox, weights_.rope_freqs()};
}

// The RoPE cos and sin of every row's position, the same in every layer: a
// 16-session decode step computed them 24 times (Q and K of 12 layers), which
// took ~5% of the step in double-precision sin, cos and pow.
void LlamaShard::RopeTable(Workspace& ws, std::span<const BatchSlice> slices) const {
  const model::LlamaHParams& hp = hparams_;
  const ops::RopeConfig rope = RopeCfg();
  const int64_t half = hp.n_rot / 2;
  int64_t row = 0;
  for (const BatchSlice& s : slices) {
    ops::RopeAngles(rope, s.start, s.n, ws.rope_cs.data() + row * half,
                    ws.rope_sn.data() + row * half);
    row += s.n;
  }
}

void LlamaShard::ForwardRows(float* hidden, int64_t n, std::span<const BatchSlice> slices,
                             bool check_cancel) const {
  const model::LlamaHParams& hp = hparams_;
  const int64_t d = hp.n_embd;
  const auto rms_norm = ggml_parity_ ? ops::RmsNormGgml : ops::RmsNorm;
  std::unique_ptr<Workspace> ws = Acquire(n);
  ws->ReserveSlices(slices.size());
  if (!ggml_parity_) RopeTable(*ws, slices);
  float* xb = ws->xb.data();
  void* mm = ws->mm.data();
  for (const model::LayerWeights& lw : weights_.layers()) {
    if (check_cancel && StepCancelled()) break;  // thrown below, once the workspace is back
    // Let threads waiting for this core run between layers: on a node whose
    // cores are shared (several nodes, or the client, on one machine) the
    // threads that pass other sessions' activations on would otherwise wait
    // up to a scheduler slice behind this forward pass, and steps arrive
    // spread out, in smaller batches. With nothing else runnable this returns
    // at once (one syscall per layer).
    sched_yield();
    // ---- attention ----
    rms_norm(hidden, lw.attn_norm, n, d, hp.rms_eps, xb);  // (n, n_embd)
    // q (n, q_dim), k and v (n, kv_dim)
    MmMany(ggml_parity_, {Matrix(lw.wq), Matrix(lw.wk), Matrix(lw.wv)}, xb, n,
           {ws->q.data(), ws->k.data(), ws->v.data()}, mm, pool_);
    AddBias(ws->q.data(), lw.bq, n, hp.q_dim());
    AddBias(ws->k.data(), lw.bk, n, hp.kv_dim());
    AddBias(ws->v.data(), lw.bv, n, hp.kv_dim());
    Attend(*ws, lw, slices);                                                         // (n, q_dim)
    Mm(ggml_parity_, Matrix(lw.wo), ws->att.data(), n, ws->proj.data(), mm, pool_);  // (n, n_embd)
    ops::Add(hidden, ws->proj.data(), n * d, hidden);
    // ---- feed-forward (SwiGLU) ----
    rms_norm(hidden, lw.ffn_norm, n, d, hp.rms_eps, xb);  // (n, n_embd)
    MmMany(ggml_parity_, {Matrix(lw.w_gate), Matrix(lw.w_up)}, xb, n,
           {ws->gate.data(), ws->up.data()}, mm, pool_);  // (n, n_ff) each
    if (ggml_parity_) {
      ops::SwiGluGgml(ws->gate.data(), ws->up.data(), n, hp.n_ff, ws->gate.data());
    } else {
      SwiGluRows(*ws, n);
    }
    Mm(ggml_parity_, Matrix(lw.w_down), ws->gate.data(), n, ws->proj.data(), mm,
       pool_);  // (n, n_embd)
    ops::Add(hidden, ws->proj.data(), n * d, hidden);
  }
  Return(std::move(ws));
  if (check_cancel) ThrowIfStepCancelled();
}

void LlamaShard::Logits(const float* hidden_row, float* logits) const {
  LogitsRows(hidden_row, 1, logits);
}

// In ggml parity mode the final norm and the LM head take llama.cpp's
// arithmetic here too (the node's batcher finishes sessions through this).
void LlamaShard::LogitsRows(const float* hidden_rows, int64_t n, float* logits) const {
  if (!role_.is_tail()) {
    throw Error(ErrorKind::kBoundaryContract,
                "only the tail shard owns the final norm and LM head");
  }
  std::unique_ptr<Workspace> ws = Acquire(n);
  (ggml_parity_ ? ops::RmsNormGgml : ops::RmsNorm)(
      hidden_rows, weights_.output_norm(), n, hparams_.n_embd, hparams_.rms_eps, ws->xb.data());
  Mm(ggml_parity_, Matrix(weights_.output()), ws->xb.data(), n, logits, ws->mm.data(),
     pool_);  // (n, vocab)
  Return(std::move(ws));
}

}  // namespace meshnet::shard
