// Constant folding as jinja2's optimizer does it (interpreter.h).
#include "template/interpreter.h"

namespace meshnet::jinja {
namespace {

// Folded values stay small: a constant larger than this is left to be evaluated per render.
constexpr uint64_t kMaxFoldedWeight = 64 << 10;

// jinja2's has_safe_repr: the values it may write into compiled code.
bool PlainData(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
    case Value::Kind::kString:
      return true;
    case Value::Kind::kList:
      for (const Value& item : v.as_list()) {
        if (!PlainData(item)) return false;
      }
      return true;
    case Value::Kind::kDict:
      for (const auto& [k, item] : v.as_dict()) {
        if (!PlainData(item)) return false;
      }
      return true;
    default:
      return false;
  }
}

class Folder {
 public:
  Folder() : in_(opts_) {}

  void FoldBody(Body& body) {
    for (StmtPtr& s : body) FoldStmt(*s);
  }

 private:
  void FoldStmt(Stmt& s) {
    if (s.expr) Fold(s.expr, s.type == Stmt::Type::kOutput);
    if (s.cond) Fold(s.cond, false);
    for (auto& [name, def] : s.params) {
      if (def) Fold(def, false);
    }
    FoldBody(s.body);
    FoldBody(s.else_body);
  }

  // Bottom-up, as jinja2's Optimizer.generic_visit: the operands first, then the node.
  void Fold(ExprPtr& e, bool output) {
    for (ExprPtr& a : e->args) {
      if (a) Fold(a, false);
    }
    for (auto& [k, v] : e->kwargs) Fold(v, false);
    if (spent_ || e->type == Expr::Type::kLiteral || e->type == Expr::Type::kName) return;
    Value v;
    try {
      v = in_.EvalConstant(*e);
    } catch (const NotConstant&) {
      return;
    } catch (const std::exception&) {  // fails at compile time: evaluated at render time
      spent_ = in_.Exhausted();
      return;
    }
    if ((!output && !PlainData(v)) || v.weight() > kMaxFoldedWeight) return;
    auto literal = std::make_unique<Expr>();
    literal->type = Expr::Type::kLiteral;
    literal->line = e->line;
    literal->literal = std::move(v);
    e = std::move(literal);
  }

  ChatTemplateOptions opts_;
  Interpreter in_;
  bool spent_ = false;  // the folding budget is spent: the rest is left as it is
};

}  // namespace

void FoldConstants(Program& program) { Folder().FoldBody(program.body); }

}  // namespace meshnet::jinja
