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
#include <functional>
#include <string>

#include "shard/step_cancel.h"
#include "util/error.h"
#include "util/transit.h"

namespace meshnet::node {

namespace {

// A step of one row: a decode step (or a one-token prompt), served first.
bool IsDecode(const shard::PendingStep& step) { return step.n_new == 1; }

std::exception_ptr CancelledError() {
  return std::make_exception_ptr(
      Error(ErrorKind::kUnavailable,
            "step cancelled: its deadline passed, its caller is gone or the node is stopping"));
}

}  // namespace

struct Batcher::Item {
  shard::PendingStep* step = nullptr;
  std::string_view session_id;
  const std::function<bool()>* cancel = nullptr;  // the caller's check, may be null
  int64_t done = 0;                               // rows computed
  int64_t take = 0;                               // rows in the running batch
  int64_t cohort = -1;                            // CohortTracker number (-1: none)
  bool finished = false;
  bool own_thread = false;  // Run's step on a thread that carries it on (Transit::Carrier)
  bool counted = false;     // turns: counted in transit when its last rows ran (EndTurn)
  std::exception_ptr error;
  Item* next = nullptr;     // queue link
  CondVar* wake = nullptr;  // its caller's: finished, or handed the lead
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

namespace {
thread_local Batcher::Arrival* current_arrival = nullptr;
}  // namespace

Batcher::Arrival::Arrival(Batcher* batcher) : batcher_(batcher), outer_(current_arrival) {
  current_arrival = this;
}

Batcher::Arrival::~Arrival() {
  current_arrival = outer_;
  if (counted_) return;
  MutexLock lock(&batcher_->mu_);
  batcher_->ArrivedLocked();
}

void Batcher::ExpectSteps(int64_t n) {
  if (n <= 0) return;
  MutexLock lock(&mu_);
  arriving_ += n;
  arriving_until_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options_.group_wait_s));
}

void Batcher::ArrivedLocked() {
  if (arriving_ > 0 && --arriving_ == 0) queued_.SignalAll();
}

void Batcher::CountArrivalLocked() {
  for (Arrival* a = current_arrival; a != nullptr; a = a->outer_) {
    if (a->batcher_ != this || a->counted_) continue;
    a->counted_ = true;
    ArrivedLocked();
    return;
  }
}

void Batcher::Run(shard::PendingStep* step, std::string_view session_id) {
  CondVar wake(&mu_);
  Item self;
  self.step = step;
  self.session_id = session_id;
  self.cancel = shard::CurrentStepCancel();
  self.wake = &wake;
  self.own_thread = util::Transit::carrying();
  if (options_.max_batch_sessions == 1) return RunAlone(self);
  Item* const mine[] = {&self};
  {
    MutexLock lock(&mu_);
    CountArrivalLocked();
    PushLocked(&self);
    if (turn_gate_ != nullptr) util::Transit::Get().Clear();  // queued: out of transit
    NoteReturnLocked(self);
    queued_.SignalAll();
    WaitOrLeadLocked(mine, &wake);
  }
  if (self.counted) util::Transit::Get().Adopt();  // its caller goes on to the next hop
  if (self.error) std::rethrow_exception(self.error);
}

