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

// Thrown by Interpreter::EvalConstant for an expression that is not a constant.
struct NotConstant {};

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

  // Evaluates `e` as jinja2's as_const does when it folds constants at compile time: throws
  // NotConstant at a variable, a call or a filter that needs the context; slices are lenient.
  Value EvalConstant(const Expr& e);

  // Calls a callable value (macro, global function, loop.cycle, caller).
  Value Call(const Value& callee, CallArgs& args);
  // Counts one evaluation step; throws when the budget is spent or the render is cancelled.
  void Step();
  // Counts `units` of work (bytes read or built, items visited); throws past max_work.
  void Charge(uint64_t units);
  // What reading or building `v` once costs: a string's bytes, kItemCost per list item.
  static uint64_t Cost(const Value& v);
  static constexpr uint64_t kItemCost = 16;
  // Checks a produced string or list against the size limits.
  void CheckSize(size_t string_bytes, size_t list_items = 0) const;
  const ChatTemplateOptions& options() const { return opts_; }
  // Whether the step or work budget is spent.
  bool Exhausted() const { return steps_ >= opts_.max_steps || work_ >= opts_.max_work; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct DepthGuard {
    explicit DepthGuard(Interpreter* i);
    ~DepthGuard() { --in->depth_; }
    Interpreter* in;
  };

  Flow Exec(const Body& body, Frame& frame, std::string& out);
  Flow ExecStmt(const Stmt& s, Frame& frame, std::string& out);
  Flow ExecFor(const Stmt& s, Frame& frame, std::string& out);
  Flow ExecSet(const Stmt& s, Frame& frame, std::string& out);
  void DefineMacro(const Stmt& s, Frame& frame);
  void ExecCallBlock(const Stmt& s, Frame& frame, std::string& out);
  Value CallMacro(const Stmt& macro, CallArgs& args);
  void Write(std::string& out, std::string_view text);
  void Assign(Frame& frame, const std::vector<std::string>& targets, const Value& v) const;

  Value Eval(const Expr& e, Frame& frame);
  Value EvalName(const Expr& e, Frame& frame);
  Value EvalCall(const Expr& e, Frame& frame);
  Value EvalDict(const Expr& e, Frame& frame);
  Value EvalNode(const Expr& e, Frame& frame);
  Value EvalAccess(const Expr& e, Frame& frame);
  Value EvalFilterOrTest(const Expr& e, Frame& frame);
  void PollCancelled() const;
  CallArgs EvalArgs(const Expr& e, Frame& frame, size_t first);

  const ChatTemplateOptions& opts_;
  Frame globals_;
  Frame* root_ = nullptr;
  uint64_t steps_ = 0;
  uint64_t work_ = 0;
  uint64_t next_poll_ = 1 << 20;  // work_ at which cancellation is polled next
  int depth_ = 0;
  const Value* pipe_input_ = nullptr;  // the input of a block set's filter chain
  bool folding_ = false;               // evaluating an output as jinja2's constant folding
};

// a * b for size checks, saturating at SIZE_MAX instead of wrapping.
inline size_t ScaledSize(size_t a, size_t b) {
  size_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

// Attribute (`a.b`) and item (`a[b]`) access with jinja2's fallbacks: a missing key, index or
// attribute is undefined; access on undefined is an error.
Value GetAttr(const Value& obj, const std::string& name);
Value GetItem(const Value& obj, const Value& key);
// `lenient`: a slice that Python refuses with a TypeError (a float index, an object that is not
// a sequence) gives undefined, as jinja2's environment.getitem does when it folds constants.
// Charges a step other than 1 per item picked.
Value Slice(Interpreter& in, const Value& obj, const Value& start, const Value& stop,
            const Value& step, bool lenient = false);
// Binary operators with Python semantics (+ - * / // % ** ~ == != < <= > >= in notin).
Value BinaryOp(Interpreter& in, const std::string& op, const Value& a, const Value& b);

// Filters, tests and methods (filters.cc, methods.cc). `found` is set false for unknown names.
Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool ApplyTest(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
Value CallMethod(Interpreter& in, const Value& obj, const std::string& name, CallArgs& args,
                 bool* found);
// Built-in globals: raise_exception, strftime_now, namespace, range, dict.
Dict BuiltinGlobals();

// jinja2's compile-time constant folding (its optimizer), which changes what some templates
// render: a constant expression (no variable, call or context filter) is replaced by its
// value when that value is plain data (none, numbers, strings, Markup, lists, dicts), and an
// output `{{ e }}` by whatever value e folds to, undefined included. Folding evaluates slices
// leniently (a float index or an object that is not a sequence gives undefined), so
// `{{ none[::-1] }}` renders "" where `{{ x[::-1] }}` with x = none fails.
void FoldConstants(Program& program);

}  // namespace meshnet::jinja
