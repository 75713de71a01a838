// Batcher: continuous batching of one node's steps across sessions.
//
// Every step of a node (whatever the transport: NodeCore for gRPC, the
// in-process route) is validated, bound and reserved on its caller's thread
// (KvBoundaryAdapter::Begin*), then handed to Run(), which computes its rows
// in a batch with the other sessions' pending steps: one forward pass over the
// stacked rows of all of them (LlamaShard::ForwardBatch: the matmuls over all
// rows at once, attention per session against its own KV), plus one LM head
// matmul over the last rows of the tail steps that finished. Per-session work
// (commit, sampling, building the reply) runs back on each caller's thread
// (KvBoundaryAdapter::Finish), so one session's miss or error never touches
// the others.
//
// Scheduling (no fixed waiting window):
//  * regrouping: the leader of the next batch waits for the decode sessions
//    the last batch finished to queue their next step, only as long as
//    RegroupWait (node/batch_plan.h) allows: twice their measured time to
//    come back, at most a quarter of a batch, never for a lone session;
//  * leader/follower: a caller that finds no batch running runs the batch
//    itself, for everything pending, on its own thread (a lone session pays
//    no thread hop and no wait). Others wait for their rows. When the
//    leader's own step is done, it hands the lead to the oldest pending step
//    and returns. No lock is held across the forward pass;
//  * when a batch finishes, everything pending forms the next one, up to
//    max_batch_sessions sessions and max_batch_tokens rows, as PlanBatch
//    (node/batch_plan.h) chooses: the oldest pending step (so nothing
//    starves), then every decode step (one row; decode first), then short
//    prompts whole (at most short_prompt rows and one chunk: a burst of new
//    sessions gets its first tokens at once), then long prompts' rows in
//    arrival order. The batch keeps arrival order;
//  * a step of more than prefill_chunk rows (a long prompt) runs one chunk per
//    batch and goes back to the end of the queue between chunks, so the
//    decode steps of other sessions run between its chunks;
//  * time-bounded prompt chunks (PrefillBudget): while sessions decode on
//    this node, the long prompts' rows of one batch are bounded so that they
//    add at most prefill_share of the sessions' round (the time between this
//    node's batches of their steps, the prompt rows' part aside: one batch in
//    process, the other shards' or nodes' steps and the hops on a route),
//    at the costs measured on this node (BatchCosts: decode batches and
//    prompt rows apart), and at least one row; and prompt rows run only
//    beside their steps: with none queued (nor a short prompt, which never
//    waits), the leader waits for them (WaitForDecodersLocked, until
//    DecodeQuietAfter). A long prompt then
//    costs the decoding sessions about (1 + prefill_share) of their
//    inter-token time, whatever the kernels' speed and however many shards
//    they cross; with nobody decoding it runs in whole prefill_chunk rows;
//  * fairness: the queue is FIFO, a partly done step re-queues at the end and
//    the oldest step is always in the next batch, so every pending step is in
//    one of the next (pending) batches;
//  * max_batch_sessions 1 (batching off): every step runs on its caller's
//    thread as soon as it arrives, concurrently with the others' (as a node
//    without a batcher would), in chunks of at most prefill_chunk and
//    max_batch_tokens rows; nothing waits for another session's step;
//  * cancellation (shard/step_cancel.h): a caller's cancel check is read when
//    each batch forms; a cancelled step leaves the queue with kUnavailable
//    (its reserved rows are rolled back by its caller). A step already in a
//    running batch finishes that batch.
//
// A session pinned in a running or pending batch holds its KvStep, so the KV
// manager never evicts it. Buffers (stacked rows, slices, logits) are kept
// and reused; after warm-up the decode loop allocates nothing here.
//
// Thread-safety: all methods are thread-safe; SetObserver must be called
// while no step runs (with max_batch_sessions 1 the observer is called from
// several threads at once).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "node/batch_cost.h"
#include "node/batch_plan.h"
#include "shard/kv_boundary_adapter.h"
#include "shard/llama_shard.h"
#include "util/mutex.h"
#include "util/rank_gate.h"

namespace meshnet::node {

// Monotonic counters (relaxed atomics).
struct BatchStats {
  std::atomic<int64_t> batches{0};
  std::atomic<int64_t> rows{0};
  std::atomic<int64_t> steps{0};  // sum over batches of the sessions in them
  std::atomic<int64_t> max_sessions{0};
  std::atomic<int64_t> busy_ns{0};  // sum of the batches' forward pass times
  // Times a leader held long prompts' rows back to run them beside the
  // decoding sessions' next steps (WaitForDecodersLocked).
  std::atomic<int64_t> decoder_waits{0};
};

// What one batch holds, for observers (tests).
struct BatchView {
  int64_t number = 0;  // 1-based batch count
  std::vector<std::string> session_ids;
  std::vector<int64_t> rows;  // per session
};

class Batcher {
 public:
  // `shard` must outlive the batcher. Throws kInvalidArgument for bad options.
  Batcher(const shard::LlamaShard* shard, BatchOptions options);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  const BatchOptions& options() const { return options_; }
  const BatchStats& stats() const { return stats_; }

