// The tokenizer of a GGUF model: llama.cpp's two BPE kinds.
//
//  - SentencePiece BPE (tokenizer.ggml.model = "llama", kSpm), described here.
//  - Byte-level BPE (tokenizer.ggml.model = "gpt2", kBpe): the text is split
//    into words by the regexes of tokenizer.ggml.pre (model/pretokenizer.h),
//    each word's bytes are mapped to GPT-2's printable byte alphabet, and
//    adjacent symbols merge by the rank of the pair in tokenizer.ggml.merges
//    (lowest rank first, ties leftmost). Invalid UTF-8 is first replaced as
//    llama.cpp does (SanitizeUtf8). Decoding maps the byte alphabet back to raw
//    bytes (which may split a UTF-8 character: stream through Utf8Assembler).
//
// Special tokens (both kinds, llama.cpp's tokenizer_st_partition): before
// BPE, the text is cut at every occurrence of a user-defined token (always) and
// of control and unknown tokens (only with parse_special), longest token text
// first; the pieces between are encoded as text. So plain user text that spells
// "<|im_start|>" never becomes the control token. A token that strips
// (Vocabulary::strip, e.g. Phi-3's "<|end|>") also takes the whitespace next
// to it: "<|user|>\n hi" is <|user|> then " hi".
//
// Public API for callers (CLI, API server):
//   Tokenize(text, add_special, parse_special) -> ids  (llama_tokenize)
//   DecodePiece(prev, id) per generated id, through a Utf8Assembler; Decode(ids)
//   bos_id() / eos_id() / eot_id() / eom_id(), IsEog(id): stop generation
//   chat_template(): tokenizer.chat_template from the GGUF ("" when absent)
//
// SentencePiece encode: the text gets the add_space_prefix treatment (a leading space, then
// every ' ' becomes "▁" U+2581), is split into UTF-8 characters (sized by
// their lead byte alone, as llama.cpp does: a broken sequence takes the bytes
// after it, and falls back to byte tokens), and the
// adjacent pair whose concatenation is a mergeable vocab token with the highest
// score is merged until no pair merges (ties: the leftmost pair). A priority
// queue keeps this O(n log n). Characters left outside the vocab fall back to
// <0xXX> byte tokens (or the unknown token when the vocab has no byte tokens).
// Only normal and user-defined tokens take part in merges, so text that spells
// "<s>" or "<0x41>" never turns into a control or byte token.
//
// SentencePiece decode: "▁" renders as a space, byte tokens as their raw byte, control and
// unused tokens as nothing; the leading space of the first piece of a
// sequence, or of the piece right after BOS, is dropped (it is the space
// prefix Encode added). Pieces may split a UTF-8 character across byte tokens:
// stream them through Utf8Assembler.
//
// Thread-safety: a Tokenizer is immutable after construction; every const
// method is safe from any thread. Utf8Assembler is a plain value (one thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshnet::gguf {
class GgufFile;
}

namespace meshnet::model {

class PreTokenizer;

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

enum class TokenizerKind { kSpm, kBpe };

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
};

// The raw vocabulary. `types` may be empty (every token is then normal, except
// that "<0xXX>" names are byte tokens in kSpm). `scores` may be empty for kBpe.
// Special ids are kNoToken when absent.
struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<TokenType> types;
  TokenId bos_id = kNoToken;
  TokenId eos_id = kNoToken;
  TokenId unk_id = kNoToken;
  bool add_bos = true;  // tokenizer.ggml.add_bos_token (SentencePiece default: true)
  TokenizerKind kind = TokenizerKind::kSpm;
  std::vector<std::string> merges = {};  // kBpe: "left right"; the index is the rank
  std::string pre = "default";           // kBpe: tokenizer.ggml.pre
  TokenId eot_id = kNoToken;     // end of turn (<|eot_id|>, <|im_end|>); found by text when absent
  TokenId eom_id = kNoToken;     // end of message (<|eom_id|>)
  bool add_eos = false;          // tokenizer.ggml.add_eos_token
  bool add_space_prefix = true;  // kSpm: tokenizer.ggml.add_space_prefix
  std::string chat_template = {};  // tokenizer.chat_template
  // Per-token stripping (llama.cpp's LSTRIP / RSTRIP attributes, which GGUF files do not
  // store): when a special token is cut out of the text, the ASCII whitespace right before
  // it (kStripLeft) or right after it (kStripRight) goes with it. Empty: llama.cpp's rules
  // by name (below) decide.
  std::vector<uint8_t> strip = {};
  // general.name, for llama.cpp's rules: a Phi-3 vocabulary (the lowercased name holds
  // "phi-3" or "phi3") strips after every special token except <unk>, <s> and
  // <|endoftext|>; jina-v2 pre-tokenizers strip before <mask>.
  std::string model_name = {};
};

inline constexpr uint8_t kStripLeft = 1;
inline constexpr uint8_t kStripRight = 2;

