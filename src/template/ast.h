// The parsed form of a template: expressions and statements as plain tagged nodes.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/chat_template.h"
#include "template/value.h"

namespace meshnet::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: items (tuples are lists too)
    kDict,     // args: key, value, key, value...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null children allowed)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is name(args[1..], kwargs)
    kUnary,    // name in {"-", "+", "not"} applied to args[0]
    kBinary,   // args[0] name args[1]; name: + - * / // % ** ~ == != < <= > >= in notin
    kAnd,
    kOr,
    kCond,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Type type;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Type {
    kText,       // text
    kOutput,     // {{ expr }}
    kIf,         // if expr: body else else_body (elif chains nest in else_body)
    kFor,        // for targets in expr [if cond]: body else else_body
    kSet,        // set targets = expr, or set name.attr = expr (attr non-empty)
    kSetBlock,   // set name [| filter]: body ; filter is an Expr with a null input (args[0])
    kMacro,      // macro name(params): body
    kCallBlock,  // call(caller params) expr: body
    kBreak,
    kContinue,
    kBlock,  // a transparent container ({% generation %})
  };
  Type type;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
  // A macro whose body names `caller`, `varargs` or `kwargs` takes a call block, extra
  // positional arguments, extra keyword arguments (jinja2 refuses them otherwise).
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  Body body;
  Body else_body;
};

struct Program {
  Body body;
};

// Parses a whole template; throws TemplateError (kMalformedFile) with jinja2-like messages.
std::unique_ptr<Program> ParseTemplate(std::string_view source);

}  // namespace meshnet::jinja
