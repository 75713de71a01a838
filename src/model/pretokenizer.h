// Byte-level BPE pre-tokenization: the split regexes llama.cpp applies for
// each `tokenizer.ggml.pre` name, run with PCRE2 (UTF + UCP + JIT) so Unicode
// categories (\p{L}, \p{N}, \s ...) come from PCRE2's Unicode tables.
//
// A pre-tokenizer is a list of regexes applied in turn: the first splits the
// text into fragments (each match is a fragment, and so is each stretch of text
// between matches), every later regex splits each fragment of the previous
// round the same way, matching the fragment as a subject of its own (so `$`
// and look-arounds stop at the fragment's end), as llama.cpp's
// unicode_regex_split does.
//
// Input text must be valid UTF-8 (see SanitizeUtf8).
//
// Thread-safety: immutable after construction; Split is safe from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshnet::model {

class PreTokenizer {
 public:
  // Throws Error(kMalformedFile) naming `pre` and the supported names when
  // `pre` is not one of them.
  explicit PreTokenizer(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // The pre-tokenizer names accepted (llama.cpp's spellings).
  static const std::vector<std::string>& SupportedNames();

  // Whether llama.cpp sets ignore_merges for this pre (a whole word that is a
  // token is emitted as that token without merging: Llama 3).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether llama.cpp adds BOS by default for this pre (llama-bpe).
  bool default_add_bos() const { return default_add_bos_; }

  // Splits valid UTF-8 `text` into words: appends [begin, end) byte offsets
  // (relative to text) to `bounds`, as consecutive pairs. Throws
  // Error(kInvalidArgument) when PCRE2 fails (e.g. its match limit).
  void Split(std::string_view text, std::vector<size_t>& bounds) const;
  // The same words, streamed: sink(begin, end) per word, in order, holding
  // O(number of regexes) state whatever the length of `text`.
  void ForEachWord(std::string_view text, const std::function<void(size_t, size_t)>& sink) const;

 private:
  struct Regexes;
  std::unique_ptr<Regexes> re_;
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
};

// llama.cpp-compatible handling of invalid UTF-8 before pre-tokenization: a
// byte that does not start a complete sequence (lead byte, then the right
// number of continuation bytes) becomes U+FFFD, one per byte, as llama.cpp's
// unicode_cpts_from_utf8 does. Sequences that are complete but not valid
// scalar values for PCRE2 (overlong forms, surrogates, > U+10FFFF) also become
// one U+FFFD each (llama.cpp passes those through or rejects them; PCRE2 cannot
// match them). Returns `text` unchanged (no copy) when already valid.
std::string_view SanitizeUtf8(std::string_view text, std::string& storage);

}  // namespace meshnet::model
