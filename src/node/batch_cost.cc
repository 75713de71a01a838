// BatchCostModel implementation. See batch_cost.h.
#include "node/batch_cost.h"

#include <algorithm>
#include <cmath>

namespace meshnet::node {

void BatchCostModel::Add(int64_t rows, double seconds) {
  if (rows < 1 || !(seconds >= 0)) return;
  const auto x = static_cast<double>(rows);
  w_ = forget_ * w_ + 1;
  sx_ = forget_ * sx_ + x;
  sy_ = forget_ * sy_ + seconds;
  sxx_ = forget_ * sxx_ + x * x;
  sxy_ = forget_ * sxy_ + x * seconds;
}

double BatchCostModel::PerRow() const {
  if (w_ <= 0) return 0;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double mean_cost = my / mx;  // every second counted per row
  const double var = sxx_ / w_ - mx * mx;
  if (var < 0.25) return mean_cost;  // rows too alike to tell a from b
  const double b = (sxy_ / w_ - mx * my) / var;
  // Noise can make the slope tiny or negative; a row never costs less than
  // a 1/64 of the mean per-row cost here, nor more than all of a batch's time.
  return std::clamp(b, mean_cost / 64, my);
}

double BatchCostModel::Fixed() const {
  if (w_ <= 0) return 0;
  return std::max(0.0, sy_ / w_ - PerRow() * sx_ / w_);
}

double BatchCostModel::Seconds(double rows) const { return Fixed() + PerRow() * rows; }

int64_t BatchCostModel::RowsWithin(double seconds) const {
  const double b = PerRow();
  if (b <= 0 || !(seconds > 0)) return 0;
  // (1e-9: a quotient meant to be whole is not floored one row short.)
  return static_cast<int64_t>(std::min(std::floor(seconds / b * (1 + 1e-9)), 1e9));
}

void BatchCosts::Add(int64_t decode_rows, int64_t prompt_rows, double seconds) {
  if (!(seconds >= 0) || decode_rows < 0 || prompt_rows < 0) return;
  all_.Add(decode_rows + prompt_rows, seconds);
  if (prompt_rows == 0) {
    const double fitted = decode_.ready() ? decode_.Seconds(static_cast<double>(decode_rows)) : 0;
    // (Not from the fit's first few batches: it cannot predict yet.)
    if (fitted > 0 && ++decode_batches_ > kFirstBatches) {
      level_ = 0.7 * level_ + 0.3 * (seconds / fitted);
    }
    decode_.Add(decode_rows, seconds);
    return;
  }
  if (decode_rows > 0 && !decode_.ready()) return;  // nothing to take the decode steps' part from
  const double decode_s = decode_rows > 0 ? decode_.Seconds(static_cast<double>(decode_rows)) : 0;
  const double row = std::max(0.0, seconds - decode_s) / static_cast<double>(prompt_rows);
  prompt_row_s_ = prompt_row_s_ > 0 ? 0.75 * prompt_row_s_ + 0.25 * row : row;
}

double BatchCosts::DecodeSeconds(double decoders) const {
  return decode_.ready() ? level_ * decode_.Seconds(decoders) : all_.Seconds(decoders);
}

double BatchCosts::PromptRowSeconds() const {
  return prompt_row_s_ > 0 ? prompt_row_s_ : all_.PerRow();
}

}  // namespace meshnet::node
