// Byte-level BPE (llama.cpp's LLAMA_VOCAB_TYPE_BPE, tokenizer.ggml.model
// "gpt2").
//
// Each pre-tokenized word is mapped to GPT-2's byte alphabet (every byte a
// printable code point), split into its characters, and merged like the
// SentencePiece path (model/tokenizer.cc): symbols are byte ranges of the
// encoded word in a linked list, a heap holds candidate pairs by merge rank
// (lowest first, then leftmost), and a popped pair is stale once its left
// symbol has grown. A final symbol that is not a token falls back to the
// tokens of its single bytes, as llama.cpp does.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace meshnet::model {

namespace {

[[noreturn]] void Malformed(const std::string& message) {
  throw Error(ErrorKind::kMalformedFile, "tokenizer: " + message);
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves; the
// other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) map to U+0100.. in order.
uint32_t ByteCodepoint(int b, int& next_extra) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  return printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next_extra++);
}

size_t Utf8Len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the encoded word
  size_t len;     // 0 once merged into its left neighbour
  TokenId id;     // the token whose text the symbol is, or kNoToken
};

struct Pair {
  int32_t rank;
  int left;
  size_t len;
  TokenId result;  // the merged symbol's token (kNoToken: look it up)
};

uint64_t PairKey(TokenId a, TokenId b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Lowest rank first; among equal ranks the leftmost.
struct PairOrder {
  bool operator()(const Pair& a, const Pair& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.left > b.left;
  }
};

}  // namespace

// Buffers reused across the words of one call, and a memo of the words seen
// in this call (BPE of a word is a pure function of its text; natural text
// repeats words, so most words skip the merge loop). The memo is bounded:
// short words only, and it is cleared when it reaches kMaxCachedWords.
struct Tokenizer::BpeScratch {
  static constexpr size_t kMaxCachedWords = 1 << 15;
  static constexpr size_t kMaxCachedWordBytes = 32;
  std::string encoded;
  std::string key;
  std::vector<Symbol> symbols;
  std::vector<Pair> heap;
  std::string sanitized;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>>
      cache;                        // word -> (offset, count) in cached_ids
  std::vector<TokenId> cached_ids;  // the cached words' tokens
};

void Tokenizer::InitBpe() {
  pre_ = std::make_unique<PreTokenizer>(vocab_.pre);
  int extra = 0;
  for (int b = 0; b < 256; ++b) AppendUtf8(ByteCodepoint(b, extra), byte_to_text_[b]);
  extra = 0;
  for (int b = 0; b < 256; ++b)
    codepoint_to_byte_[ByteCodepoint(b, extra)] = static_cast<uint8_t>(b);
  ranks_.reserve(vocab_.merges.size());
  for (size_t i = 0; i < vocab_.merges.size(); ++i) {
    const std::string& m = vocab_.merges[i];
    // llama.cpp splits at the first space after the first byte.
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= m.size()) {
      Malformed("merge " + std::to_string(i) + " '" + m + "' is not two symbols 'left right'");
    }
    if (i > static_cast<size_t>(INT32_MAX)) Malformed("too many merges");
    ranks_.emplace(m, static_cast<int32_t>(i));  // duplicates keep the lowest rank
    // The same merge by token ids, when both sides are tokens (always, in
    // real vocabularies): the hot path looks pairs up without hashing text.
    const TokenId a = Find(std::string_view(m).substr(0, space));
    const TokenId b = Find(std::string_view(m).substr(space + 1));
    if (a != kNoToken && b != kNoToken) {
      const std::string joined = m.substr(0, space) + m.substr(space + 1);
      pair_ranks_.emplace(PairKey(a, b), std::pair{static_cast<int32_t>(i), Find(joined)});
    }
  }
  for (int b = 0; b < 256; ++b) byte_token_[b] = Find(byte_to_text_[b]);
}

