// SentencePiece-style BPE tokenizer (llama.cpp's "llama"/SPM tokenizer model)
// built from a GGUF vocabulary.
//
// Encode: the text gets the add_space_prefix treatment (a leading space, then
// every ' ' becomes "▁" U+2581), is split into UTF-8 characters, and the
// adjacent pair whose concatenation is a mergeable vocab token with the highest
// score is merged until no pair merges (ties: the leftmost pair). A priority
// queue keeps this O(n log n). Characters left outside the vocab fall back to
// <0xXX> byte tokens (or the unknown token when the vocab has no byte tokens).
// Only normal and user-defined tokens take part in merges, so text that spells
// "<s>" or "<0x41>" never turns into a control or byte token.
//
// Decode: "▁" renders as a space, byte tokens as their raw byte, control and
// unused tokens as nothing; the leading space of the first piece of a
// sequence, or of the piece right after BOS, is dropped (it is the space
// prefix Encode added). Pieces may split a UTF-8 character across byte tokens:
// stream them through Utf8Assembler.
//
// Thread-safety: a Tokenizer is immutable after construction; every const
// method is safe from any thread. Utf8Assembler is a plain value (one thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshnet::gguf {
class GgufFile;
}

namespace meshnet::model {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// llama.cpp's token types, as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The raw vocabulary. `types` may be empty (every token is then normal, except
// that "<0xXX>" names are byte tokens). Special ids are kNoToken when absent.
struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<TokenType> types;
  TokenId bos_id = kNoToken;
  TokenId eos_id = kNoToken;
  TokenId unk_id = kNoToken;
  bool add_bos = true;  // tokenizer.ggml.add_bos_token (SentencePiece default: true)
};

class Tokenizer {
 public:
  // Validates the vocabulary (non-empty, sizes agree, special ids in range).
  // Throws Error(kMalformedFile) naming the problem.
  explicit Tokenizer(Vocabulary vocab);

  // Reads tokenizer.ggml.* through the architecture registry's key names.
  // Refuses a tokenizer model other than "llama" (kMalformedFile).
  static Tokenizer FromGguf(const gguf::GgufFile& file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Empty text encodes to just BOS (or nothing). Throws Error(kInvalidArgument)
  // when add_bos is set and the vocabulary has no BOS, or when a character has
  // neither a token, a byte fallback nor an unknown token.
  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const;

  // The text of `ids`. Throws Error(kInvalidArgument) on an id out of range.
  std::string Decode(std::span<const TokenId> ids) const;
  // The bytes `id` contributes when it follows `prev_id` (kNoToken at the start
  // of a sequence). Concatenating DecodePiece over a sequence equals Decode.
  std::string DecodePiece(TokenId prev_id, TokenId id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  TokenId bos_id() const { return vocab_.bos_id; }
  TokenId eos_id() const { return vocab_.eos_id; }
  TokenId unk_id() const { return vocab_.unk_id; }
  // Whether prompts of this model start with BOS by default.
  bool add_bos() const { return vocab_.add_bos; }
  // The raw vocab string of `id` (with "▁"); throws on an id out of range.
  const std::string& TokenText(TokenId id) const;
  TokenType Type(TokenId id) const;
  float Score(TokenId id) const;
  // kNoToken when `text` is not a token.
  TokenId Find(std::string_view text) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept;
  };
  bool Mergeable(TokenId id) const;
  void CheckId(TokenId id) const;
  // Appends the tokens of one final symbol (a vocab token or byte fallback).
  void EmitSymbol(std::string_view symbol, std::vector<TokenId>& out) const;

  Vocabulary vocab_;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> ids_;
  TokenId byte_ids_[256];  // kNoToken where the vocab lacks <0xXX>
};

// Re-assembles a stream of raw pieces into whole UTF-8 characters: Push returns
// the longest prefix of the buffered bytes that does not end inside a
// character. Invalid bytes are passed through as they come (never held back
// more than 3 bytes). Flush returns whatever is held.
class Utf8Assembler {
 public:
  std::string Push(std::string_view bytes);
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace meshnet::model
