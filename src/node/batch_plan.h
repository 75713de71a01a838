// The batcher's admission policy as pure functions (node::Batcher applies
// them to its queue; tests drive them with a BatchCostModel fed by hand).
//
// PlanBatch chooses what the next batch computes from the pending steps, in
// queue (arrival) order:
//  1. the oldest step, always (nothing starves): a decode step's row, a short
//     prompt whole, or a long prompt's next chunk;
//  2. every decode step (one row each: decode first);
//  3. every short prompt (a step that opens its context with at most
//     short_prompt rows and at most one chunk; a piece of a longer prompt
//     the client sends in parts is not one) whole, or what is left of it: a new session's prompt is
//     cheap, and chunking it only delays its first token (a burst of new sessions then gets their
//     first tokens as fast as without the time bound below);
//  4. the rows of long prompts (and of short ones the rows left could not
//     hold whole), in arrival order, one chunk per step of at
//     most prefill_chunk rows, all of them together at most `prefill_budget`
//     rows (PrefillBudget).
// Everything within max_batch_sessions steps and max_batch_tokens rows.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "node/batch_cost.h"

namespace meshnet::node {

struct BatchOptions {
  int64_t max_batch_tokens = 512;   // rows of one forward pass
  int64_t max_batch_sessions = 64;  // sessions of one forward pass (1: no batching)
  int64_t prefill_chunk = 256;      // rows of one step per batch
  // While sessions decode, a batch's long-prompt rows add at most this share
  // of the decode steps' own batch time (0: only prefill_chunk bounds them).
  double prefill_share = 0.5;
  // Prompts of at most this many rows (and at most prefill_chunk) run whole,
  // beside the decode steps, unbounded by prefill_share (0: none).
  int64_t short_prompt = 64;
  // How long the next batch may wait for the announced steps of a call that
  // are still on their way to the queue (Batcher::ExpectSteps), 0..60 s.
  double group_wait_s = 0.005;
  static constexpr int64_t kMinPrefillRows = 1;  // the floor of that bound
  static constexpr int64_t kMaxTokens = 1 << 16;
  static constexpr int64_t kMaxSessions = 1 << 12;
  // Throws kInvalidArgument naming the flag for a value out of range
  // (each 1..kMax*; prefill_chunk 1..kMaxTokens; short_prompt 0..kMaxTokens;
  // prefill_share 0..16, group_wait_s 0..60).
  void Validate() const;
};

// One pending step as the policy sees it.
struct QueuedRows {
  int64_t total = 0;  // the step's rows
  int64_t done = 0;   // rows already computed (earlier chunks)
  bool opens = true;  // the step opens its context (position 0): a whole prompt
  // A speculative decode step (its last token and the drafts): a decode
  // step of several rows, run whole beside the others like a short prompt.
  bool verify = false;
};

// A step of one row: a decode step (or a one-token prompt).
inline bool IsDecodeRows(const QueuedRows& q) { return q.total == 1; }
// A prompt admitted whole (step 3 above), or a verify step (QueuedRows::verify).
bool IsShortPrompt(const QueuedRows& q, const BatchOptions& o);

// Whether a batch of `steps` steps and `rows` rows runs with its leader and
// the compute pool's workers on CPUs of their own (ThreadPool::PinnedCaller):
// several sessions or rows, yes; a lone session's decode step, no (pinning
// it cost 3-5%: a migration per step). Left to the scheduler, a lone prompt
// often ran on one CPU (the woken worker placed beside its caller) at twice
// the time: an API request's 5-token prompt, p90 9.8-13.5 ms against 5.4-6.8
// pinned.
bool PlaceBatch(size_t steps, int64_t rows);

// Sets (*take)[i] to the rows step i computes in the next batch (0: not in
// it). `prefill_budget` bounds the long prompts' rows (the oldest step gets
// at least one row whatever it is, unless the budget is 0 and the batch has
// other steps). Reuses *take's storage.
void PlanBatch(std::span<const QueuedRows> queue, const BatchOptions& o, int64_t prefill_budget,
               std::vector<int64_t>* take);

// What the batcher knows of the sessions decoding on the node.
struct DecodeLoad {
  int64_t pending = 0;        // decode steps in the queue now
  double recent = 0;          // decode steps per recent batch (moving average)
  double since_last_s = 1e9;  // seconds since the last batch with decode steps
  // Their usual round: seconds between two such batches, less the prompt rows'
  // time in them (moving average; 0: none measured). One batch in process; on
  // a route of several nodes or shards, the others' steps and the hops too.
  double round_s = 0;
  // The most hops on the routes of the decoding sessions (their clients say;
  // 0 or 1: one). Each node may add its 1/hops part of the share.
  int hops = 0;
};

// The round's moving average after one more: `interval_s` from the last batch
// with decode steps to this one, the prompt rows' part aside. An interval
// longer than kQuietBatches batches of `decode_batch_s` is a pause (the
// sessions stopped, and others began), not a round: it leaves the average as
// it was.
inline constexpr double kQuietBatches = 32;
// ... and never less than this: a stall of the whole route (a preempted
// process, a slow client) shorter than it does not make a node think its
// sessions have gone, which would let a whole prompt chunk through and stall
// them again, on every hop holding prompt rows in turn.
inline constexpr double kMinQuietS = 0.25;
double NextRound(double round_s, double interval_s, double decode_batch_s);

// Seconds after the last batch with decode steps from which nobody counts as
// decoding any more: four of their rounds (a shared machine stalls a round
// now and then: a prompt's whole chunk then would stall them again), at
// least 4 and at most 32 decode batches (0: prefill_share 0 or no batch
// measured yet, never decoding).
double DecodeQuietAfter(const BatchOptions& o, const BatchCosts& cost, const DecodeLoad& load);

// Long prompts' rows one batch may carry: while sessions decode (a decode
// step is pending, or one ran within DecodeQuietAfter: their next step may be
// on the route's other nodes, or sampling), this hop's part of
// prefill_share of their round: share * round / (hops + share * (hops - 1))
// (the round at least a batch of the decode steps alone, at most 16), as
// `cost` measured a decode batch and a prompt row (at least one row: the
// oldest step always moves); otherwise (nobody decoding, share 0 or no batch
// measured yet) max_batch_tokens. The part is what makes the parts of every
// hop holding prompt rows at once (a prompt sent in pipelined pieces is on
// every hop) add up to prefill_share of the round without prompts: each hop
// sees a round the others' prompt rows lengthen, and had each taken the whole
// share of it, the round would grow without bound. node::Batcher runs prompt
// rows only beside decode steps while sessions decode, so prompts add at most
// about prefill_share to their inter-token time however many hops they cross
// and however many of those hold prompt rows.
int64_t PrefillBudget(const BatchOptions& o, const BatchCosts& cost, const DecodeLoad& load);

// Regrouping (adaptive, no fixed waiting window). The decode sessions that
// one batch finished, its cohort, usually queue their next steps close
// together: in process straight after it (their callers commit, sample and
// send the next token), on a node of a pipelined route a round later, after
// the other hops. A batch formed before a cohort is back holds only part of
// it, and the sessions settle into smaller groups that take turns, each
// paying a whole pass over the weights. So the next leader waits, bounded,
// for the last batch's cohort (RegroupWait: in process this also merges
// groups that took turns) and for the rest of the oldest pending decode
// step's cohort (CohortWait: on a pipelined route, the one a round ago).
//
// CohortTracker keeps the last kCohorts batches' cohorts (session id hashes;
// storage reused), how long after its batch ended a member of the newest
// cohort queues (the return lag) and how long after a cohort's first step
// the others queue (the spread), as moving averages. Times are seconds on
// any steady clock.
class CohortTracker {
 public:
  static constexpr int kCohorts = 16;
  struct Status {
    int64_t expected = 0;     // decode sessions of the cohort
    int64_t back = 0;         // of those, steps queued again since
    double formed_s = 0;      // when its batch ended
    double first_back_s = 0;  // when the first of them queued (back > 0)
  };
  // A batch ended at `now_s`; `members` are its finished decode steps'
  // session id hashes: the newest cohort (the oldest kept one is forgotten).
  void Add(std::span<const uint64_t> members, double now_s);
  // A step of session `id_hash` queued at `now_s`: counts it back in the
  // newest kept cohort that holds it and returns that cohort's number (-1:
  // in none; each member counts once).
  int64_t NoteReturn(uint64_t id_hash, double now_s);
  // Cohort `number`, or nullopt when it is not kept (or not formed yet).
  std::optional<Status> Get(int64_t number) const;
  int64_t newest() const { return count_ - 1; }          // -1: none yet
  double return_lag_s() const { return return_lag_s_; }  // < 0: none measured yet
  double spread_s() const { return spread_s_; }          // < 0: none measured yet

