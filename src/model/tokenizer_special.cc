// Special tokens (llama.cpp's rules), Tokenize/Encode, and reading a
// tokenizer from a GGUF file with validation.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace meshnet::model {

namespace {

// End-of-turn tokens llama.cpp finds by text when the GGUF names none.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek
    "<end_of_utterance>"};
// Tokens llama.cpp treats as end of generation by text.
constexpr std::string_view kEogTexts[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>",
                                          "<|return|>",    "<|call|>",        "<end_of_turn>",
                                          "<|endoftext|>", "<|eom_id|>",      "<EOT>",
                                          "_<EOT>",        "<|end_of_text|>", "<end_of_utterance>"};

// C's isspace in the "C" locale, as llama.cpp strips with.
bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

bool IsSpecialType(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

}  // namespace

void Tokenizer::InitSpecial() {
  auto mark_control = [this](TokenId id) {
    // llama.cpp: a control-looking token of another type is made control.
    vocab_.types[id] = TokenType::kControl;
  };
  if (vocab_.eot_id == kNoToken) {
    for (std::string_view text : kEotTexts) {
      if (const TokenId id = Find(text); id != kNoToken) {
        vocab_.eot_id = id;
        mark_control(id);
        break;
      }
    }
  }
  if (vocab_.eom_id == kNoToken) {
    if (const TokenId id = Find("<|eom_id|>"); id != kNoToken) {
      vocab_.eom_id = id;
      mark_control(id);
    }
  }
  for (std::string_view text : kEogTexts) {
    if (const TokenId id = Find(text); id != kNoToken) {
      eog_ids_.push_back(id);
      mark_control(id);
    }
  }
  for (TokenId id : {vocab_.eos_id, vocab_.eot_id, vocab_.eom_id}) {
    if (id != kNoToken) eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

  for (size_t i = 0; i < vocab_.tokens.size(); ++i) {
    if (IsSpecialType(vocab_.types[i]) && !vocab_.tokens[i].empty()) {
      special_ids_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(), [this](TokenId a, TokenId b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });
}

void Tokenizer::InitStrip() {
  const size_t n = vocab_.tokens.size();
  if (!vocab_.strip.empty()) {
    if (vocab_.strip.size() != n) {
      throw Error(ErrorKind::kMalformedFile,
                  "tokenizer: has " + std::to_string(vocab_.strip.size()) +
                      " strip attributes for " + std::to_string(n) + " tokens");
    }
    return;
  }
  vocab_.strip.assign(n, 0);
  auto set = [this](std::string_view text, uint8_t bit, bool on) {
    if (const TokenId id = Find(text); id != kNoToken) {
      vocab_.strip[id] = on ? (vocab_.strip[id] | bit) : (vocab_.strip[id] & ~bit);
    }
  };
  std::string name = vocab_.model_name;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string& pre = vocab_.pre;
  if (pre.find("jina-v2-de") != std::string::npos || pre.find("jina-v2-es") != std::string::npos ||
      pre.find("jina-v2-code") != std::string::npos) {
    set("<mask>", kStripLeft, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : special_ids_) vocab_.strip[id] |= kStripRight;
    set("</s>", kStripRight, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, kStripRight, false);
  }
}

bool Tokenizer::IsEog(TokenId id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

namespace {

// Whether [b, e) overlaps a range of `literal` (sorted, disjoint).
bool OverlapsLiteral(std::span<const TextRange> literal, size_t b, size_t e) {
  auto it = std::upper_bound(literal.begin(), literal.end(), b,
                             [](size_t pos, const TextRange& r) { return pos < r.end; });
  return it != literal.end() && it->begin < e;
}

}  // namespace

void Tokenizer::Partition(std::string_view text, bool parse_special,
                          std::span<const TextRange> literal,
                          const std::function<void(size_t, size_t)>& on_text,
                          const std::function<void(TokenId)>& on_token) const {
  // A fragment is a special token (id) or a text range [b, e) (id kNoToken).
  struct Fragment {
    TokenId id;
    size_t b, e;
  };
  std::vector<Fragment> frags = {{kNoToken, 0, text.size()}}, next;
  // Each special token, longest first, cuts every remaining text fragment at
  // each of its occurrences (llama.cpp's order, so overlaps resolve alike).
  for (TokenId id : special_ids_) {
    const TokenType type = vocab_.types[id];
    if (!parse_special && type != TokenType::kUserDefined) continue;
    const std::string& t = vocab_.tokens[id];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id != kNoToken) {
        next.push_back(f);
        continue;
      }
      const std::string_view scope = text.substr(0, f.e);
      const uint8_t strip = vocab_.strip[id];
      size_t pos = f.b, search = f.b;
      for (size_t m; (m = scope.find(t, search)) != std::string_view::npos;) {
        if (type != TokenType::kUserDefined && OverlapsLiteral(literal, m, m + t.size())) {
          search = m + 1;  // literal text: no control token here
          continue;
        }
        size_t left_end = m;
        while ((strip & kStripLeft) && left_end > pos && IsAsciiSpace(text[left_end - 1])) {
          --left_end;
        }
        if (left_end > pos) next.push_back({kNoToken, pos, left_end});
        next.push_back({id, 0, 0});
        pos = m + t.size();
        while ((strip & kStripRight) && pos < f.e && IsAsciiSpace(text[pos])) ++pos;
        search = pos;
      }
      if (pos < f.e) next.push_back({kNoToken, pos, f.e});
    }
    frags.swap(next);
  }
  for (const Fragment& f : frags) {
    if (f.id != kNoToken) {
      on_token(f.id);
    } else {
      on_text(f.b, f.e);
    }
  }
}

std::vector<TokenId> Tokenizer::Tokenize(std::string_view text, bool add_special,
                                         bool parse_special) const {
  return Tokenize(text, add_special, parse_special, {});
}

std::vector<TokenId> Tokenizer::Tokenize(std::string_view text, bool add_special,
                                         bool parse_special,
                                         std::span<const TextRange> literal) const {
  std::vector<TokenId> out;
  if (add_special && vocab_.add_bos) {
    if (vocab_.bos_id == kNoToken) {
      ThrowInvalidArgument("tokenizer: add_bos_token is set but the vocabulary has no BOS");
    }
    out.push_back(vocab_.bos_id);
  }
  bool prev_special = true;  // SentencePiece: a space prefix at the start and after a special
  Partition(
      text, parse_special, literal,
      [&](size_t b, size_t e) {
        const std::string_view piece = text.substr(b, e - b);
        if (vocab_.kind == TokenizerKind::kBpe) {
          EncodeBpe(piece, out);
        } else {
          EncodeSpm(piece, vocab_.add_space_prefix && prev_special, out);
        }
        prev_special = false;
      },
      [&](TokenId id) {
        out.push_back(id);
        prev_special = true;
      });
  if (add_special && vocab_.add_eos) {
    if (vocab_.eos_id == kNoToken) {
      ThrowInvalidArgument("tokenizer: add_eos_token is set but the vocabulary has no EOS");
    }
    out.push_back(vocab_.eos_id);
  }
  return out;
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  if (add_bos && vocab_.bos_id == kNoToken) {
    ThrowInvalidArgument("tokenizer: the vocabulary has no BOS");
  }
  std::vector<TokenId> out = Tokenize(text, /*add_special=*/false, /*parse_special=*/false);
  if (add_bos) out.insert(out.begin(), vocab_.bos_id);
  return out;
}

namespace {

// Special ids: absent, or stored as UINT32_MAX / -1, mean "none"; anything
// else outside the vocabulary is refused.
TokenId SpecialId(const gguf::GgufFile& file, const char* key, size_t n_tokens) {
  const std::optional<int64_t> v = file.GetI64(key);
  if (!v || *v == -1 || *v == 0xFFFFFFFFll) return kNoToken;
  if (*v < 0 || *v >= static_cast<int64_t>(n_tokens)) {
    throw Error(ErrorKind::kMalformedFile, file.name() + ": " + key + " = " + std::to_string(*v) +
                                               " is outside the vocabulary of " +
                                               std::to_string(n_tokens) + " tokens");
  }
  return static_cast<TokenId>(*v);
}

}  // namespace

Tokenizer Tokenizer::FromGguf(const gguf::GgufFile& file) {
  const std::string_view model = file.RequireString(gguf_keys::kTokenizerModel);
  Vocabulary vocab;
  if (model == "gpt2") {
    vocab.kind = TokenizerKind::kBpe;
  } else if (model != "llama") {
    throw Error(ErrorKind::kMalformedFile,
                file.name() + ": " + gguf_keys::kTokenizerModel + " '" + std::string(model) +
                    "' is not supported (supported: 'llama' SentencePiece BPE, 'gpt2' byte-level "
                    "BPE)");
  }
  const auto tokens = file.RequireStringArray(gguf_keys::kTokens);
  vocab.tokens.assign(tokens.begin(), tokens.end());
  if (vocab.kind == TokenizerKind::kSpm) {
    vocab.scores = file.RequireF32Array(gguf_keys::kScores);
  } else {
    const auto merges = file.GetStringArray(gguf_keys::kMerges);
    if (!merges) {
      throw Error(ErrorKind::kMalformedFile,
                  file.name() + ": byte-level BPE without " + gguf_keys::kMerges);
    }
    vocab.merges.assign(merges->begin(), merges->end());
    // An absent pre is llama.cpp's "default" (files written before the key existed).
    vocab.pre = std::string(file.GetString(gguf_keys::kPre, "default"));
    if (auto scores = file.GetF32Array(gguf_keys::kScores)) vocab.scores = std::move(*scores);
  }
  if (auto types = file.GetI32Array(gguf_keys::kTokenType)) {
    vocab.types.reserve(types->size());
    for (int32_t t : *types) vocab.types.push_back(static_cast<TokenType>(t));
  }
  const size_t n = vocab.tokens.size();
  vocab.bos_id = SpecialId(file, gguf_keys::kBosId, n);
  vocab.eos_id = SpecialId(file, gguf_keys::kEosId, n);
  vocab.unk_id = SpecialId(file, gguf_keys::kUnknownId, n);
  vocab.eot_id = SpecialId(file, gguf_keys::kEotId, n);
  vocab.eom_id = SpecialId(file, gguf_keys::kEomId, n);
  bool default_add_bos = true;
  if (vocab.kind == TokenizerKind::kBpe) {
    try {
      default_add_bos = PreTokenizer(vocab.pre).default_add_bos();
    } catch (const Error& e) {
      throw Error(e.kind(), file.name() + ": " + e.what());
    }
  }
  vocab.add_bos = file.GetBool(gguf_keys::kAddBos, default_add_bos);
  vocab.add_eos = file.GetBool(gguf_keys::kAddEos, false);
  vocab.add_space_prefix = file.GetBool(gguf_keys::kAddSpacePrefix, true);
  vocab.chat_template = std::string(file.GetString(gguf_keys::kChatTemplate, ""));
  vocab.model_name = std::string(file.GetString(gguf_keys::kName, ""));
  try {
    return Tokenizer(std::move(vocab));
  } catch (const Error& e) {
    throw Error(e.kind(), file.name() + ": " + e.what());
  }
}

}  // namespace meshnet::model
