// Tree-walking evaluator for parsed templates, with jinja2's scoping (a for loop or macro body
// is a new scope; if/set are not), loop variables, namespaces, macros and call blocks, and hard
// limits on steps, nesting depth and output size.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "template/ast.h"
#include "template/chat_template.h"
#include "template/value.h"

namespace meshnet::jinja {

class Interpreter {
 public:
  struct Frame {
    Dict vars;
    Frame* parent = nullptr;
    const Value* Lookup(std::string_view name) const;
    void Set(const std::string& name, Value v);
  };

  explicit Interpreter(const ChatTemplateOptions& opts) : opts_(opts) {}

  // Renders `program` with the given variables (which shadow the built-in globals).
  std::string Render(const Program& program, Dict context);

  // Calls a callable value (macro, global function, loop.cycle, caller).
  Value Call(const Value& callee, CallArgs& args);
  // Counts one evaluation step; throws when the budget is spent.
  void Step();
  // Checks a produced string or list against the size limits.
  void CheckSize(size_t string_bytes, size_t list_items = 0) const;
  const ChatTemplateOptions& options() const { return opts_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct DepthGuard {
    explicit DepthGuard(Interpreter* i);
    ~DepthGuard() { --in->depth_; }
    Interpreter* in;
  };

  Flow Exec(const Body& body, Frame& frame, std::string& out);
  Flow ExecStmt(const Stmt& s, Frame& frame, std::string& out);
  void ExecFor(const Stmt& s, Frame& frame, std::string& out);
  void ExecSet(const Stmt& s, Frame& frame, std::string& out);
  void DefineMacro(const Stmt& s, Frame& frame);
  void ExecCallBlock(const Stmt& s, Frame& frame, std::string& out);
  Value CallMacro(const Stmt& macro, CallArgs& args, const Value& caller);
  void Write(std::string& out, std::string_view text) const;
  void Assign(Frame& frame, const std::vector<std::string>& targets, const Value& v) const;

  Value Eval(const Expr& e, Frame& frame);
  Value EvalName(const Expr& e, Frame& frame);
  Value EvalCall(const Expr& e, Frame& frame);
  Value EvalDict(const Expr& e, Frame& frame);
  CallArgs EvalArgs(const Expr& e, Frame& frame, size_t first);

  const ChatTemplateOptions& opts_;
  Frame globals_;
  Frame* root_ = nullptr;
  uint64_t steps_ = 0;
  int depth_ = 0;
  const Value* pipe_input_ = nullptr;  // the input of a block set's filter chain
};

// Attribute (`a.b`) and item (`a[b]`) access with jinja2's fallbacks: a missing key, index or
// attribute is undefined; access on undefined is an error.
Value GetAttr(const Value& obj, const std::string& name);
Value GetItem(const Value& obj, const Value& key);
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Binary operators with Python semantics (+ - * / // % ** ~ == != < <= > >= in notin).
Value BinaryOp(Interpreter& in, const std::string& op, const Value& a, const Value& b);

// Filters, tests and methods (filters.cc, methods.cc). `found` is set false for unknown names.
Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool ApplyTest(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
Value CallMethod(Interpreter& in, const Value& obj, const std::string& name, CallArgs& args,
                 bool* found);
// Built-in globals: raise_exception, strftime_now, namespace, range, dict.
Dict BuiltinGlobals();

}  // namespace meshnet::jinja