  // Computes every row of `step` (and, at the tail, its logits), batched with
  // other callers' steps; returns when done. Throws Error(kUnavailable) when
  // the calling thread's step is cancelled before its last rows ran.
  void Run(shard::PendingStep* step, std::string_view session_id) EXCLUDES(mu_);
  // Run for several steps of the calling thread at once (a StepMany call's
  // decode steps, node::NodeCore::StepMany): all queued together, so they go
  // into one batch without a thread each; errors[i] is step i's failure, or
  // null. The sessions must differ.
  void RunMany(std::span<shard::PendingStep* const> steps,
               std::span<const std::string_view> session_ids, std::span<std::exception_ptr> errors)
      EXCLUDES(mu_);

  // Steps that come together (a StepMany call, rpc/server.cc): the caller
  // announces `n` of them, then runs each on a thread that holds an Arrival
  // for it. Until every announced step has reached the queue (its Run) or
  // ended without one (a miss, an error, a replayed answer), and for at most
  // BatchOptions::group_wait_s, the next batch waits for them, so the steps of
  // one call are computed in one batch, not one by one as their threads wake.
  // Announced steps still missing when a wait runs out are forgotten, so a
  // step held up elsewhere (or a hostile caller) delays at most the batches
  // formed within group_wait_s of its call.
  void ExpectSteps(int64_t n) EXCLUDES(mu_);
  class Arrival {
   public:
    explicit Arrival(Batcher* batcher);
    ~Arrival();  // counts the step in if its Run did not
    Arrival(const Arrival&) = delete;
    Arrival& operator=(const Arrival&) = delete;

   private:
    friend class Batcher;
    Batcher* batcher_;
    bool counted_ = false;
    Arrival* outer_;
  };

  // Test hooks: Hold() keeps new batches from starting (steps queue up) until
  // Resume(); WaitPending(n) blocks until at least n steps are queued.
  void Hold() EXCLUDES(mu_);
  void Resume() EXCLUDES(mu_);
  void WaitPending(int64_t n) EXCLUDES(mu_);
  // Called by the leader with each batch before it runs and, if `after` is
  // set, with the same view once its forward pass is done (no lock held).
  void SetObserver(std::function<void(const BatchView&)> observer,
                   std::function<void(const BatchView&)> after = nullptr);
  // Shards that share one compute pool (the in-process route) take turns:
  // each batch is formed and run while holding the place of `gate` (depth 1),
  // asked with `rank` (the shard's first layer), so the earliest layers go
  // first, and a batch of prompt rows alone (nobody decoding) after every
  // batch with decode steps that waits, never beside another shard's batch
  // on the shared pool; with its place, a decode batch's leader first waits,
  // `transit_wait_s` at most,
  // for the sessions between two steps (util/transit.h: the answered steps of
  // the batch before, counted in transit before it gives up its place). So the
  // sessions that finish one shard's batch join the next one's, and one that
  // fell behind catches up at the next shard (as the client's pipeline depth
  // does for nodes, util/rank_gate.h): one cohort per round rather than
  // several smaller ones that each pay a pass over the weights, and never two
  // batches splitting the pool's threads. Null: no turns. Must be called while
  // no step runs.
  void SetTurnGate(std::shared_ptr<util::RankGate> gate, int64_t rank, double transit_wait_s);
  bool takes_turns() const { return turn_gate_ != nullptr; }

 private:
  struct Item;
  using Clock = std::chrono::steady_clock;
  // Pops the next batch off the queue into batch_ (dropping cancelled steps).
  void FormLocked() REQUIRES(mu_);
  // Takes cancelled steps off the queue and fails them.
  void DropCancelledLocked() REQUIRES(mu_);
  // Forward pass (and LM head) over batch_; no lock held. Only the leader
  // touches batch_ and the buffers.
  void Execute();
  // The rows batch_ computes (the sum of its steps' take); leader only.
  int64_t BatchRows() const;
  // Tail: the logits of the steps this batch finishes, from `rows` (the
  // batch's stacked output rows), as one LM head matmul.
  void TailLogits(const float* rows);
  // Marks done steps, wakes their callers, re-queues the unfinished ones;
  // feeds the cost model with the batch's `seconds`.
  void CompleteLocked(double seconds) REQUIRES(mu_);
  void CountBatch(int64_t rows, int64_t steps, double seconds);
  // As leader: runs batches until the caller's steps `mine` are done (or the
  // queue is held).
  void LeadLocked(std::span<Item* const> mine) REQUIRES(mu_);
  // Whether every one of `items` is done (read under mu_).
  static bool AllFinished(std::span<Item* const> items);
  // Until `mine` are done: leads when nobody does, else waits on `wake`.
  void WaitOrLeadLocked(std::span<Item* const> mine, CondVar* wake) REQUIRES(mu_);
  // max_batch_sessions 1: runs `self` on this thread, concurrently with others.
  void RunAlone(Item& self) EXCLUDES(mu_);
  void PushLocked(Item* item) REQUIRES(mu_);
  void Observe();
  // Turns: the leader's place and the wait for sessions in transit (with
  // mu_ released meanwhile); after its batch, counts the steps it answered in
  // transit, then gives the place up.
  void TakeTurnLocked() REQUIRES(mu_);
  static constexpr int64_t kPromptTurnRank = int64_t{1} << 40;  // above every layer
  void EndTurn();
  bool DecodePendingLocked() const REQUIRES(mu_);
  // A decode step or a short prompt is queued: the next batch runs now,
  // whatever the time bound leaves the long prompts.
  bool RunsNowPendingLocked() const REQUIRES(mu_);
  // What PlanBatch and IsShortPrompt see of a queued step.
  static QueuedRows RowsOf(const Item& item);