 private:
  struct Cohort {
    std::vector<uint64_t> members;  // id hash | 1; 0 once back
    Status status;
  };
  std::array<Cohort, kCohorts> cohorts_;
  int64_t count_ = 0;  // cohorts added so far
  double return_lag_s_ = -1;
  double spread_s_ = -1;
};

struct RegroupState {
  int64_t expected = 0;     // decode sessions of the cohort waited for
  int64_t back = 0;         // of those, steps queued again
  int64_t pending = 0;      // steps queued now (the leader's own included)
  double lag_s = -1;        // their usual time to queue (<0: none measured yet)
  double last_batch_s = 0;  // the last batch's forward pass
  double pass_s = 0;        // a batch of one decode step, as the node measured it
};
// For the last batch's cohort, from the batch's end (lag: the return lag):
// the longest wait in seconds (0: start now): none when all are back, the
// batch is full, or they come back slower than kRegroupShare of a batch (a
// pipelined route: the other nodes' steps are in between); else up to twice
// their usual lag (plus 20 us of scheduling slack), and never more than
// kRegroupShare of a batch. A lone session is always back (its own step is
// the one queued): it never waits.
inline constexpr double kRegroupShare = 0.25;
double RegroupWait(const RegroupState& s, const BatchOptions& o);
// For the oldest pending decode step's cohort, from its first step (lag: the
// spread): as RegroupWait, but bounded by the larger of kRegroupShare of the
// last batch and a batch of one decode step (the pass over the weights a
// straggler left for a later batch pays alone), and still that long when
// stragglers are slower (those that come in time join; on a pipelined route
// whose nodes share cores, steps of one cohort reach a node milliseconds
// apart).
double CohortWait(const RegroupState& s, const BatchOptions& o);

}  // namespace meshnet::node