void Batcher::RunMany(std::span<shard::PendingStep* const> steps,
                      std::span<const std::string_view> session_ids,
                      std::span<std::exception_ptr> errors) {
  if (options_.max_batch_sessions == 1) {  // each on its own, as Run would
    for (size_t i = 0; i < steps.size(); ++i) {
      try {
        Run(steps[i], session_ids[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
    return;
  }
  CondVar wake(&mu_);
  std::vector<Item> items(steps.size());
  std::vector<Item*> mine;
  for (size_t i = 0; i < steps.size(); ++i) {
    items[i].step = steps[i];
    items[i].session_id = session_ids[i];
    items[i].cancel = shard::CurrentStepCancel();
    items[i].wake = &wake;
    mine.push_back(&items[i]);
  }
  {
    MutexLock lock(&mu_);
    for (Item* it : mine) {
      PushLocked(it);
      NoteReturnLocked(*it);
    }
    queued_.SignalAll();
    WaitOrLeadLocked(mine, &wake);
  }
  for (size_t i = 0; i < items.size(); ++i) errors[i] = items[i].error;
}

bool Batcher::AllFinished(std::span<Item* const> items) {
  return std::all_of(items.begin(), items.end(), [](const Item* it) { return it->finished; });
}

void Batcher::WaitOrLeadLocked(std::span<Item* const> mine, CondVar* wake) {
  while (!AllFinished(mine)) {
    if (!running_ && !held_) {
      LeadLocked(mine);
    } else {
      wake->Wait();
    }
  }
}

void Batcher::LeadLocked(std::span<Item* const> mine) {
  running_ = true;
  while (!AllFinished(mine) && !held_ && head_ != nullptr) {
    RegroupLocked();
    WaitForDecodersLocked();
    const bool turn = turn_gate_ != nullptr;
    if (turn) TakeTurnLocked();  // waits for the sessions in transit; steps keep queuing
    if (!held_) FormLocked();
    if (held_ || batch_.empty()) {  // held meanwhile, or every step formed was cancelled
      if (turn) EndTurn();
      continue;
    }
    mu_.Unlock();
    Observe();
    const Clock::time_point start = Clock::now();
    {
      // Its leader and the pool's workers on CPUs of their own
      // (util/thread_pool.h, Placement), unless it is a lone decode step.
      const ThreadPool::PinnedCaller pin(PlaceBatch(batch_.size(), BatchRows()) ? shard_->pool()
                                                                                : nullptr);
      Execute();
    }
    if (observer_ && after_observer_) after_observer_(view_);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (turn) EndTurn();
    mu_.Lock();
    CompleteLocked(seconds);
  }
  running_ = false;
  // The oldest waiting step leads next (its caller is asleep on its CondVar).
  if (head_ != nullptr && !held_) head_->wake->Signal();
}

void Batcher::DropCancelledLocked() {
  // The steps of one grouped call share their call's check, and a gRPC
  // server's IsCancelled polls its completion queue: each check is asked
  // once per pass.
  cancel_checked_.clear();
  auto cancelled = [this](const std::function<bool()>* check) {
    if (check == nullptr) return false;
    for (const auto& [c, answer] : cancel_checked_) {
      if (c == check) return answer;
    }
    const bool answer = (*check)();
    cancel_checked_.emplace_back(check, answer);
    return answer;
  };
  Item* prev = nullptr;
  for (Item* it = head_; it != nullptr;) {
    Item* next = it->next;
    if (cancelled(it->cancel)) {
      (prev != nullptr ? prev->next : head_) = next;
      if (tail_ == it) tail_ = prev;
      --pending_;
      it->next = nullptr;
      it->error = CancelledError();
      it->finished = true;
      it->wake->Signal();
    } else {
      prev = it;
    }
    it = next;
  }
}

// Plans the batch over the queue (PlanBatch), then unlinks the chosen steps
// in queue order.
void Batcher::FormLocked() {
  batch_.clear();
  DropCancelledLocked();
  if (head_ == nullptr) return;
  queued_items_.clear();
  queued_rows_.clear();
  DecodeLoad load;
  for (Item* it = head_; it != nullptr; it = it->next) {
    queued_items_.push_back(it);
    queued_rows_.push_back(RowsOf(*it));
    if (IsDecode(*it->step)) {
      ++load.pending;
      load.hops = std::max(load.hops, it->step->route_hops);
    }
  }
  load.pending = std::min(load.pending, options_.max_batch_sessions);
  CurrentLoadLocked(&load);
  // Every kDecodeProbeEvery-th batch of decode steps while long prompts ride
  // beside them, the decode steps go alone: their measured cost stays
  // current (BatchCosts).
  const bool probe = load.pending > 0 && mixed_since_probe_ >= kDecodeProbeEvery;
  PlanBatch(queued_rows_, options_, probe ? 0 : PrefillBudget(options_, costs_, load), &take_);
  head_ = tail_ = nullptr;
  pending_ = 0;
  for (size_t i = 0; i < queued_items_.size(); ++i) {
    Item* it = queued_items_[i];
    it->take = take_[i];
    if (it->take > 0) {
      it->next = nullptr;
      batch_.push_back(it);
    } else {
      PushLocked(it);
    }
  }
}

void Batcher::CurrentLoadLocked(DecodeLoad* load) const {
  load->recent = decoders_;
  load->since_last_s = std::chrono::duration<double>(Clock::now() - last_decode_).count();
  load->round_s = decode_round_s_;
  load->hops = std::max(load->hops, decode_hops_);
}

void Batcher::WaitForDecodersLocked() {
  DecodeLoad load;
  bool counted = false;
  while (!held_ && head_ != nullptr && !RunsNowPendingLocked()) {
    CurrentLoadLocked(&load);
    const double quiet = DecodeQuietAfter(options_, costs_, load);
    if (load.since_last_s >= quiet) return;  // nobody decodes: the prompt runs in whole chunks
    if (!counted) stats_.decoder_waits.fetch_add(1, std::memory_order_relaxed);
    counted = true;
    queued_.WaitUntil(last_decode_ + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(quiet)));
  }
}

void Batcher::CompleteLocked(double seconds) {
  int64_t rows = 0, decoders = 0;
  int hops = 0;
  finished_.clear();
  for (Item* it : batch_) {
    rows += it->take;
    if (IsDecode(*it->step)) {
      ++decoders;
      hops = std::max(hops, it->step->route_hops);
    }
    it->done += it->take;
    if (it->error || it->done == it->step->n_new) {
      it->finished = true;
      it->wake->Signal();
      if (!it->error && IsDecode(*it->step)) {  // the new cohort
        finished_.push_back(std::hash<std::string_view>()(it->session_id));
      }
    } else {
      PushLocked(it);  // the next chunk, behind everyone already waiting
    }
  }
  // The prompt rows' part of this batch (the decode steps' fitted time aside).
  const double prompt_s =
      rows == decoders ? 0
      : decoders > 0 ? std::max(0.0, seconds - costs_.DecodeSeconds(static_cast<double>(decoders)))
                     : seconds;
  costs_.Add(decoders, rows - decoders, seconds);
  last_batch_s_ = seconds;
  const Clock::time_point now = Clock::now();
  cohorts_.Add(finished_, Seconds(now));
  prompt_since_decode_s_ += prompt_s;
  if (decoders > 0) mixed_since_probe_ = rows > decoders ? mixed_since_probe_ + 1 : 0;
  if (decoders > 0) {
    if (last_decode_ != Clock::time_point{}) {
      const double round = std::max(
          0.0, std::chrono::duration<double>(now - last_decode_).count() - prompt_since_decode_s_);
      decode_round_s_ =
          NextRound(decode_round_s_, round, costs_.DecodeSeconds(std::max(decoders_, 1.0)));
    }
    prompt_since_decode_s_ = 0;
    last_decode_ = now;
    decode_hops_ = hops;
    decoders_ = decoders_ > 0 ? 0.75 * decoders_ + 0.25 * static_cast<double>(decoders)
                              : static_cast<double>(decoders);
  }
  CountBatch(rows, static_cast<int64_t>(batch_.size()), seconds);
  batch_.clear();
}

double Batcher::Seconds(Clock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

void Batcher::NoteReturnLocked(Item& item) {
  if (!IsDecode(*item.step)) return;
  item.cohort =
      cohorts_.NoteReturn(std::hash<std::string_view>()(item.session_id), Seconds(Clock::now()));
}

// Until when (seconds on epoch_; 0: not at all) the leader may wait for
// cohort `number`: by CohortWait from its first return (`cohort`), else by
// RegroupWait from its batch's end; `lag_s` is the matching moving average.
double Batcher::WaitUntilLocked(int64_t number, double lag_s, bool cohort) {
  const std::optional<CohortTracker::Status> c = cohorts_.Get(number);
  if (!c) return 0;
  const RegroupState s{.expected = c->expected,
                       .back = c->back,
                       .pending = pending_,
                       .lag_s = lag_s,
                       .last_batch_s = last_batch_s_,
                       .pass_s = costs_.ready() ? costs_.DecodeSeconds(1) : 0};
  const double wait = cohort ? CohortWait(s, options_) : RegroupWait(s, options_);
  return wait > 0 ? (cohort ? c->first_back_s : c->formed_s) + wait : 0;
}

bool Batcher::AllBackLocked(int64_t number) const {
  const std::optional<CohortTracker::Status> c = cohorts_.Get(number);
  return !c || c->back >= c->expected;
}

void Batcher::RegroupLocked() {
  // The last batch's cohort, and the oldest pending decode step's (kept) one.
  const int64_t last = cohorts_.newest();
  int64_t oldest = -1;
  for (const Item* it = head_; it != nullptr && oldest < 0; it = it->next) {
    if (cohorts_.Get(it->cohort)) oldest = it->cohort;
  }
  const double until_last = WaitUntilLocked(last, cohorts_.return_lag_s(), false);
  const double until_oldest =
      oldest == last ? 0 : WaitUntilLocked(oldest, cohorts_.spread_s(), true);
  // The announced steps of a call that are still on their way.
  while (!held_ && arriving_ > 0 && pending_ < options_.max_batch_sessions &&
         Clock::now() < arriving_until_) {
    queued_.WaitUntil(arriving_until_);
  }
  // Steps announced and still not here when the wait ran out (held up before
  // the queue) are not waited for again: no later batch waits on their account.
  if (arriving_ > 0 && Clock::now() >= arriving_until_) arriving_ = 0;
  while (!held_ && pending_ < options_.max_batch_sessions) {
    const double now = Seconds(Clock::now());
    const bool for_last = now < until_last && !AllBackLocked(last);
    const bool for_oldest = now < until_oldest && !AllBackLocked(oldest);
    if (!for_last && !for_oldest) break;
    const double until = std::max(for_last ? until_last : 0, for_oldest ? until_oldest : 0);
    queued_.WaitUntil(
        epoch_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(until)));
  }
}

void Batcher::CountBatch(int64_t rows, int64_t steps, double seconds) {
  stats_.busy_ns.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
  stats_.batches.fetch_add(1, std::memory_order_relaxed);
  stats_.rows.fetch_add(rows, std::memory_order_relaxed);
  stats_.steps.fetch_add(steps, std::memory_order_relaxed);
  int64_t seen = stats_.max_sessions.load(std::memory_order_relaxed);
  while (steps > seen && !stats_.max_sessions.compare_exchange_weak(seen, steps)) {
  }
}

void Batcher::RunAlone(Item& self) {
  {
    MutexLock lock(&mu_);
    CountArrivalLocked();
    ++pending_;  // visible to WaitPending while held
    queued_.SignalAll();
    while (held_) resumed_.Wait();
    --pending_;
  }
  shard::PendingStep& step = *self.step;
  const int64_t d = shard_->hparams().n_embd;
  const int64_t chunk = std::min(options_.prefill_chunk, options_.max_batch_tokens);
  while (self.done < step.n_new) {
    if (self.cancel != nullptr && (*self.cancel)()) std::rethrow_exception(CancelledError());
    const int64_t take = std::min(step.n_new - self.done, chunk);
    if (observer_) {
      BatchView view;
      view.number = stats_.batches.load(std::memory_order_relaxed) + 1;
      view.session_ids.emplace_back(self.session_id);
      view.rows.push_back(take);
      observer_(view);
    }
    const shard::BatchSlice slice{&step.step, step.step.start_pos() + self.done, take};
    const Clock::time_point start = Clock::now();
    shard_->ForwardBatch(step.hidden.data() + self.done * d, std::span(&slice, 1));
    self.done += take;
    CountBatch(take, 1, std::chrono::duration<double>(Clock::now() - start).count());
  }
  if (!shard_->role().is_tail()) return;
  step.logits.resize(shard_->hparams().vocab_size);
  shard_->LogitsRows(step.hidden.data() + (step.n_new - 1) * d, 1, step.logits.data());
  step.logits_ready = true;
}

int64_t Batcher::BatchRows() const {
  int64_t rows = 0;
  for (const Item* it : batch_) rows += it->take;
  return rows;
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
    const int64_t rows = BatchRows();
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
  resumed_.SignalAll();
  if (!running_ && head_ != nullptr) head_->wake->Signal();
}

void Batcher::WaitPending(int64_t n) {
  MutexLock lock(&mu_);
  while (pending_ < n) queued_.Wait();
}

void Batcher::SetTurnGate(std::shared_ptr<util::RankGate> gate, int64_t rank,
                          double transit_wait_s) {
  turn_gate_ = std::move(gate);
  turn_rank_ = rank;
  turn_transit_wait_s_ = transit_wait_s;
}

void Batcher::TakeTurnLocked() {
  // Prompt rows alone (nobody decodes, or the wait for the decoders ran out:
  // WaitForDecodersLocked) ask after every decode turn (a higher rank;
  // RankGate's bypass bound keeps them from starving), and never run beside
  // another shard's batch on the shared pool, where one of the two would run
  // on its caller's thread alone.
  const int64_t rank = DecodePendingLocked() ? turn_rank_ : kPromptTurnRank + turn_rank_;
  mu_.Unlock();
  const int64_t arrival = turn_gate_->Acquire(rank);
  mu_.Lock();
  if (!DecodePendingLocked()) return;  // nobody to wait for
  mu_.Unlock();
  // A cohort behind, waiting at an earlier shard now, goes first: its
  // sessions then reach this shard and join this batch (two cohorts that
  // chased each other round the shards merge).
  do {
    util::Transit::Get().Wait(turn_transit_wait_s_);
  } while (turn_gate_->Yield(turn_rank_, arrival));
  mu_.Lock();
}

QueuedRows Batcher::RowsOf(const Item& item) {
  return {item.step->n_new, item.done, item.step->step.start_pos() == 0, item.step->verify};
}

bool Batcher::RunsNowPendingLocked() const {
  for (const Item* it = head_; it != nullptr; it = it->next) {
    if (IsDecode(*it->step)) return true;
    if (IsShortPrompt(RowsOf(*it), options_)) return true;
  }
  return false;
}

bool Batcher::DecodePendingLocked() const {
  for (const Item* it = head_; it != nullptr; it = it->next) {
    if (IsDecode(*it->step)) return true;
  }
  return false;
}

void Batcher::EndTurn() {
  // Only the leader touches batch_; `counted` is read by each step's caller
  // after CompleteLocked marks it finished (under mu_).
  int64_t answered = 0;
  for (Item* it : batch_) {
    it->counted = it->own_thread && !it->error && it->done + it->take == it->step->n_new;
    answered += it->counted;
  }
  util::Transit::Get().Count(answered);  // before the next shard's turn: it waits for them
  turn_gate_->Release();
}

void Batcher::SetObserver(std::function<void(const BatchView&)> observer,
                          std::function<void(const BatchView&)> after) {
  observer_ = std::move(observer);
  after_observer_ = std::move(after);
}

}  // namespace meshnet::node
