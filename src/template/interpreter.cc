#include "template/interpreter.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>

namespace meshnet::jinja {

const Value* Interpreter::Frame::Lookup(std::string_view name) const {
  for (const Frame* f = this; f != nullptr; f = f->parent) {
    for (const auto& [k, v] : f->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Interpreter::Frame::Set(const std::string& name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

namespace {

bool PassesContext(const std::string& filter) {
  return filter == "map" || filter == "select" || filter == "reject" || filter == "selectattr" ||
         filter == "rejectattr";
}

}  // namespace

Value Interpreter::EvalConstant(const Expr& e) {
  Frame empty;
  folding_ = true;
  try {
    Value v = Eval(e, empty);
    folding_ = false;
    return v;
  } catch (...) {
    folding_ = false;
    throw;
  }
}

Interpreter::DepthGuard::DepthGuard(Interpreter* i) : in(i) {
  if (++in->depth_ > in->opts_.max_depth) {
    ThrowRuntime("template nesting exceeds the depth limit of " +
                 std::to_string(in->opts_.max_depth));
  }
}

void Interpreter::Step() {
  if (++steps_ > opts_.max_steps) {
    ThrowRuntime("template exceeds the step limit of " + std::to_string(opts_.max_steps));
  }
  if ((steps_ & 1023) == 0) PollCancelled();
}

void Interpreter::PollCancelled() const {
  if (opts_.cancelled && opts_.cancelled()) {
    throw TemplateError(ErrorKind::kUnavailable, "template rendering cancelled");
  }
}

void Interpreter::Charge(uint64_t units) {
  work_ = units > UINT64_MAX - work_ ? UINT64_MAX : work_ + units;
  if (work_ > opts_.max_work) {
    ThrowRuntime("template exceeds the work limit of " + std::to_string(opts_.max_work) +
                 " (bytes and items read, built or compared)");
  }
  if (work_ >= next_poll_) {
    next_poll_ = work_ + (1 << 20);
    PollCancelled();
  }
}

uint64_t Interpreter::Cost(const Value& v) {
  if (v.is_string()) return v.as_string().size();
  return v.is_list() || v.is_dict() ? v.width() * kItemCost : 1;
}

void Interpreter::CheckSize(size_t string_bytes, size_t list_items) const {
  if (string_bytes > opts_.max_output_bytes) {
    ThrowRuntime("template value exceeds the output limit of " +
                 std::to_string(opts_.max_output_bytes) + " bytes");
  }
  if (list_items > Value::kMaxItems) {
    ThrowRuntime("template list exceeds " + std::to_string(Value::kMaxItems) + " items");
  }
}

void Interpreter::Write(std::string& out, std::string_view text) {
  Charge(text.size());
  if (out.size() + text.size() > opts_.max_output_bytes) {
    ThrowRuntime("template output exceeds the limit of " + std::to_string(opts_.max_output_bytes) +
                 " bytes");
  }
  out.append(text);
}

std::string Interpreter::Render(const Program& program, Dict context) {
  globals_.vars = BuiltinGlobals();
  Frame root{std::move(context), &globals_};
  root_ = &root;
  std::string out;
  Exec(program.body, root, out);
  return out;
}

Interpreter::Flow Interpreter::Exec(const Body& body, Frame& frame, std::string& out) {
  for (const StmtPtr& s : body) {
    Flow flow = ExecStmt(*s, frame, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecStmt(const Stmt& s, Frame& frame, std::string& out) {
  Step();
  DepthGuard guard(this);
  switch (s.type) {
    case Stmt::Type::kText:
      Write(out, s.text);
      break;
    case Stmt::Type::kOutput:
      Write(out, Eval(*s.expr, frame).Str());
      break;
    case Stmt::Type::kIf:
      return Exec(Eval(*s.expr, frame).Truthy() ? s.body : s.else_body, frame, out);
    case Stmt::Type::kFor:
      return ExecFor(s, frame, out);
    case Stmt::Type::kSet:
    case Stmt::Type::kSetBlock:
      return ExecSet(s, frame, out);
    case Stmt::Type::kMacro:
      DefineMacro(s, frame);
      break;
    case Stmt::Type::kCallBlock:
      ExecCallBlock(s, frame, out);
      break;
    case Stmt::Type::kBreak:
      return Flow::kBreak;
    case Stmt::Type::kContinue:
      return Flow::kContinue;
    case Stmt::Type::kBlock:
      return Exec(s.body, frame, out);
  }
  return Flow::kNormal;
}

// {% call(params) macro(args) %}body{% endcall %}: the macro gets `caller`, which renders body.
void Interpreter::ExecCallBlock(const Stmt& s, Frame& frame, std::string& out) {
  const Stmt* block = &s;
  Frame* defining = &frame;
  auto caller = std::make_shared<Callable>(
      Callable{"caller", [this, block, defining](Interpreter&, CallArgs& args) -> Value {
                 Frame f{{}, defining};
                 for (size_t i = 0; i < block->params.size(); ++i) {
                   const Value* v = args.Get(i, block->params[i].first);
                   f.Set(block->params[i].first, v ? *v
                                                 : block->params[i].second
                                                     ? Eval(*block->params[i].second, f)
                                                     : Value());
                 }
                 std::string text;
                 Exec(block->body, f, text);
                 return Value(std::move(text));
               }});
  const Expr& call = *s.expr;
  Value callee = Eval(*call.args[0], frame);
  CallArgs args = EvalArgs(call, frame, 1);
  args.keywords.emplace_back("caller", Value(std::shared_ptr<const Callable>(caller)));
  Write(out, Call(callee, args).Str());
}

void Interpreter::Assign(Frame& frame, const std::vector<std::string>& targets,
                         const Value& v) const {
  if (targets.size() == 1) {
    frame.Set(targets[0], v);
    return;
  }
  List items = v.Iterate();
  if (items.size() != targets.size()) {
    ThrowRuntime("cannot unpack " + std::to_string(items.size()) + " values into " +
                 std::to_string(targets.size()) + " names");
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.Set(targets[i], items[i]);
}

namespace {

Value MakeLoop(const List& items, size_t i) {
  size_t n = items.size();
  Dict loop;
  loop.reserve(12);
  loop.emplace_back("index", Value(static_cast<int64_t>(i + 1)));
  loop.emplace_back("index0", Value(static_cast<int64_t>(i)));
  loop.emplace_back("revindex", Value(static_cast<int64_t>(n - i)));
  loop.emplace_back("revindex0", Value(static_cast<int64_t>(n - i - 1)));
  loop.emplace_back("first", Value(i == 0));
  loop.emplace_back("last", Value(i + 1 == n));
  loop.emplace_back("length", Value(static_cast<int64_t>(n)));
  loop.emplace_back("depth", Value(1));
  loop.emplace_back("depth0", Value(0));
  loop.emplace_back("previtem",
                    i > 0 ? items[i - 1] : Value(Undefined{"'loop.previtem' is undefined"}));
  loop.emplace_back("nextitem",
                    i + 1 < n ? items[i + 1] : Value(Undefined{"'loop.nextitem' is undefined"}));
  auto cycle = std::make_shared<Callable>(Callable{"cycle", [i](Interpreter&, CallArgs& a) {
                                                     if (a.positional.empty()) {
                                                       ThrowRuntime("no items for cycling given");
                                                     }
                                                     return a.positional[i % a.positional.size()];
                                                   }});
  loop.emplace_back("cycle", Value(std::shared_ptr<const Callable>(cycle)));
  return Value(std::move(loop));
}

}  // namespace

Interpreter::Flow Interpreter::ExecFor(const Stmt& s, Frame& frame, std::string& out) {
  Value iterable = Eval(*s.expr, frame);
  if (iterable.is_none()) ThrowRuntime("'NoneType' object is not iterable");
  Charge(Cost(iterable));
  List items = iterable.Iterate();
  if (s.cond) {  // the filter sees the loop target, not `loop`
    List kept;
    for (const Value& item : items) {
      Step();
      Frame f{{}, &frame};
      Assign(f, s.targets, item);
      if (Eval(*s.cond, f).Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  // jinja2 runs the else block unless some iteration reached the end of the body (one that
  // breaks or continues does not).
  bool completed = false;
  for (size_t i = 0; i < items.size(); ++i) {
    Step();
    Frame f{{}, &frame};
    Assign(f, s.targets, items[i]);
    f.Set("loop", MakeLoop(items, i));
    Flow flow = Exec(s.body, f, out);
    if (flow == Flow::kBreak) break;
    completed = completed || flow == Flow::kNormal;
  }
  // A break or continue in the else block belongs to the enclosing loop.
  return completed ? Flow::kNormal : Exec(s.else_body, frame, out);
}

Interpreter::Flow Interpreter::ExecSet(const Stmt& s, Frame& frame, std::string& out) {
  if (s.type == Stmt::Type::kSetBlock) {
    std::string text;
    Frame inner{{}, &frame};
    // A break or continue in the block leaves it (and the loop) without assigning, as jinja2's
    // inlined block does.
    if (Flow flow = Exec(s.body, inner, text); flow != Flow::kNormal) return flow;
    Value v(std::move(text));
    if (s.expr) {
      const Value* saved = pipe_input_;
      pipe_input_ = &v;
      Value filtered = Eval(*s.expr, frame);
      pipe_input_ = saved;
      v = std::move(filtered);
    }
    frame.Set(s.targets[0], std::move(v));
    return Flow::kNormal;
  }
  Value v = Eval(*s.expr, frame);
  if (s.attr.empty()) {
    Assign(frame, s.targets, v);
    return Flow::kNormal;
  }
  const Value* ns = frame.Lookup(s.targets[0]);
  if (ns == nullptr || !ns->is_namespace()) {
    ThrowRuntime("cannot assign attribute on non-namespace object");
  }
  if (v.holds_namespace())
    ThrowRuntime("a namespace attribute cannot hold a namespace or a function");
  Dict& attrs = ns->as_namespace().attrs;
  for (auto& [k, old] : attrs) {
    if (k == s.attr) {
      old = std::move(v);
      return Flow::kNormal;
    }
  }
  attrs.emplace_back(s.attr, std::move(v));
  return Flow::kNormal;
}

void Interpreter::DefineMacro(const Stmt& s, Frame& frame) {
  const Stmt* macro = &s;
  auto fn = std::make_shared<Callable>(Callable{
      s.text, [macro](Interpreter& in, CallArgs& args) { return in.CallMacro(*macro, args); }});
  frame.Set(s.text, Value(std::shared_ptr<const Callable>(fn)));
}

// jinja2's Macro.__call__: parameters from positional then keyword arguments; `caller`,
// `varargs` and `kwargs` only for a macro that names them, else extra arguments are an error.
Value Interpreter::CallMacro(const Stmt& macro, CallArgs& args) {
  DepthGuard guard(this);
  Frame f{{}, root_};
  auto keywords = args.keywords;
  auto take = [&](const std::string& name) -> std::optional<Value> {
    for (auto it = keywords.begin(); it != keywords.end(); ++it) {
      if (it->first == name) {
        Value v = std::move(it->second);
        keywords.erase(it);
        return v;
      }
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const auto& [name, def] = macro.params[i];
    std::optional<Value> v = i < args.positional.size() ? args.positional[i] : take(name);
    f.Set(name, v                ? *v
                : def != nullptr ? Eval(*def, f)
                                 : Value(Undefined{"parameter '" + name + "' was not provided"}));
  }
  if (macro.uses_caller) {
    std::optional<Value> caller = take("caller");
    f.Set("caller", caller ? *caller : Value(Undefined{"No caller defined"}));
  }
  if (macro.uses_kwargs) {
    f.Set("kwargs", Value(Dict(keywords.begin(), keywords.end())));
  } else if (!keywords.empty()) {
    ThrowRuntime(keywords[0].first == "caller"
                     ? "macro '" + macro.text +
                           "' was invoked with two values for the special caller argument"
                     : "macro '" + macro.text + "' takes no keyword argument '" +
                           keywords[0].first + "'");
  }
  if (macro.uses_varargs) {
    List varargs;
    for (size_t i = macro.params.size(); i < args.positional.size(); ++i) {
      varargs.push_back(args.positional[i]);
    }
    f.Set("varargs", Value::Tuple(std::move(varargs)));
  } else if (args.positional.size() > macro.params.size()) {
    ThrowRuntime("macro '" + macro.text + "' takes not more than " +
                 std::to_string(macro.params.size()) + " argument(s)");
  }
  std::string text;
  Exec(macro.body, f, text);
  return Value(std::move(text));
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  Step();
  if (!callee.is_callable()) {
    if (callee.is_undefined()) ThrowRuntime(callee.undefined_hint());
    ThrowRuntime("'" + callee.TypeName() + "' object is not callable");
  }
  DepthGuard guard(this);
  return callee.as_callable().fn(*this, args);
}

CallArgs Interpreter::EvalArgs(const Expr& e, Frame& frame, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    args.positional.push_back(Eval(*e.args[i], frame));
    Charge(Cost(args.positional.back()));
  }
  for (const auto& [k, v] : e.kwargs) {
    args.keywords.emplace_back(k, Eval(*v, frame));
    Charge(Cost(args.keywords.back().second));
  }
  return args;
}

Value Interpreter::EvalName(const Expr& e, Frame& frame) {
  if (folding_) throw NotConstant{};
  const Value* v = frame.Lookup(e.name);
  return v ? *v : Value(Undefined{"'" + e.name + "' is undefined"});
}

Value Interpreter::EvalCall(const Expr& e, Frame& frame) {
  if (folding_) throw NotConstant{};
  const Expr& callee = *e.args[0];
  if (callee.type == Expr::Type::kAttr) {
    Value obj = Eval(*callee.args[0], frame);
    Charge(Cost(obj));
    const Value* member = obj.Find(callee.name);
    if (member == nullptr || !member->is_callable()) {
      CallArgs args = EvalArgs(e, frame, 1);
      bool found = false;
      Value result = CallMethod(*this, obj, callee.name, args, &found);
      if (found) return result;
    }
    Value fn = GetAttr(obj, callee.name);
    CallArgs args = EvalArgs(e, frame, 1);
    if (fn.is_undefined())
      ThrowRuntime("'" + obj.TypeName() + "' object has no attribute '" + callee.name + "'");
    return Call(fn, args);
  }
  Value fn = Eval(callee, frame);
  CallArgs args = EvalArgs(e, frame, 1);
  return Call(fn, args);
}

Value Interpreter::EvalDict(const Expr& e, Frame& frame) {
  Dict dict;
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    Value key = Eval(*e.args[i], frame);
    if (!key.is_string()) ThrowRuntime("only string keys are supported in dict literals");
    Value v = Eval(*e.args[i + 1], frame);
    auto it = std::find_if(dict.begin(), dict.end(),
                           [&](const auto& kv) { return kv.first == key.as_string(); });
    if (it != dict.end()) {
      it->second = std::move(v);
    } else {
      dict.emplace_back(key.as_string(), std::move(v));
    }
  }
  return Value(std::move(dict));
}

namespace {

Value UnaryOp(const std::string& op, const Value& v) {
  if (op == "not") return Value(!v.Truthy());
  if (v.is_undefined()) ThrowRuntime(v.undefined_hint());
  if (v.is_int() || v.is_bool()) {
    int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
    if (op == "-" && i == INT64_MIN) ThrowRuntime("integer overflow in unary -");
    return Value(op == "-" ? -i : i);
  }
  if (v.is_float()) return Value(op == "-" ? -v.as_float() : v.as_float());
  ThrowRuntime("bad operand type for unary " + op + ": '" + v.TypeName() + "'");
}

}  // namespace

// Every operation pays for what it reads (its operands) and what it builds (its result), so a
// loop over a large value costs its size each time, whatever the operation.
Value Interpreter::Eval(const Expr& e, Frame& frame) {
  Step();
  DepthGuard guard(this);
  Value v = EvalNode(e, frame);
  if (e.type != Expr::Type::kLiteral && e.type != Expr::Type::kName) Charge(Cost(v));
  return v;
}

// .attr, [item] and [a:b:c]: the object pays for its size (dict lookups and string indexing
// are linear).
Value Interpreter::EvalAccess(const Expr& e, Frame& frame) {
  Value obj = Eval(*e.args[0], frame);
  Charge(Cost(obj));
  if (e.type == Expr::Type::kAttr) return GetAttr(obj, e.name);
  if (e.type == Expr::Type::kItem) return GetItem(obj, Eval(*e.args[1], frame));
  auto part = [&](int i) { return e.args[i] ? Eval(*e.args[i], frame) : Value(None{}); };
  return Slice(*this, obj, part(1), part(2), part(3), folding_);
}

Value Interpreter::EvalFilterOrTest(const Expr& e, Frame& frame) {
  // Not constants: filters that need the context, and a block set's input.
  const bool filter = e.type == Expr::Type::kFilter;
  if (folding_ && filter && (PassesContext(e.name) || (!e.args[0] && !pipe_input_))) {
    throw NotConstant{};
  }
  Value input = e.args[0] ? Eval(*e.args[0], frame) : *pipe_input_;
  Charge(Cost(input));
  CallArgs args = EvalArgs(e, frame, 1);
  if (filter) return ApplyFilter(*this, e.name, input, args);
  return Value(ApplyTest(*this, e.name, input, args));
}

Value Interpreter::EvalNode(const Expr& e, Frame& frame) {
  switch (e.type) {
    case Expr::Type::kLiteral:
      return e.literal;
    case Expr::Type::kName:
      return EvalName(e, frame);
    case Expr::Type::kList: {
      List list;
      for (const ExprPtr& a : e.args) list.push_back(Eval(*a, frame));
      return e.name == "tuple" ? Value::Tuple(std::move(list)) : Value(std::move(list));
    }
    case Expr::Type::kDict:
      return EvalDict(e, frame);
    case Expr::Type::kAttr:
    case Expr::Type::kItem:
    case Expr::Type::kSlice:
      return EvalAccess(e, frame);
    case Expr::Type::kCall:
      return EvalCall(e, frame);
    case Expr::Type::kFilter:
    case Expr::Type::kTest:
      return EvalFilterOrTest(e, frame);
    case Expr::Type::kUnary:
      return UnaryOp(e.name, Eval(*e.args[0], frame));
    case Expr::Type::kBinary: {
      Value a = Eval(*e.args[0], frame);
      Value b = Eval(*e.args[1], frame);
      Charge(Cost(a) + Cost(b));
      return BinaryOp(*this, e.name, a, b);
    }
    case Expr::Type::kAnd: {
      Value a = Eval(*e.args[0], frame);
      return a.Truthy() ? Eval(*e.args[1], frame) : a;
    }
    case Expr::Type::kOr: {
      Value a = Eval(*e.args[0], frame);
      return a.Truthy() ? a : Eval(*e.args[1], frame);
    }
    case Expr::Type::kCond:
      if (Eval(*e.args[1], frame).Truthy()) return Eval(*e.args[0], frame);
      return e.args[2] ? Eval(*e.args[2], frame)
                       : Value(Undefined{"the inline if-expression evaluated to false and no else "
                                         "section was defined."});
  }
  return Value();
}

}  // namespace meshnet::jinja
