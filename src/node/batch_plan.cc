// The batcher's admission policy. See batch_plan.h.
#include "node/batch_plan.h"

#include <algorithm>
#include <string>

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
  if (short_prompt < 0 || short_prompt > kMaxTokens) {
    ThrowInvalidArgument("--short-prompt must be in 0.." + std::to_string(kMaxTokens));
  }
  if (!(prefill_share >= 0 && prefill_share <= 16)) {
    ThrowInvalidArgument("--prefill-share must be in 0..16");
  }
  if (!(group_wait_s >= 0 && group_wait_s <= 60)) {
    ThrowInvalidArgument("the group wait must be in 0..60 s");
  }
}

bool PlaceBatch(size_t steps, int64_t rows) { return steps > 1 || rows > 1; }

bool IsShortPrompt(const QueuedRows& q, const BatchOptions& o) {
  return (q.opens || q.verify) && q.total > 1 &&
         q.total <= std::min({o.short_prompt, o.prefill_chunk, o.max_batch_tokens});
}

void PlanBatch(std::span<const QueuedRows> queue, const BatchOptions& o, int64_t prefill_budget,
               std::vector<int64_t>* take) {
  take->assign(queue.size(), 0);
  if (queue.empty()) return;
  int64_t steps = 0, rows = 0;
  auto choose = [&](size_t i, int64_t n) {
    (*take)[i] = n;
    ++steps;
    rows += n;
  };
  // Whether `n` more rows of one more step fit, keeping a row and a step for
  // the oldest step while it is not chosen yet.
  auto fits = [&](int64_t n) {
    const int64_t reserve = (*take)[0] > 0 ? 0 : 1;
    return steps + 1 + reserve <= o.max_batch_sessions && rows + n + reserve <= o.max_batch_tokens;
  };
  const QueuedRows& oldest = queue[0];
  if (IsDecodeRows(oldest)) choose(0, 1);
  if (IsShortPrompt(oldest, o)) choose(0, oldest.total - oldest.done);
  for (size_t i = 1; i < queue.size(); ++i) {
    if (IsDecodeRows(queue[i]) && fits(1)) choose(i, 1);
  }
  for (size_t i = 1; i < queue.size(); ++i) {
    const int64_t left = queue[i].total - queue[i].done;
    if (IsShortPrompt(queue[i], o) && fits(left)) choose(i, left);
  }
  // A budget of 0 leaves the long prompts out of a batch that has other
  // steps (the batcher's probe of the decode steps alone).
  int64_t budget = prefill_budget > 0 ? prefill_budget : (steps == 0 ? 1 : 0);
  for (size_t i = 0; i < queue.size() && budget > 0; ++i) {
    if ((*take)[i] > 0 || IsDecodeRows(queue[i])) continue;
    if (i > 0 && !fits(1)) break;
    const int64_t left = queue[i].total - queue[i].done;
    const int64_t n = std::min({left, o.prefill_chunk, o.max_batch_tokens - rows, budget});
    if (n <= 0) break;
    choose(i, n);
    budget -= n;
  }
}

namespace {
double DecodeBatchSeconds(const BatchCosts& cost, const DecodeLoad& load) {
  const double n = std::max(static_cast<double>(load.pending), load.recent);
  return cost.DecodeSeconds(std::max(n, 1.0));
}
}  // namespace

double DecodeQuietAfter(const BatchOptions& o, const BatchCosts& cost, const DecodeLoad& load) {
  if (o.prefill_share <= 0 || !cost.ready()) return 0;
  const double decode_batch = DecodeBatchSeconds(cost, load);
  return std::max(std::clamp(4 * load.round_s, 4 * decode_batch, kQuietBatches * decode_batch),
                  kMinQuietS);
}

double NextRound(double round_s, double interval_s, double decode_batch_s) {
  if (!(interval_s >= 0) || interval_s > kQuietBatches * decode_batch_s) return round_s;
  return round_s > 0 ? 0.75 * round_s + 0.25 * interval_s : interval_s;
}

