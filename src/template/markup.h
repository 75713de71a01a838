// markupsafe's Markup as jinja2 renders it with autoescape off (HF's environment), and Python's
// string formatting (`%` and str.format), which Markup changes:
//  - `|safe` makes a Markup, `|e` / `|escape` escape a plain value into one (a Markup stays
//    as it is), `|forceescape` escapes either;
//  - Markup + str, str + Markup, Markup % args, Markup.format(args) and Markup.join(items)
//    HTML-escape the plain side (& < > ' " become &amp; &lt; &gt; &#39; &#34;) and give a
//    Markup; Markup * n, slices, case and strip methods and split() keep it a Markup, and its
//    replace() and strip(chars) escape their arguments (markupsafe 2.1, Debian bookworm's);
//  - `~`, `|join`, `|replace`, `|title`, macros and `{% set %}` blocks give plain strings
//    (autoescape is off), and `{{ }}` prints a Markup's text unchanged.
#pragma once

#include <string>
#include <string_view>

#include "template/value.h"

namespace meshnet::jinja {

class Interpreter;

// markupsafe.escape's text.
std::string HtmlEscape(std::string_view s);
// markupsafe.escape(v): a Markup as it is, anything else its str() escaped.
Value Escape(const Value& v);
// jinja2's soft_str: a Markup stays one, anything else becomes its str().
Value SoftStr(const Value& v);
// A str result of an operation on `like`: a Markup when `like` is one.
Value StrLike(const Value& like, std::string s);

// Python's `fmt % arg` (printf-style: %s %r %a %d %i %u %o %x %X %e %E %f %F %g %G %c %%, with
// (name), flags, width and precision). `arg` is a tuple of arguments, a mapping, or one value.
Value PercentFormat(Interpreter& in, const Value& fmt, const Value& arg);
// Python's fmt.format(*args, **kwargs): {} {0} {name} {0[key]} {0.attr}, !s !r conversions and
// format specs ([[fill]align][sign][0][width][.precision][type]).
Value StrFormat(Interpreter& in, const Value& fmt, const CallArgs& args);

}  // namespace meshnet::jinja