void Tokenizer::EncodeBpe(std::string_view text, std::vector<TokenId>& out) const {
  BpeScratch scratch;
  const std::string_view valid = SanitizeUtf8(text, scratch.sanitized);
  pre_->ForEachWord(valid, [&](size_t b, size_t e) {
    const std::string_view word = valid.substr(b, e - b);
    if (word.size() > BpeScratch::kMaxCachedWordBytes) {
      EncodeBpeWord(word, scratch, out);
      return;
    }
    if (const auto it = scratch.cache.find(word); it != scratch.cache.end()) {
      const auto [offset, count] = it->second;
      out.insert(out.end(), scratch.cached_ids.begin() + offset,
                 scratch.cached_ids.begin() + offset + count);
      return;
    }
    const size_t first = out.size();
    EncodeBpeWord(word, scratch, out);
    if (scratch.cache.size() >= BpeScratch::kMaxCachedWords) {
      scratch.cache.clear();
      scratch.cached_ids.clear();
    }
    scratch.cache.emplace(word, std::pair{static_cast<uint32_t>(scratch.cached_ids.size()),
                                          static_cast<uint32_t>(out.size() - first)});
    scratch.cached_ids.insert(scratch.cached_ids.end(), out.begin() + first, out.end());
  });
}

void Tokenizer::EncodeBpeWord(std::string_view word, BpeScratch& s,
                              std::vector<TokenId>& out) const {
  s.encoded.clear();
  for (unsigned char c : word) s.encoded += byte_to_text_[c];
  const std::string_view enc = s.encoded;
  if (pre_->ignore_merges()) {
    if (const TokenId id = Find(enc); id != kNoToken) {
      out.push_back(id);
      return;
    }
  }
  // One symbol per byte of the word (each byte is one character of the
  // encoded word), with its single-character token.
  s.symbols.clear();
  size_t pos = 0;
  for (unsigned char c : word) {
    const int index = static_cast<int>(s.symbols.size());
    const size_t len = byte_to_text_[c].size();
    s.symbols.push_back({index - 1, index + 1, pos, len, byte_token_[c]});
    pos += len;
  }
  s.symbols.back().next = -1;
  MergeBpe(enc, s);
  const std::vector<Symbol>& sym = s.symbols;
  for (int i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id != kNoToken) {
      out.push_back(sym[i].id);
      continue;
    }
    const std::string_view piece = enc.substr(sym[i].offset, sym[i].len);
    for (char c : piece) {  // llama.cpp: the tokens of the single bytes that have one
      if (const TokenId id = Find(std::string_view(&c, 1)); id != kNoToken) out.push_back(id);
    }
  }
}

void Tokenizer::MergeBpe(std::string_view enc, BpeScratch& s) const {
  std::vector<Symbol>& sym = s.symbols;
  std::vector<Pair>& heap = s.heap;  // a binary heap under PairOrder, reused across words
  heap.clear();
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t len = sym[left].len + sym[right].len;
    if (sym[left].id != kNoToken && sym[right].id != kNoToken) {
      const auto it = pair_ranks_.find(PairKey(sym[left].id, sym[right].id));
      if (it == pair_ranks_.end()) return;
      heap.push_back({it->second.first, left, len, it->second.second});
    } else {  // a side that is not a token: the merge table by text
      s.key.assign(enc.substr(sym[left].offset, sym[left].len));
      s.key += ' ';
      s.key.append(enc.substr(sym[right].offset, sym[right].len));
      const auto it = ranks_.find(std::string_view(s.key));
      if (it == ranks_.end()) return;
      heap.push_back({it->second, left, len, Find(enc.substr(sym[left].offset, len))});
    }
    std::push_heap(heap.begin(), heap.end(), PairOrder{});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), PairOrder{});
    const Pair p = heap.back();
    heap.pop_back();
    Symbol& left = sym[p.left];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = sym[left.next];
    if (left.len + right.len != p.len) continue;  // stale
    left.len += right.len;
    left.id = p.result;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = p.left;
    try_add(left.prev, p.left);
    try_add(p.left, left.next);
  }
}

std::string Tokenizer::DecodeBpe(TokenId id, bool render_special) const {
  const std::string& text = vocab_.tokens[id];
  switch (vocab_.types[id]) {
    case TokenType::kUserDefined:
      return text;
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special ? text : "";
    case TokenType::kUnused:
    case TokenType::kUndefined:
      return "";
    case TokenType::kNormal:
    case TokenType::kByte:
      break;
  }
  std::string piece;
  piece.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const auto c = static_cast<unsigned char>(text[pos]);
    const size_t len = std::min(Utf8Len(c), text.size() - pos);
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (text[pos + k] & 0x3F);
    const auto it = codepoint_to_byte_.find(cp);
    if (it != codepoint_to_byte_.end()) {
      piece += static_cast<char>(it->second);
    } else {
      piece.append(text, pos, len);  // not in the byte alphabet: as is
    }
    pos += len;
  }
  return piece;
}

}  // namespace meshnet::model
