// Turns generated token pieces into the text a client may see:
//   * whole UTF-8 characters only (a character split over tokens waits for
//     its last byte), via model::Utf8Assembler;
//   * stop sequences matched across token boundaries: text that could still
//     be the start of a stop sequence is held back until it cannot, and the
//     matched sequence and everything after it are never emitted.
// A hand-written matcher: stop sequences are at most 4 short strings, so a
// scan of the held-back tail per piece is cheap and needs no library.
//
// Thread-safety: a plain value, one generation at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace meshnet::api {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Adds a piece; returns the text now safe to emit (possibly empty).
  std::string Push(std::string_view piece);
  // End of generation (not stopped): returns everything still held.
  std::string Finish();
  // A stop sequence matched; nothing more will be emitted.
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  model::Utf8Assembler utf8_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace meshnet::api
