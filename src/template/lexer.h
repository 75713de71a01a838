// Jinja lexer with jinja2's whitespace rules as Hugging Face configures them: trim_blocks
// (the first newline after a block or comment tag is dropped), lstrip_blocks (spaces and tabs
// before a block or comment tag on its own line are dropped), `-` and `+` modifiers on tags,
// keep_trailing_newline=False, newlines normalized to "\n".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshnet::jinja {

enum class TokenKind {
  kData,        // template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value is the decoded string
  kInt,
  kFloat,
  kOp,  // operators and punctuation: + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | ,
  kEof,
};

struct Token {
  TokenKind kind;
  std::string value;
  int line = 1;
};

// Throws TemplateError (kMalformedFile) on an unterminated tag, comment or string, or an
// unknown character.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace meshnet::jinja
