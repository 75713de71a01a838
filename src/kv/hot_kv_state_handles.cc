// SessionHandle and KvStep: pins on a session entry (see hot_kv_state.cc for
// the entry invariants).
#include <mutex>
#include <utility>

#include "kv/hot_kv_state.h"
#include "kv/hot_kv_state_internal.h"
#include "ops/kv_quant.h"

namespace meshnet::kv {

namespace {

std::vector<float> ReadPlane(const ops::PagedKvLayer& v, bool keys) {
  const int64_t row = int64_t{v.n_kv_heads} * v.head_dim;
  std::vector<float> out(static_cast<size_t>(v.n_positions * row));  // (seq_len, heads, dim)
  const int size = KvDtypeSize(v.dtype);
  for (int64_t p = 0; p < v.n_positions; ++p) {
    const uint8_t* src = keys ? v.KRow(p) : v.VRow(p);
    float* dst = out.data() + p * row;
    if (IsQuantizedKv(v.dtype)) {
      ops::DequantizeKvRow(v.dtype, src, v.n_kv_heads, v.head_dim, dst);
    } else {
      for (int64_t i = 0; i < row; ++i) dst[i] = LoadAs(v.dtype, src + i * size);
    }
  }
  return out;
}

}  // namespace

// --- SessionHandle --------------------------------------------------------------

SessionHandle::SessionHandle(SessionHandle&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      entry_(std::exchange(other.entry_, nullptr)) {}

SessionHandle& SessionHandle::operator=(SessionHandle&& other) noexcept {
  if (this != &other) {
    SessionHandle old(std::move(*this));
    manager_ = std::exchange(other.manager_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
  }
  return *this;
}

SessionHandle::~SessionHandle() {
  if (entry_ == nullptr) return;
  auto& m = *manager_->impl_;
  MutationLock lock(&m, /*trim_ids=*/false);
  m.UnpinLocked(entry_);
}

const std::string& SessionHandle::session_id() const { return entry_->session_id; }
int64_t SessionHandle::route_epoch() const { return entry_->route_epoch; }

int64_t SessionHandle::seq_len() const {
  MutexLock lock(&manager_->impl_->mu);
  return entry_->seq_len;
}

bool SessionHandle::alive() const {
  MutexLock lock(&manager_->impl_->mu);
  return entry_->live;
}

ops::PagedKvLayer SessionHandle::Layer(int layer) const {
  const auto& m = *manager_->impl_;
  MutexLock lock(&m.mu);
  return m.View(entry_, layer, entry_->seq_len);
}

std::vector<float> SessionHandle::ReadKeys(int layer) const {
  return ReadPlane(Layer(layer), true);
}
std::vector<float> SessionHandle::ReadValues(int layer) const {
  return ReadPlane(Layer(layer), false);
}

// --- KvStep ----------------------------------------------------------------------

KvStep::KvStep(KvStep&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      entry_(std::exchange(other.entry_, nullptr)),
      start_pos_(other.start_pos_),
      n_new_(other.n_new_) {}

KvStep& KvStep::operator=(KvStep&& other) noexcept {
  if (this != &other) {
    Rollback();
    manager_ = std::exchange(other.manager_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
    start_pos_ = other.start_pos_;
    n_new_ = other.n_new_;
  }
  return *this;
}

KvStep::~KvStep() { Rollback(); }

const std::string& KvStep::session_id() const { return entry_->session_id; }
int64_t KvStep::route_epoch() const { return entry_->route_epoch; }

ops::PagedKvLayer KvStep::Layer(int layer) const {
  if (entry_ == nullptr) throw Error(ErrorKind::kInvalidArgument, "KvStep is finished");
  // No lock: while the step is in flight only its owner changes the block table.
  return manager_->impl_->View(entry_, layer, start_pos_ + n_new_);
}

std::optional<CacheMiss> KvStep::Commit() {
  if (entry_ == nullptr) throw Error(ErrorKind::kInvalidArgument, "KvStep is finished");
  auto& m = *manager_->impl_;
  SessionEntry* e = std::exchange(entry_, nullptr);
  manager_ = nullptr;
  MutationLock lock(&m, /*trim_ids=*/false);
  e->step_active = false;
  if (!e->live) {
    CacheMiss miss{e->session_id, e->route_epoch, e->death_reason, e->death_detail};
    ++m.misses[static_cast<int>(miss.reason)];
    m.ShrinkBlocksLocked(e, m.BlocksFor(e->seq_len));
    m.UnpinLocked(e);
    return miss;
  }
  e->seq_len += n_new_;
  m.live_tokens += n_new_;
  m.TouchLocked(e, m.NowLocked());
  m.UnpinLocked(e);
  return std::nullopt;
}

void KvStep::Rollback() {
  if (entry_ == nullptr) return;
  auto& m = *manager_->impl_;
  SessionEntry* e = std::exchange(entry_, nullptr);
  manager_ = nullptr;
  MutationLock lock(&m, /*trim_ids=*/false);
  e->step_active = false;
  m.ShrinkBlocksLocked(e, m.BlocksFor(e->seq_len));
  m.UnpinLocked(e);
}

}  // namespace meshnet::kv
