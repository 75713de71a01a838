// Batcher implementation. See batcher.h for the contract.
//
// Ownership: an Item lives on its caller's stack for the whole of Run(). It is
// on the queue (head_/tail_) or in the leader's batch_, never both; its
// fields other than `next` are written by the leader only while it is in
// batch_ and read by its caller once `finished` is set (both under mu_).
#include "node/batcher.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "shard/step_cancel.h"
#include "util/error.h"

namespace meshnet::node {

void BatchOptions::Validate() const {
  if (max_batch_tokens < 1 || max_batch_tokens > kMaxTokens) {
    ThrowInvalidArgument("--max-batch-tokens must be in 1.." + std::to_string(kMaxTokens));
  }
  if (max_batch_sessions < 1 || max_batch_sessions > kMaxSessions) {
    ThrowInvalidArgument("--max-batch-sessions must be in 1.." + std::to_string(kMaxSessions));
  }
  if (prefill_chunk < 1 || prefill_chunk > kMaxTokens) {
    ThrowInvalidArgument("--prefill-chunk must be in 1.." + std::to_string(kMaxTokens));
  }
}

struct Batcher::Item {
  explicit Item(Mutex* mu) : wake(mu) {}
  shard::PendingStep* step = nullptr;
  std::string_view session_id;
  const std::function<bool()>* cancel = nullptr;  // the caller's check, may be null
  int64_t done = 0;                               // rows computed
  int64_t take = 0;                               // rows in the running batch
  bool finished = false;
  std::exception_ptr error;
  Item* next = nullptr;  // queue link
  CondVar wake;          // finished, or handed the lead
};

Batcher::Batcher(const shard::LlamaShard* shard, BatchOptions options)
    : shard_(shard), options_(options) {
  options_.Validate();
}

Batcher::~Batcher() = default;

void Batcher::PushLocked(Item* item) {
  item->next = nullptr;
  if (tail_ != nullptr) {
    tail_->next = item;
  } else {
    head_ = item;
  }
  tail_ = item;
  ++pending_;
}

Batcher::Item* Batcher::PopLocked() {
  Item* item = head_;
  head_ = item->next;
  if (head_ == nullptr) tail_ = nullptr;
  item->next = nullptr;
  --pending_;
  return item;
}

void Batcher::Run(shard::PendingStep* step, std::string_view session_id) {
  Item self(&mu_);
  self.step = step;
  self.session_id = session_id;
  self.cancel = shard::CurrentStepCancel();
  {
    MutexLock lock(&mu_);
    PushLocked(&self);
    queued_.SignalAll();
    while (!self.finished) {
      if (!running_ && !held_) {
        LeadLocked(self);
      } else {
        self.wake.Wait();
      }
    }
  }
  if (self.error) std::rethrow_exception(self.error);
}

void Batcher::LeadLocked(Item& self) {
  running_ = true;
  while (!self.finished && !held_ && head_ != nullptr) {
    FormLocked();
    if (batch_.empty()) continue;  // every step formed was cancelled
    mu_.Unlock();
    Observe();
    Execute();
    mu_.Lock();
    CompleteLocked();
  }
  running_ = false;
  // The oldest waiting step leads next (its caller is asleep on its CondVar).
  if (head_ != nullptr && !held_) head_->wake.Signal();
}

void Batcher::FormLocked() {
  batch_.clear();
  int64_t rows = 0;
  while (head_ != nullptr && static_cast<int64_t>(batch_.size()) < options_.max_batch_sessions &&
         rows < options_.max_batch_tokens) {
    Item* it = PopLocked();
    if (it->cancel != nullptr && (*it->cancel)()) {
      it->error = std::make_exception_ptr(
          Error(ErrorKind::kUnavailable,
                "step cancelled: its deadline passed, its caller is gone or the node is stopping"));
      it->finished = true;
      it->wake.Signal();
      continue;
    }
    it->take = std::min(
        {it->step->n_new - it->done, options_.prefill_chunk, options_.max_batch_tokens - rows});
    rows += it->take;
    batch_.push_back(it);
  }
}

void Batcher::CompleteLocked() {
  int64_t rows = 0;
  for (Item* it : batch_) {
    rows += it->take;
    it->done += it->take;
    if (it->error || it->done == it->step->n_new) {
      it->finished = true;
      it->wake.Signal();
    } else {
      PushLocked(it);  // the next chunk, behind everyone already waiting
    }
  }
  const auto n = static_cast<int64_t>(batch_.size());
  stats_.batches.fetch_add(1, std::memory_order_relaxed);
  stats_.rows.fetch_add(rows, std::memory_order_relaxed);
  stats_.steps.fetch_add(n, std::memory_order_relaxed);
  if (n > stats_.max_sessions.load(std::memory_order_relaxed)) {
    stats_.max_sessions.store(n, std::memory_order_relaxed);  // only the leader writes it
  }
  batch_.clear();
}

void Batcher::Execute() {
  try {
    const int64_t d = shard_->hparams().n_embd;
    slices_.clear();
    if (batch_.size() == 1) {  // a lone step computes in its own buffer
      Item* it = batch_[0];
      slices_.push_back({&it->step->step, it->step->step.start_pos() + it->done, it->take});
      shard_->ForwardBatch(it->step->hidden.data() + it->done * d, slices_);
      TailLogits(it->step->hidden.data() + it->done * d);
      return;
    }
    int64_t rows = 0;
    for (const Item* it : batch_) rows += it->take;
    if (hidden_.size() < static_cast<size_t>(rows * d)) hidden_.resize(rows * d);
    float* row = hidden_.data();
    for (Item* it : batch_) {
      std::memcpy(row, it->step->hidden.data() + it->done * d, sizeof(float) * it->take * d);
      slices_.push_back({&it->step->step, it->step->step.start_pos() + it->done, it->take});
      row += it->take * d;
    }
    shard_->ForwardBatch(hidden_.data(), slices_);
    row = hidden_.data();
    for (Item* it : batch_) {
      std::memcpy(it->step->hidden.data() + it->done * d, row, sizeof(float) * it->take * d);
      row += it->take * d;
    }
    TailLogits(hidden_.data());
  } catch (...) {
    for (Item* it : batch_) it->error = std::current_exception();
  }
}

void Batcher::TailLogits(const float* rows) {
  if (!shard_->role().is_tail()) return;
  const int64_t d = shard_->hparams().n_embd;
  const int64_t vocab = shard_->hparams().vocab_size;
  int64_t k = 0, offset = 0;
  for (const Item* it : batch_) {  // the last rows of the steps this batch finishes
    offset += it->take;
    if (it->done + it->take < it->step->n_new) continue;
    if (last_rows_.size() < static_cast<size_t>((k + 1) * d)) last_rows_.resize((k + 1) * d);
    std::memcpy(last_rows_.data() + k * d, rows + (offset - 1) * d, sizeof(float) * d);
    ++k;
  }
  if (k == 0) return;
  if (logits_.size() < static_cast<size_t>(k * vocab)) logits_.resize(k * vocab);
  shard_->LogitsRows(last_rows_.data(), k, logits_.data());
  k = 0;
  for (Item* it : batch_) {
    if (it->done + it->take < it->step->n_new) continue;
    it->step->logits.assign(logits_.data() + k * vocab, logits_.data() + (k + 1) * vocab);
    it->step->logits_ready = true;
    ++k;
  }
}

void Batcher::Observe() {
  if (!observer_) return;
  view_.number = stats_.batches.load(std::memory_order_relaxed) + 1;
  view_.session_ids.clear();
  view_.rows.clear();
  for (const Item* it : batch_) {
    view_.session_ids.emplace_back(it->session_id);
    view_.rows.push_back(it->take);
  }
  observer_(view_);
}

void Batcher::Hold() {
  MutexLock lock(&mu_);
  held_ = true;
}

void Batcher::Resume() {
  MutexLock lock(&mu_);
  held_ = false;
  if (!running_ && head_ != nullptr) head_->wake.Signal();
}

void Batcher::WaitPending(int64_t n) {
  MutexLock lock(&mu_);
  while (pending_ < n) queued_.Wait();
}

void Batcher::SetObserver(std::function<void(const BatchView&)> observer) {
  observer_ = std::move(observer);
}

}  // namespace meshnet::node