  const shard::LlamaShard* shard_;
  const BatchOptions options_;
  BatchStats stats_;

  Mutex mu_;
  CondVar queued_{&mu_};                  // a step was queued (WaitPending)
  CondVar resumed_{&mu_};                 // Resume() (max_batch_sessions 1)
  Item* head_ GUARDED_BY(mu_) = nullptr;  // FIFO of pending steps
  Item* tail_ GUARDED_BY(mu_) = nullptr;
  int64_t pending_ GUARDED_BY(mu_) = 0;
  bool running_ GUARDED_BY(mu_) = false;  // a leader is running batches
  bool held_ GUARDED_BY(mu_) = false;
  std::function<void(const BatchView&)> observer_;  // set while no step runs
  std::function<void(const BatchView&)> after_observer_;
  std::shared_ptr<util::RankGate> turn_gate_;  // SetTurnGate; set while no step runs
  int64_t turn_rank_ = 0;
  double turn_transit_wait_s_ = 0;

  // The leader's batch and buffers (only the thread with running_ set uses them).
  std::vector<Item*> batch_;
  std::vector<Item*> queued_items_;      // FormLocked: the queue, in order
  std::vector<QueuedRows> queued_rows_;  // and what PlanBatch sees of it
  std::vector<int64_t> take_;            // PlanBatch's rows per queued step
  // DropCancelledLocked: each distinct cancel check's answer in this pass.
  std::vector<std::pair<const std::function<bool()>*, bool>> cancel_checked_;
  std::vector<shard::BatchSlice> slices_;
  std::vector<float> hidden_;     // stacked rows (rows, n_embd)
  std::vector<float> last_rows_;  // tail: finished steps' last rows
  std::vector<float> logits_;     // tail: their logits (k, vocab)
  BatchView view_;
  // Leader only: batch costs, and the decode steps seen (for prompt chunks).
  BatchCosts costs_ GUARDED_BY(mu_);
  Clock::time_point last_decode_ GUARDED_BY(mu_){};  // end of the last batch with decode steps
  double decoders_ GUARDED_BY(mu_) = 0;              // decode steps per such batch (moving average)
  double decode_round_s_ GUARDED_BY(mu_) = 0;        // DecodeLoad::round_s
  int decode_hops_ GUARDED_BY(mu_) = 0;              // DecodeLoad::hops of the last such batch
  double prompt_since_decode_s_ GUARDED_BY(mu_) = 0;  // prompt rows' time since that batch
  static constexpr int kDecodeProbeEvery = 8;
  int mixed_since_probe_ GUARDED_BY(mu_) = 0;  // batches of decode and prompt rows since one alone
  void CurrentLoadLocked(DecodeLoad* load) const REQUIRES(mu_);  // all but `pending`
  // While sessions decode (DecodeQuietAfter) and none of their steps is
  // queued, prompt rows wait for them, to run beside them (PrefillBudget).
  void WaitForDecodersLocked() REQUIRES(mu_);
  // Regrouping (RegroupWait) by cohort: the cohorts of the last batches, the
  // finished decode steps' id hashes of the batch that just ended (storage
  // reused), the last batch's time, and the clock's zero for the tracker.
  CohortTracker cohorts_ GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ GUARDED_BY(mu_);
  double last_batch_s_ GUARDED_BY(mu_) = 0;
  const Clock::time_point epoch_ = Clock::now();
  double Seconds(Clock::time_point t) const;
  // Waits (bounded by RegroupWait and CohortWait) for the rest of the last
  // batch's cohort and of the oldest pending decode step's cohort to queue.
  void RegroupLocked() REQUIRES(mu_);
  // The deadline (seconds on epoch_; 0: none) of the wait for cohort
  // `number`: CohortWait from its first return (`cohort`) or RegroupWait
  // from its batch's end.
  double WaitUntilLocked(int64_t number, double lag_s, bool cohort) REQUIRES(mu_);
  bool AllBackLocked(int64_t number) const REQUIRES(mu_);
  // Announced steps (ExpectSteps) not arrived yet, and until when to wait.
  int64_t arriving_ GUARDED_BY(mu_) = 0;
  Clock::time_point arriving_until_ GUARDED_BY(mu_){};
  // This thread's Arrival for this batcher, if any: counted in (mu_ held).
  void CountArrivalLocked() REQUIRES(mu_);
  void ArrivedLocked() REQUIRES(mu_);
  // `item` was queued: counts it back in its cohort (Item::cohort).
  void NoteReturnLocked(Item& item) REQUIRES(mu_);
};

}  // namespace meshnet::node