int64_t PrefillBudget(const BatchOptions& o, const BatchCosts& cost, const DecodeLoad& load) {
  const int64_t all = o.max_batch_tokens;
  if (o.prefill_share <= 0 || !cost.ready()) return all;
  const bool decoding = load.pending > 0 || load.since_last_s < DecodeQuietAfter(o, cost, load);
  if (!decoding) return all;
  // The sessions' round: one batch here in process; across three shards or
  // nodes, three batches and the hops, of which this node's part is 1/hops.
  const double decode_batch = DecodeBatchSeconds(cost, load);
  const double round = std::clamp(load.round_s, decode_batch, 16 * decode_batch);
  // This hop's part: with prompt rows on every one of h hops at once, each
  // adds p to the round that the others see (round = R0 + (h-1)p here), and
  // p = share * round / (h + share * (h-1)) solves to p = share * R0 / h: the
  // h parts add up to the share of the round without prompts.
  const double h = std::max(load.hops, 1);
  const double part = round / (h + o.prefill_share * (h - 1));
  const double row = cost.PromptRowSeconds();
  const double rows = row > 0 ? o.prefill_share * part / row * (1 + 1e-9) : 1e9;
  const int64_t floor = std::min(o.prefill_chunk, BatchOptions::kMinPrefillRows);
  return std::clamp(static_cast<int64_t>(std::min(rows, 1e9)), floor, all);
}

double RegroupWait(const RegroupState& s, const BatchOptions& o) {
  if (s.back >= s.expected || s.pending >= o.max_batch_sessions || s.last_batch_s <= 0) return 0;
  const double bound = kRegroupShare * s.last_batch_s;
  if (s.lag_s < 0) return bound;
  if (s.lag_s > bound) return 0;
  return std::min(bound, 2 * s.lag_s + 20e-6);
}

double CohortWait(const RegroupState& s, const BatchOptions& o) {
  if (s.back >= s.expected || s.pending >= o.max_batch_sessions || s.last_batch_s <= 0) return 0;
  const double bound = std::max(kRegroupShare * s.last_batch_s, s.pass_s);
  if (s.lag_s < 0) return bound;
  return std::min(bound, 2 * s.lag_s + 20e-6);
}

void CohortTracker::Add(std::span<const uint64_t> members, double now_s) {
  Cohort& c = cohorts_[static_cast<size_t>(count_ % kCohorts)];
  c.members.assign(members.begin(), members.end());
  for (uint64_t& m : c.members) m |= 1;  // never 0, which marks "back"
  c.status = Status{static_cast<int64_t>(members.size()), 0, now_s, 0};
  ++count_;
}

int64_t CohortTracker::NoteReturn(uint64_t id_hash, double now_s) {
  const uint64_t h = id_hash | 1;
  for (int64_t n = count_ - 1; n >= 0 && n >= count_ - kCohorts; --n) {
    Cohort& c = cohorts_[static_cast<size_t>(n % kCohorts)];
    for (uint64_t& m : c.members) {
      if (m != h) continue;
      m = 0;
      if (n == count_ - 1) {
        const double lag = now_s - c.status.formed_s;
        return_lag_s_ = return_lag_s_ < 0 ? lag : 0.8 * return_lag_s_ + 0.2 * lag;
      }
      if (c.status.back++ == 0) {
        c.status.first_back_s = now_s;
      } else {
        const double spread = now_s - c.status.first_back_s;
        spread_s_ = spread_s_ < 0 ? spread : 0.8 * spread_s_ + 0.2 * spread;
      }
      return n;
    }
  }
  return -1;
}

std::optional<CohortTracker::Status> CohortTracker::Get(int64_t number) const {
  if (number < 0 || number >= count_ || number < count_ - kCohorts) return std::nullopt;
  return cohorts_[static_cast<size_t>(number % kCohorts)].status;
}

}  // namespace meshnet::node
