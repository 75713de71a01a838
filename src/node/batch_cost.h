// BatchCostModel: what a batch of n rows costs on this node, learned from the
// batches it ran (node::Batcher sizes prompt chunks with it).
//
// A batch's time is modelled as a + b * rows: `a` is what any forward pass
// pays whatever its rows (with memory-bound decode kernels, one pass over the
// weights), `b` what each row adds. Both come from a least-squares fit over the
// recent batches, older ones weighted down by `forget` per batch (load on a
// shared machine and the kernels' behaviour drift; the fit follows). With too
// little spread in the rows seen to separate a from b, all the time is taken
// as per-row cost (the conservative reading: chunks come out smaller).
//
// Written here rather than taken from a library: five running sums; no
// packaged library offers an online weighted linear fit.
//
// Thread-safety: none (the batcher's leader is its only user).
#pragma once

#include <cstdint>

namespace meshnet::node {

class BatchCostModel {
 public:
  explicit BatchCostModel(double forget = 0.9) : forget_(forget) {}

  // One batch of `rows` rows that took `seconds`.
  void Add(int64_t rows, double seconds);
  // True once a batch was seen.
  bool ready() const { return w_ > 0; }
  // Fitted seconds of a batch of `rows` rows (0 before any batch).
  double Seconds(double rows) const;
  // Fitted seconds each row adds (> 0 once ready).
  double PerRow() const;
  // Rows that add at most `seconds` to a batch (>= 0).
  int64_t RowsWithin(double seconds) const;

 private:
  double Fixed() const;

  double forget_;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
};

// What node::Batcher measures to bound prompt rows: every batch (`all`), the
// batches of decode steps alone (`decode`: what the decoding sessions pay
// without prompts) and what one prompt row adds to a batch, measured over the
// recent batches with prompt rows (a moving average of their time beyond the
// decode steps' fitted time, per prompt row). A prompt row deep in a long
// prompt attends over its whole context, so it can cost several decode rows;
// one fit over all rows would underestimate it.
//
// The decode fit keeps the shape (what a row adds), and the latest batches
// of decode steps alone its level (`level`: a moving average of their time
// over the fit's): while a long prompt rides beside the decode steps, batches
// of decode steps alone are few (node::Batcher runs one every
// kDecodeProbeEvery batches), and a fit still weighted by the first batches
// after start (weights paged in, caches cold) would put their time too high,
// the prompt rows' too low, and let through more of them than the share.
//
// Thread-safety: none (the batcher's leader is its only user).
class BatchCosts {
 public:
  // One batch of `decode_rows` decode steps and `prompt_rows` prompt rows.
  void Add(int64_t decode_rows, int64_t prompt_rows, double seconds);
  // True once a batch was seen.
  bool ready() const { return all_.ready(); }
  // Fitted seconds of a batch of `decoders` decode steps alone (from every
  // batch until one of decode steps alone was seen).
  double DecodeSeconds(double decoders) const;
  // Seconds one prompt row adds to a batch (> 0 once ready).
  double PromptRowSeconds() const;

 private:
  BatchCostModel all_, decode_;
  double level_ = 1;
  static constexpr int64_t kFirstBatches = 4;
  int64_t decode_batches_ = 0;
  double prompt_row_s_ = 0;
};

}  // namespace meshnet::node
