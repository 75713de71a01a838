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
//  * leader/follower: a caller that finds no batch running runs the batch
//    itself, for everything pending, on its own thread (a lone session pays
//    no thread hop and no wait). Others wait for their rows. When the
//    leader's own step is done, it hands the lead to the oldest pending step
//    and returns. No lock is held across the forward pass;
//  * when a batch finishes, everything pending forms the next one, in arrival
//    order, up to max_batch_sessions sessions and max_batch_tokens rows;
//  * a step of more than prefill_chunk rows (a long prompt) runs one chunk per
//    batch and goes back to the end of the queue between chunks, so the
//    decode steps of other sessions run between its chunks;
//  * fairness: the queue is FIFO and a partly done step re-queues at the end,
//    so every pending step is in one of the next (pending / max sessions)
//    batches;
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
// while no step runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shard/kv_boundary_adapter.h"
#include "shard/llama_shard.h"
#include "util/mutex.h"

namespace meshnet::node {

struct BatchOptions {
  int64_t max_batch_tokens = 512;   // rows of one forward pass
  int64_t max_batch_sessions = 64;  // sessions of one forward pass (1: no batching)
  int64_t prefill_chunk = 256;      // rows of one step per batch
  static constexpr int64_t kMaxTokens = 1 << 16;
  static constexpr int64_t kMaxSessions = 1 << 12;
  // Throws kInvalidArgument naming the flag for a value out of range
  // (each 1..kMax*; prefill_chunk 1..kMaxTokens).
  void Validate() const;
};

// Monotonic counters (relaxed atomics).
struct BatchStats {
  std::atomic<int64_t> batches{0};
  std::atomic<int64_t> rows{0};
  std::atomic<int64_t> steps{0};  // sum over batches of the sessions in them
  std::atomic<int64_t> max_sessions{0};
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

  // Test hooks: Hold() keeps new batches from starting (steps queue up) until
  // Resume(); WaitPending(n) blocks until at least n steps are queued.
  void Hold() EXCLUDES(mu_);
  void Resume() EXCLUDES(mu_);
  void WaitPending(int64_t n) EXCLUDES(mu_);
  // Called by the leader with each batch before it runs (no lock held).
  void SetObserver(std::function<void(const BatchView&)> observer);

 private:
  struct Item;
  // Pops the next batch off the queue into batch_ (dropping cancelled steps).
  void FormLocked() REQUIRES(mu_);
  // Forward pass (and LM head) over batch_; no lock held. Only the leader
  // touches batch_ and the buffers.
  void Execute();
  // Tail: the logits of the steps this batch finishes, from `rows` (the
  // batch's stacked output rows), as one LM head matmul.
  void TailLogits(const float* rows);
  // Marks done steps, wakes their callers, re-queues the unfinished ones.
  void CompleteLocked() REQUIRES(mu_);
  // As leader: runs batches until `self` is done (or the queue is held).
  void LeadLocked(Item& self) REQUIRES(mu_);
  void PushLocked(Item* item) REQUIRES(mu_);
  Item* PopLocked() REQUIRES(mu_);
  void Observe();

  const shard::LlamaShard* shard_;
  const BatchOptions options_;
  BatchStats stats_;

  Mutex mu_;
  CondVar queued_{&mu_};                  // a step was queued (WaitPending)
  Item* head_ GUARDED_BY(mu_) = nullptr;  // FIFO of pending steps
  Item* tail_ GUARDED_BY(mu_) = nullptr;
  int64_t pending_ GUARDED_BY(mu_) = 0;
  bool running_ GUARDED_BY(mu_) = false;  // a leader is running batches
  bool held_ GUARDED_BY(mu_) = false;
  std::function<void(const BatchView&)> observer_;  // set while no step runs

  // The leader's batch and buffers (only the thread with running_ set uses them).
  std::vector<Item*> batch_;
  std::vector<int64_t> take_;  // rows of each batch_ step in this batch
  std::vector<shard::BatchSlice> slices_;
  std::vector<float> hidden_;     // stacked rows (rows, n_embd)
  std::vector<float> last_rows_;  // tail: finished steps' last rows
  std::vector<float> logits_;     // tail: their logits (k, vocab)
  BatchView view_;
};

}  // namespace meshnet::node
