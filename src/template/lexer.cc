#include "template/lexer.h"

#include <cstring>

#include "template/value.h"

namespace meshnet::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

[[noreturn]] void SyntaxError(const std::string& msg, int line) {
  throw TemplateError(ErrorKind::kMalformedFile,
                      "template syntax error: " + msg + " (line " + std::to_string(line) + ")");
}

// jinja2's lexer: newlines normalized to \n and one trailing newline dropped.
std::string Normalize(std::string_view src) {
  std::string s;
  s.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      s += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      s += src[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int HexValue(char c) {
  if (IsDigit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body (what jinja2 does).
std::string DecodeEscapes(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    char e = body[++i];
    static const char kSimple[] = "\\\\''\"\"n\nt\tr\rb\bf\fv\va\a";
    const char* hit = nullptr;
    for (size_t k = 0; kSimple[k] != '\0'; k += 2) {
      if (kSimple[k] == e) hit = &kSimple[k + 1];
    }
    if (hit != nullptr) {
      out += *hit;
      continue;
    }
    if (e == '\n') continue;  // line continuation
    if (e >= '0' && e <= '7') {
      uint32_t v = 0;
      size_t k = 0;
      for (; k < 3 && i + k < body.size() && body[i + k] >= '0' && body[i + k] <= '7'; ++k) {
        v = v * 8 + (body[i + k] - '0');
      }
      i += k - 1;
      AppendUtf8(out, v);
      continue;
    }
    size_t width = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    uint32_t v = 0;
    bool ok = width > 0;
    for (size_t k = 1; ok && k <= width; ++k) {
      int h = i + k < body.size() ? HexValue(body[i + k]) : -1;
      ok = h >= 0;
      v = v * 16 + (h < 0 ? 0 : h);
    }
    if (ok && v <= 0x10ffff) {
      AppendUtf8(out, v);
      i += width;
    } else {
      out += '\\';
      out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  std::vector<Token> Run() {
    while (pos_ < s_.size()) {
      size_t idx = FindTagStart(pos_);
      if (idx == std::string::npos) {
        Emit(TokenKind::kData, s_.substr(pos_));
        break;
      }
      char type = s_[idx + 1];
      char sign =
          idx + 2 < s_.size() && (s_[idx + 2] == '-' || s_[idx + 2] == '+') ? s_[idx + 2] : 0;
      std::string text = s_.substr(pos_, idx - pos_);
      StripText(text, type, sign);
      if (!text.empty()) Emit(TokenKind::kData, std::move(text));
      pos_ = idx + 2 + (sign ? 1 : 0);
      if (type == '#') {
        LexComment();
      } else if (type == '%' && TryRaw()) {
        continue;
      } else {
        LexTag(type == '{');
      }
    }
    tokens_.push_back({TokenKind::kEof, "", Line()});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && std::strchr("{%#", s_[i + 1]) != nullptr) return i;
    }
    return std::string::npos;
  }

  int Line() const {
    for (; line_pos_ < pos_ && line_pos_ < s_.size(); ++line_pos_) line_ += s_[line_pos_] == '\n';
    return line_;
  }

  void Emit(TokenKind kind, std::string value) {
    tokens_.push_back({kind, std::move(value), Line()});
  }

  // `-` strips all whitespace before the tag; otherwise lstrip_blocks strips spaces and tabs
  // between a line start and a block or comment tag.
  void StripText(std::string& text, char type, char sign) {
    if (sign == '-') {
      size_t end = text.size();
      while (size_t n = WhitespaceBefore(text, end)) end -= n;
      text.resize(end);
    } else if (sign != '+' && type != '{') {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        size_t i = l_pos;
        while (size_t n = WhitespaceAt(text, i)) i += n;
        bool all_space = l_pos < text.size() && i == text.size();
        if (all_space) text.resize(l_pos);
      }
    }
    line_starting_ = false;
  }

  void LexComment() {
    size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) SyntaxError("missing end of comment tag", Line());
    char sign = end > pos_ && (s_[end - 1] == '-' || s_[end - 1] == '+') ? s_[end - 1] : 0;
    pos_ = end + 2;
    ConsumeTagSuffix(sign, /*trim_blocks=*/true);
  }

  // After a tag end: `-` eats all whitespace, trim_blocks eats one newline (blocks/comments).
  void ConsumeTagSuffix(char sign, bool trim_blocks) {
    char last = s_[pos_ - 1];
    if (sign == '-') {
      while (size_t n = WhitespaceAt(s_, pos_)) {
        pos_ += n;
        last = s_[pos_ - 1];
      }
    } else if (sign != '+' && trim_blocks && pos_ < s_.size() && s_[pos_] == '\n') {
      last = s_[pos_++];
    }
    line_starting_ = last == '\n';
  }

  // {% raw %}...{% endraw %}: the body is data, untouched.
  bool TryRaw() {
    size_t p = pos_;
    while (p < s_.size() && IsSpace(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0 || (p + 3 < s_.size() && IsNameChar(s_[p + 3]))) return false;
    p += 3;
    while (p < s_.size() && IsSpace(s_[p])) ++p;
    if (s_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < s_.size() && IsSpace(s_[p])) ++p;
    } else if (s_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    for (size_t q = s_.find("{%", p); q != std::string::npos; q = s_.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = r < s_.size() && (s_[r] == '-' || s_[r] == '+') ? s_[r++] : 0;
      while (r < s_.size() && IsSpace(s_[r])) ++r;
      if (s_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < s_.size() && IsSpace(s_[r])) ++r;
      char end_sign = r < s_.size() && (s_[r] == '-' || s_[r] == '+') ? s_[r++] : 0;
      if (s_.compare(r, 2, "%}") != 0) continue;
      std::string text = s_.substr(p, q - p);
      line_starting_ = false;
      StripText(text, '%', sign);
      if (!text.empty()) Emit(TokenKind::kData, std::move(text));
      pos_ = r + 2;
      ConsumeTagSuffix(end_sign, true);
      return true;
    }
    SyntaxError("missing end of raw directive", Line());
  }

  void LexTag(bool variable) {
    Emit(variable ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "");
    int depth = 0;
    const char* end = variable ? "}}" : "%}";
    while (true) {
      while (size_t n = WhitespaceAt(s_, pos_)) pos_ += n;
      if (pos_ >= s_.size())
        SyntaxError(variable ? "unexpected end of template, expected '}}'"
                             : "unexpected end of template, expected '%}'",
                    Line());
      if (depth == 0) {
        char sign = (s_[pos_] == '-' || (s_[pos_] == '+' && !variable)) ? s_[pos_] : 0;
        if (s_.compare(pos_ + (sign ? 1 : 0), 2, end) == 0) {
          pos_ += 2 + (sign ? 1 : 0);
          Emit(variable ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "");
          ConsumeTagSuffix(sign, /*trim_blocks=*/!variable);
          return;
        }
      }
      LexExprToken(depth);
    }
  }

  void LexExprToken(int& depth) {
    char c = s_[pos_];
    if (IsNameStart(c)) {
      size_t b = pos_;
      while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
      return Emit(TokenKind::kName, s_.substr(b, pos_ - b));
    }
    if (IsDigit(c)) return LexNumber();
    if (c == '\'' || c == '"') return LexString(c);
    static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (s_.compare(pos_, 2, op) == 0) {
        pos_ += 2;
        return Emit(TokenKind::kOp, op);
      }
    }
    if (std::strchr("+-*/%~()[]{}<>=.:|,;", c) == nullptr) {
      SyntaxError(std::string("unexpected char '") + c + "'", Line());
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (depth == 0) SyntaxError(std::string("unexpected '") + c + "'", Line());
      --depth;
    }
    ++pos_;
    Emit(TokenKind::kOp, std::string(1, c));
  }

  void LexNumber() {
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < s_.size() && (IsDigit(s_[pos_]) || (s_[pos_] == '_' && pos_ + 1 < s_.size() &&
                                                        IsDigit(s_[pos_ + 1]))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    bool after_dot =
        !tokens_.empty() && tokens_.back().kind == TokenKind::kOp && tokens_.back().value == ".";
    if (!after_dot && pos_ + 1 < s_.size() && s_[pos_] == '.' && IsDigit(s_[pos_ + 1])) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t save = pos_++;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ < s_.size() && IsDigit(s_[pos_])) {
        digits();
        is_float = true;
      } else {
        pos_ = save;
      }
    }
    std::string text;
    for (size_t i = b; i < pos_; ++i) {
      if (s_[i] != '_') text += s_[i];
    }
    Emit(is_float ? TokenKind::kFloat : TokenKind::kInt, text);
  }

  void LexString(char quote) {
    size_t b = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) pos_ += s_[pos_] == '\\' ? 2 : 1;
    if (pos_ >= s_.size()) SyntaxError("unexpected end of string", Line());
    std::string body = s_.substr(b, pos_ - b);
    ++pos_;
    Emit(TokenKind::kString, DecodeEscapes(body));
  }

  std::string s_;
  size_t pos_ = 0;
  mutable size_t line_pos_ = 0;
  mutable int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) { return Lexer(Normalize(source)).Run(); }

}  // namespace meshnet::jinja
