// SentencePiece BPE encode/decode over a GGUF vocabulary.
//
// Encode works on one prepared string (space prefix, ' ' -> "▁"). Symbols are
// byte ranges of that string linked in a list; two adjacent symbols are always
// contiguous, so the text of a candidate merge is a substring and is looked up
// without allocating. The heap holds candidate bigrams; a bigram is stale once
// either side has changed length (a symbol only grows by absorbing its right
// neighbour, whose length then becomes 0), and stale entries are skipped when
// popped. Every merge adds at most two bigrams, so the heap sees O(n) pushes.
#include "model/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <queue>
#include <string>
#include <utility>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "model/pretokenizer.h"
#include "util/error.h"

namespace meshnet::model {

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";     // U+2581 "▁"
constexpr std::string_view kUnknownPiece = " \xE2\x81\x87 ";  // " ⁇ "

[[noreturn]] void Malformed(const std::string& message) {
  throw Error(ErrorKind::kMalformedFile, "tokenizer: " + message);
}

// Length of the UTF-8 sequence led by `c`; 1 for ASCII and for bytes that
// cannot lead a sequence.
int Utf8SeqLen(unsigned char c) {
  if (c < 0xC0) return 1;
  if (c < 0xE0) return 2;
  if (c < 0xF0) return 3;
  if (c < 0xF8) return 4;
  return 1;
}

// Length of the SentencePiece symbol at text[pos], as llama.cpp splits text (its
// unicode_len_utf8): the lead byte's high bits alone decide (0xC_/0xD_: 2, 0xE_: 3, 0xF_: 4,
// anything else 1), cut at the end of the text, without checking continuation bytes - so a
// broken sequence swallows the bytes after it, and the symbol falls back to byte tokens.
size_t CharLen(std::string_view text, size_t pos) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  const size_t len = kLen[static_cast<unsigned char>(text[pos]) >> 4];
  return std::min(len, text.size() - pos);
}

// The byte value of "<0xXX>", or -1.
int ParseByteToken(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  int value = 0;
  for (char c : s.substr(3, 2)) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + d;
  }
  return value;
}

struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the prepared text
  size_t len;     // 0 once merged into its left neighbour
};

struct Bigram {
  float score;
  int left;
  size_t len;
};

// Highest score first; among equal scores the leftmost.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

size_t Tokenizer::StringHash::operator()(std::string_view s) const noexcept {
  return std::hash<std::string_view>{}(s);
}

Tokenizer::Tokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.tokens.size();
  if (n == 0) Malformed("the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) Malformed("the vocabulary is too large");
  if (vocab_.kind == TokenizerKind::kBpe && vocab_.scores.empty()) vocab_.scores.assign(n, 0.0f);
  if (vocab_.scores.size() != n) {
    Malformed("has " + std::to_string(vocab_.scores.size()) + " scores for " + std::to_string(n) +
              " tokens");
  }
  if (vocab_.types.empty()) {
    vocab_.types.resize(n, TokenType::kNormal);
    for (size_t i = 0; vocab_.kind == TokenizerKind::kSpm && i < n; ++i) {
      if (ParseByteToken(vocab_.tokens[i]) >= 0) vocab_.types[i] = TokenType::kByte;
    }
  }
  if (vocab_.types.size() != n) {
    Malformed("has " + std::to_string(vocab_.types.size()) + " token types for " +
              std::to_string(n) + " tokens");
  }
  for (TokenId id : {vocab_.bos_id, vocab_.eos_id, vocab_.unk_id, vocab_.eot_id, vocab_.eom_id}) {
    if (id != kNoToken && (id < 0 || static_cast<size_t>(id) >= n)) {
      Malformed("special token id " + std::to_string(id) + " is outside the vocabulary of " +
                std::to_string(n));
    }
  }
  for (auto& b : byte_ids_) b = kNoToken;
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    const int type = static_cast<int>(vocab_.types[i]);
    if (type < 0 || type > static_cast<int>(TokenType::kByte)) {
      Malformed("token " + std::to_string(i) + " has unknown type " + std::to_string(type));
    }
    if (vocab_.types[i] == TokenType::kByte && vocab_.kind == TokenizerKind::kSpm) {
      const int value = ParseByteToken(vocab_.tokens[i]);
      if (value < 0) {
        Malformed("byte token " + std::to_string(i) + " is '" + vocab_.tokens[i] + "', not <0xXX>");
      }
      if (byte_ids_[value] == kNoToken) byte_ids_[value] = id;
    }
    // Duplicates keep their first id.
    ids_.emplace(vocab_.tokens[i], id);
  }
  InitSpecial();
  InitStrip();
  if (vocab_.kind == TokenizerKind::kBpe) InitBpe();
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::CheckId(TokenId id) const {
  if (id < 0 || id >= vocab_size()) {
    ThrowInvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(vocab_size()));
  }
}

