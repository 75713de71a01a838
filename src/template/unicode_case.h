// Python's Unicode case operations on UTF-8 text (full case mappings, as str.lower() etc.), by
// ICU: str.lower, upper, capitalize, title, islower, isupper, and jinja2's `title` filter.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace meshnet::jinja {

std::string PyLower(std::string_view s);
std::string PyUpper(std::string_view s);
// str.capitalize: the first character in title case, the rest lower case.
std::string PyCapitalize(std::string_view s);
// str.title: a cased character after a cased one is lowered, any other titled.
std::string PyTitle(std::string_view s);
// jinja2's `title` filter: each run between spaces, '-', '(', '{', '[' and '<' gets its first
// character upper-cased and the rest lower-cased.
std::string JinjaTitle(std::string_view s);
// str.islower / str.isupper: some cased character, and none of the other case (or title case).
bool PyIsLower(std::string_view s);
bool PyIsUpper(std::string_view s);
// The work a case mapping of s costs beyond reading it (Interpreter::Charge units): ICU's
// per-character path is about ten times a byte copy; ASCII text costs nothing more.
uint64_t CaseMappingCost(std::string_view s);

}  // namespace meshnet::jinja