class Tokenizer {
 public:
  // Validates the vocabulary (non-empty, sizes agree, special ids in range,
  // known token types, kBpe: a supported pre and well-formed merges "left
  // right"). Throws Error(kMalformedFile) naming the problem.
  explicit Tokenizer(Vocabulary vocab);
  ~Tokenizer();

  // Reads tokenizer.ggml.* and tokenizer.chat_template through the
  // architecture registry's key names. Refuses a tokenizer model other than
  // "llama" and "gpt2", and any malformed field (kMalformedFile).
  static Tokenizer FromGguf(const gguf::GgufFile& file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // llama.cpp's llama_tokenize: BOS first when add_special and add_bos(), EOS
  // last when add_special and add_eos(); control tokens matched in the text
  // only when parse_special. Memory: O(text + output). Throws
  // Error(kInvalidArgument) when a required BOS/EOS is missing from the vocab,
  // or (kSpm) a character has neither a token, a byte fallback nor <unk>.
  std::vector<TokenId> Tokenize(std::string_view text, bool add_special, bool parse_special) const;
  // The same, except that no control (or unknown) token is matched where it
  // overlaps one of `literal` (sorted, disjoint byte ranges of `text`): that
  // text is encoded as if parse_special were false, e.g. what a chat client
  // typed inside a rendered template whose own control tokens still count.
  std::vector<TokenId> Tokenize(std::string_view text, bool add_special, bool parse_special,
                                std::span<const TextRange> literal) const;

  // No control-token parsing (user-defined tokens still match), no EOS; BOS
  // first when add_bos (whatever add_bos() says). Empty text encodes to just
  // BOS (or nothing).
  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const;

  // The text of `ids`. Throws Error(kInvalidArgument) on an id out of range.
  std::string Decode(std::span<const TokenId> ids, bool render_special = false) const;
  // The bytes `id` contributes when it follows `prev_id` (kNoToken at the start
  // of a sequence). Concatenating DecodePiece over a sequence equals Decode.
  // Control tokens render as nothing unless render_special (then their text).
  std::string DecodePiece(TokenId prev_id, TokenId id, bool render_special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  TokenId bos_id() const { return vocab_.bos_id; }
  TokenId eos_id() const { return vocab_.eos_id; }
  TokenId unk_id() const { return vocab_.unk_id; }
  TokenId eot_id() const { return vocab_.eot_id; }
  TokenId eom_id() const { return vocab_.eom_id; }
  // End of generation: eos, eot, eom and the end-of-turn tokens llama.cpp
  // recognizes by text (<|eot_id|>, <|im_end|>, <|endoftext|>, ...).
  bool IsEog(TokenId id) const;
  const std::vector<TokenId>& eog_ids() const { return eog_ids_; }
  // Whether prompts of this model start with BOS / end with EOS by default.
  bool add_bos() const { return vocab_.add_bos; }
  bool add_eos() const { return vocab_.add_eos; }
  TokenizerKind kind() const { return vocab_.kind; }
  const std::string& pre() const { return vocab_.pre; }
  const std::string& chat_template() const { return vocab_.chat_template; }
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
  struct BpeScratch;
  bool Mergeable(TokenId id) const;
  void CheckId(TokenId id) const;
  void InitSpecial();
  void InitStrip();
  void InitBpe();
  // Cuts `text` at special tokens (no control token overlapping `literal`);
  // calls on_text(begin, end) for each text piece and on_token(id) for each
  // special token, in order.
  void Partition(std::string_view text, bool parse_special, std::span<const TextRange> literal,
                 const std::function<void(size_t, size_t)>& on_text,
                 const std::function<void(TokenId)>& on_token) const;
  // SentencePiece BPE of one text piece (with the space prefix if `prefix`).
  void EncodeSpm(std::string_view text, bool prefix, std::vector<TokenId>& out) const;
  // Appends the tokens of one final symbol (a vocab token or byte fallback).
  void EmitSymbol(std::string_view symbol, std::vector<TokenId>& out) const;
  // Byte-level BPE of one text piece / one pre-tokenized word.
  void EncodeBpe(std::string_view text, std::vector<TokenId>& out) const;
  void EncodeBpeWord(std::string_view word, BpeScratch& s, std::vector<TokenId>& out) const;
  // Merges s.symbols (characters of the encoded word `enc`) by merge rank.
  void MergeBpe(std::string_view enc, BpeScratch& s) const;
  std::string DecodeBpe(TokenId id, bool render_special) const;

  Vocabulary vocab_;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> ids_;
  TokenId byte_ids_[256];  // kNoToken where the vocab lacks <0xXX>
  // Special tokens (control, user-defined, unknown), longest text first.
  std::vector<TokenId> special_ids_;
  std::vector<TokenId> eog_ids_;  // sorted
  // kBpe: "left right" -> rank; GPT-2 byte alphabet both ways.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;
  // (left id, right id) -> (rank, merged token id or kNoToken).
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> pair_ranks_;
  TokenId byte_token_[256];  // the token of each byte's one-character text
  std::string byte_to_text_[256];
  std::unordered_map<uint32_t, uint8_t> codepoint_to_byte_;
  std::unique_ptr<PreTokenizer> pre_;
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