const std::string& Tokenizer::TokenText(TokenId id) const {
  CheckId(id);
  return vocab_.tokens[id];
}

TokenType Tokenizer::Type(TokenId id) const {
  CheckId(id);
  return vocab_.types[id];
}

float Tokenizer::Score(TokenId id) const {
  CheckId(id);
  return vocab_.scores[id];
}

TokenId Tokenizer::Find(std::string_view text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? kNoToken : it->second;
}

bool Tokenizer::Mergeable(TokenId id) const {
  const TokenType t = vocab_.types[id];
  return t == TokenType::kNormal || t == TokenType::kUserDefined || t == TokenType::kUndefined;
}

void Tokenizer::EmitSymbol(std::string_view symbol, std::vector<TokenId>& out) const {
  const TokenId id = Find(symbol);
  if (id != kNoToken && Mergeable(id)) {
    out.push_back(id);
    return;
  }
  bool all_bytes = true;
  for (unsigned char c : symbol) all_bytes = all_bytes && byte_ids_[c] != kNoToken;
  if (all_bytes) {
    for (unsigned char c : symbol) out.push_back(byte_ids_[c]);
    return;
  }
  if (vocab_.unk_id == kNoToken) {
    ThrowInvalidArgument("tokenizer: no token, byte fallback or unknown token for '" +
                         std::string(symbol) + "'");
  }
  out.push_back(vocab_.unk_id);
}

void Tokenizer::EncodeSpm(std::string_view text, bool prefix, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  std::string prepared(prefix ? kSpaceMarker : "");
  prepared.reserve(text.size() * 2 + kSpaceMarker.size());
  for (char c : text) {
    if (c == ' ') {
      prepared += kSpaceMarker;
    } else {
      prepared += c;
    }
  }
  const std::string_view s = prepared;

  std::vector<Symbol> symbols;
  symbols.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = CharLen(s, pos);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, index + 1, pos, len});
    pos += len;
  }
  symbols.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> heap;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t len = symbols[left].len + symbols[right].len;
    const TokenId id = Find(s.substr(symbols[left].offset, len));
    if (id == kNoToken || !Mergeable(id)) return;
    heap.push({vocab_.scores[id], left, len});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!heap.empty()) {
    const Bigram b = heap.top();
    heap.pop();
    Symbol& left = symbols[b.left];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (left.len + right.len != b.len) continue;  // stale
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }

  for (int i = 0; i >= 0; i = symbols[i].next) {
    EmitSymbol(s.substr(symbols[i].offset, symbols[i].len), out);
  }
}

std::string Tokenizer::DecodePiece(TokenId prev_id, TokenId id, bool render_special) const {
  CheckId(id);
  if (vocab_.kind == TokenizerKind::kBpe) return DecodeBpe(id, render_special);
  const std::string& text = vocab_.tokens[id];
  switch (vocab_.types[id]) {
    case TokenType::kByte:
      return std::string(1, static_cast<char>(ParseByteToken(text)));
    case TokenType::kControl:
      return render_special ? text : "";
    case TokenType::kUnused:
      return "";
    case TokenType::kUnknown:
      return std::string(kUnknownPiece);
    case TokenType::kNormal:
    case TokenType::kUserDefined:
    case TokenType::kUndefined:
      break;
  }
  std::string piece;
  piece.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
      piece += ' ';
      pos += kSpaceMarker.size();
    } else {
      piece += text[pos++];
    }
  }
  const bool at_start = prev_id == kNoToken || (prev_id == vocab_.bos_id && prev_id != kNoToken);
  if (at_start && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  return piece;
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  TokenId prev = kNoToken;
  for (TokenId id : ids) {
    out += DecodePiece(prev, id, render_special);
    prev = id;
  }
  return out;
}

std::string Utf8Assembler::Push(std::string_view bytes) {
  pending_ += bytes;
  const size_t n = pending_.size();
  size_t cut = n;
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(pending_[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    if (static_cast<size_t>(Utf8SeqLen(c)) > back) cut = n - back;
    break;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string Utf8Assembler::Flush() { return std::exchange(pending_, std::string()); }

}  // namespace meshnet::model
