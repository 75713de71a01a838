// The per-`pre` regex lists follow llama.cpp's llm_tokenizer_bpe (read from
// its llama-vocab.cpp; the regexes are the tokenizers' published patterns,
// with `(?i:'s|...)` spelled case by case as llama.cpp does).
#include "model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <functional>
#include <utility>

#include "util/error.h"

namespace meshnet::model {

namespace {

// GPT-2's pattern (also the last step of several others).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's Latin/Greek/Cyrillic/... letter ranges, as published.
constexpr const char* kDeepseekLetters =
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd"
    "\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-"
    "\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
    "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+";
constexpr const char* kDeepseekPunct =
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+";
constexpr const char* kCjk = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";

struct PreSpec {
  std::vector<std::string> names;
  std::vector<const char*> regexes;
  bool ignore_merges = false;
  bool add_bos = false;
};

const std::vector<PreSpec>& Specs() {
  static const std::vector<PreSpec> kSpecs = {
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
      {{"deepseek-llm"},
       {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2}},
      // gpt-neox: llama.cpp has no own entry (NeoX-tokenizer models such as
      // mpt and olmo use GPT-2's pattern, which is what GPT-NeoX's ByteLevel
      // pre-tokenizer applies).
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "gpt-neox"}, {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
      {{"poro-chat", "bloom", "gpt3-finnish"},
       {" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"}},
  };
  return kSpecs;
}

const PreSpec* FindSpec(std::string_view pre) {
  for (const PreSpec& spec : Specs()) {
    for (const std::string& name : spec.names) {
      if (name == pre) return &spec;
    }
  }
  return nullptr;
}

using Sink = std::function<void(size_t, size_t)>;

// Per-thread match state: PCRE2 match data is mutable, so each thread keeps
// its own (the compiled patterns are shared).
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(md);
  }
};

MatchState& State() {
  thread_local MatchState state;
  return state;
}

size_t Utf8Len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

}  // namespace

struct PreTokenizer::Regexes {
  std::vector<pcre2_code*> codes;
  ~Regexes() {
    for (pcre2_code* c : codes) pcre2_code_free(c);
  }

  // Splits text[begin, end) with regex `level` and hands each piece to the
  // next level (or to `sink` after the last): depth first, so memory stays
  // O(levels) however long the text.
  void Run(std::string_view text, size_t begin, size_t end, size_t level, const Sink& sink) const {
    if (level == codes.size()) {
      sink(begin, end);
      return;
    }
    MatchState& st = State();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + begin);
    const size_t len = end - begin;
    size_t start = 0;  // first byte not yet emitted
    size_t pos = 0;    // where the next search starts
    while (pos <= len) {
      const int rc =
          pcre2_match(codes[level], subject, len, pos, PCRE2_NO_UTF_CHECK, st.md, st.ctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        ThrowInvalidArgument(std::string("tokenizer: pre-tokenizer regex failed: ") +
                             reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
      const size_t mb = ov[0], me = ov[1];
      if (me == mb) {  // an empty match splits nothing: step one character on
        if (mb >= len) break;
        pos = mb + Utf8Len(static_cast<unsigned char>(text[begin + mb]));
        continue;
      }
      if (mb > start) Run(text, begin + start, begin + mb, level + 1, sink);
      Run(text, begin + mb, begin + me, level + 1, sink);
      start = pos = me;
    }
    if (start < len) Run(text, begin + start, end, level + 1, sink);
  }
};

const std::vector<std::string>& PreTokenizer::SupportedNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const PreSpec& spec : Specs())
      names.insert(names.end(), spec.names.begin(), spec.names.end());
    return names;
  }();
  return kNames;
}

PreTokenizer::PreTokenizer(std::string_view pre) : re_(std::make_unique<Regexes>()) {
  const PreSpec* spec = FindSpec(pre);
  if (spec == nullptr) {
    std::string known;
    for (const std::string& name : SupportedNames()) known += (known.empty() ? "" : ", ") + name;
    throw Error(ErrorKind::kMalformedFile, "tokenizer: tokenizer.ggml.pre '" + std::string(pre) +
                                               "' is not supported (supported: " + known + ")");
  }
  ignore_merges_ = spec->ignore_merges;
  default_add_bos_ = spec->add_bos;
  for (const char* pattern : spec->regexes) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw Error(ErrorKind::kMalformedFile, std::string("tokenizer: pre-tokenizer regex for '") +
                                                 std::string(pre) + "' does not compile at " +
                                                 std::to_string(offset) + ": " +
                                                 reinterpret_cast<const char*>(msg));
    }
    re_->codes.push_back(code);
    // JIT is an optimization: without it (e.g. no JIT support on this CPU)
    // pcre2_match interprets the same pattern.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::Split(std::string_view text, std::vector<size_t>& bounds) const {
  ForEachWord(text, [&bounds](size_t b, size_t e) {
    bounds.push_back(b);
    bounds.push_back(e);
  });
}

void PreTokenizer::ForEachWord(std::string_view text,
                               const std::function<void(size_t, size_t)>& sink) const {
  if (text.empty()) return;
  re_->Run(text, 0, text.size(), 0, sink);
}

std::string_view SanitizeUtf8(std::string_view text, std::string& storage) {
  // Length of the valid sequence at i, or 0.
  auto valid_at = [&text](size_t i) -> size_t {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) return 1;
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4, cp = c & 0x07;
    } else {
      return 0;
    }
    if (i + n > text.size()) return 0;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return n + 8;  // bad value
    return n;
  };
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = valid_at(i);
    if (n == 0 || n > 4) break;
    i += n;
  }
  if (i == text.size()) return text;
  storage.assign(text.substr(0, i));
  while (i < text.size()) {
    const size_t n = valid_at(i);
    if (n >= 1 && n <= 4) {
      storage.append(text.substr(i, n));
      i += n;
    } else {
      storage.append("\xEF\xBF\xBD");
      i += n == 0 ? 1 : n - 8;  // llama.cpp: one U+FFFD per byte of a broken sequence
    }
  }
  return storage;
}

}  // namespace meshnet::model
