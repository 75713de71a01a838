#include "api/text_stream.h"

#include <algorithm>

namespace meshnet::api {

std::string TextStream::Push(std::string_view piece) {
  if (stopped_) return "";
  held_ += utf8_.Push(piece);
  // The earliest complete match wins.
  size_t match = std::string::npos;
  for (const auto& s : stops_) match = std::min(match, held_.find(s));
  if (match != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, match);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop sequence.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  // The assembler's remainder is an incomplete character; it cannot complete
  // a stop sequence any more, so everything goes out.
  std::string out = std::move(held_) + utf8_.Flush();
  held_.clear();
  return out;
}

}  // namespace meshnet::api
