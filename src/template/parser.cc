// Recursive-descent parser for the Jinja subset, following jinja2's grammar and precedence:
// condexpr < or < and < not < compare (== != < <= > >= in, not in) < + - < ~ < * / // % < **
// < unary - + < postfix (.attr [item] (call)) and filters/tests (| name, is [not] name).
#include <algorithm>
#include <set>

#include "template/ast.h"
#include "template/lexer.h"

namespace meshnet::jinja {
namespace {

constexpr int kMaxParseDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::unique_ptr<Program> Run() {
    auto program = std::make_unique<Program>();
    program->body = Subparse({});
    return program;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxParseDepth) p->Fail("template nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  [[noreturn]] void Fail(const std::string& msg) const {
    throw TemplateError(ErrorKind::kMalformedFile, "template syntax error: " + msg + " (line " +
                                                       std::to_string(Cur().line) + ")");
  }
  const Token& Cur() const { return t_[pos_]; }
  const Token& Peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  const Token& Next() { return t_[pos_ < t_.size() - 1 ? pos_++ : pos_]; }
  bool IsOp(const char* op) const { return Cur().kind == TokenKind::kOp && Cur().value == op; }
  bool IsName(const char* name) const {
    return Cur().kind == TokenKind::kName && Cur().value == name;
  }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEof:
        return "end of template";
      case TokenKind::kBlockEnd:
        return "end of statement block";
      case TokenKind::kVarEnd:
        return "end of print statement";
      case TokenKind::kData:
        return "template data";
      default:
        return "'" + t.value + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got " + Describe(Cur()));
  }
  std::string ExpectName() {
    if (Cur().kind != TokenKind::kName) Fail("expected a name, got " + Describe(Cur()));
    return Next().value;
  }
  void ExpectBlockEnd() {
    if (Cur().kind != TokenKind::kBlockEnd) {
      Fail("expected token 'end of statement block', got " + Describe(Cur()));
    }
    Next();
  }

  ExprPtr Node(Expr::Type type, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = Cur().line;
    e->name = std::move(name);
    return e;
  }

  // ---- statements -----------------------------------------------------------------------

  // Parses until a block tag named in `end` (left unconsumed: Cur() is its name) or EOF.
  Body Subparse(const std::set<std::string>& end) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& tok = Cur();
      if (tok.kind == TokenKind::kEof) {
        if (!end.empty()) Fail("unexpected end of template, expected '" + *end.begin() + "'");
        return body;
      }
      auto s = std::make_unique<Stmt>();
      s->line = tok.line;
      if (tok.kind == TokenKind::kData) {
        s->type = Stmt::Type::kText;
        s->text = Next().value;
      } else if (tok.kind == TokenKind::kVarBegin) {
        Next();
        s->type = Stmt::Type::kOutput;
        s->expr = ParseTuple(true);
        if (Cur().kind != TokenKind::kVarEnd) {
          Fail("expected token 'end of print statement', got " + Describe(Cur()));
        }
        Next();
      } else if (tok.kind == TokenKind::kBlockBegin) {
        Next();
        if (Cur().kind == TokenKind::kName && end.count(Cur().value)) return body;
        s = ParseStatement();
      } else {
        Fail("unexpected " + Describe(tok));
      }
      body.push_back(std::move(s));
    }
  }

  StmtPtr MakeStmt(Stmt::Type type) {
    auto s = std::make_unique<Stmt>();
    s->type = type;
    s->line = Cur().line;
    return s;
  }

  StmtPtr ParseStatement() {
    if (Cur().kind != TokenKind::kName) Fail("tag name expected");
    std::string tag = Cur().value;
    if (tag == "if") return ParseIf();
    if (tag == "for") return ParseFor();
    if (tag == "set") return ParseSet();
    if (tag == "macro") return ParseMacro();
    if (tag == "call") return ParseCallBlock();
    if (tag == "generation") {
      Next();
      auto s = MakeStmt(Stmt::Type::kBlock);
      ExpectBlockEnd();
      s->body = Subparse({"endgeneration"});
      Next();
      ExpectBlockEnd();
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Fail("'" + tag + "' outside of a loop");
      Next();
      auto s = MakeStmt(tag == "break" ? Stmt::Type::kBreak : Stmt::Type::kContinue);
      ExpectBlockEnd();
      return s;
    }
    Fail("encountered unknown tag '" + tag + "'");
  }

  StmtPtr ParseIf() {
    Next();  // if / elif
    auto s = MakeStmt(Stmt::Type::kIf);
    s->expr = ParseTuple(false);
    ExpectBlockEnd();
    s->body = Subparse({"elif", "else", "endif"});
    if (IsName("elif")) {
      s->else_body.push_back(ParseIf());
      return s;
    }
    if (SkipName("else")) {
      ExpectBlockEnd();
      s->else_body = Subparse({"endif"});
    }
    Next();  // endif
    ExpectBlockEnd();
    return s;
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    bool paren = SkipOp("(");
    do {
      names.push_back(ExpectName());
    } while (SkipOp(","));
    if (paren) ExpectOp(")");
    return names;
  }

  StmtPtr ParseFor() {
    Next();
    auto s = MakeStmt(Stmt::Type::kFor);
    s->targets = ParseTargets();
    if (!SkipName("in")) Fail("expected 'in' in for loop, got " + Describe(Cur()));
    s->expr = ParseTuple(false, /*with_condexpr=*/false);
    if (SkipName("if")) s->cond = ParseExpr();
    if (IsName("recursive")) Fail("recursive loops are not supported");
    ExpectBlockEnd();
    ++loop_depth_;
    s->body = Subparse({"endfor", "else"});
    --loop_depth_;
    if (SkipName("else")) {
      ExpectBlockEnd();
      s->else_body = Subparse({"endfor"});
    }
    Next();
    ExpectBlockEnd();
    return s;
  }

  StmtPtr ParseSet() {
    Next();
    auto s = MakeStmt(Stmt::Type::kSet);
    s->targets.push_back(ExpectName());
    if (SkipOp(".")) {
      s->attr = ExpectName();
    } else {
      while (SkipOp(",")) s->targets.push_back(ExpectName());
    }
    if (SkipOp("=")) {
      s->expr = ParseTuple(false);
      ExpectBlockEnd();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) Fail("expected '='");
    s->type = Stmt::Type::kSetBlock;
    if (IsOp("|")) s->expr = ParseFilters(nullptr);
    ExpectBlockEnd();
    s->body = Subparse({"endset"});  // break/continue inside act on the enclosing loop
    Next();
    ExpectBlockEnd();
    return s;
  }

  void ParseParams(Stmt& s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s.params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      std::string name = ExpectName();
      ExprPtr def = SkipOp("=") ? ParseExpr() : nullptr;
      s.params.emplace_back(std::move(name), std::move(def));
    }
    Next();
  }

  StmtPtr ParseMacro() {
    Next();
    auto s = MakeStmt(Stmt::Type::kMacro);
    s->text = ExpectName();
    ParseParams(*s);
    ExpectBlockEnd();
    int saved = loop_depth_;
    loop_depth_ = 0;
    std::set<std::string> names;
    macro_names_.push_back(&names);
    s->body = Subparse({"endmacro"});
    macro_names_.pop_back();
    s->uses_caller = names.count("caller") > 0;
    s->uses_varargs = names.count("varargs") > 0;
    s->uses_kwargs = names.count("kwargs") > 0;
    loop_depth_ = saved;
    Next();
    if (Cur().kind == TokenKind::kName) Next();  // {% endmacro name %}
    ExpectBlockEnd();
    return s;
  }

  StmtPtr ParseCallBlock() {
    Next();
    auto s = MakeStmt(Stmt::Type::kCallBlock);
    if (IsOp("(")) ParseParams(*s);
    s->expr = ParseExpr();
    if (s->expr->type != Expr::Type::kCall) Fail("expected call");
    ExpectBlockEnd();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = Subparse({"endcall"});
    loop_depth_ = saved;
    Next();
    ExpectBlockEnd();
    return s;
  }

  // ---- expressions ----------------------------------------------------------------------

  // A bare tuple `a, b` is a list; `explicit_end` allows a trailing value without a comma.
  ExprPtr ParseTuple(bool allow_empty, bool with_condexpr = true) {
    ExprPtr first = with_condexpr ? ParseExpr() : ParseOr();
    if (!IsOp(",")) return first;
    auto list = Node(Expr::Type::kList, "tuple");
    list->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().kind == TokenKind::kBlockEnd || Cur().kind == TokenKind::kVarEnd) break;
      list->args.push_back(with_condexpr ? ParseExpr() : ParseOr());
    }
    return list;
  }

  ExprPtr ParseExpr() {
    DepthGuard guard(this);
    ExprPtr expr = ParseOr();
    while (SkipName("if")) {
      auto cond = Node(Expr::Type::kCond);
      ExprPtr test = ParseOr();
      ExprPtr otherwise = SkipName("else") ? ParseExpr() : nullptr;
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr Binary(Expr::Type type, std::string op, ExprPtr a, ExprPtr b) {
    auto e = Node(type, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (SkipName("or")) left = Binary(Expr::Type::kOr, "or", std::move(left), ParseAnd());
    return left;
  }
  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (SkipName("and")) left = Binary(Expr::Type::kAnd, "and", std::move(left), ParseNot());
    return left;
  }
  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (SkipName("not")) {
      auto e = Node(Expr::Type::kUnary, "not");
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr left = ParseMath1();
    while (true) {
      std::string op;
      if (Cur().kind == TokenKind::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">="))) {
        op = Next().value;
      } else if (SkipName("in")) {
        op = "in";
      } else if (IsName("not") && Peek().kind == TokenKind::kName && Peek().value == "in") {
        Next();
        Next();
        op = "notin";
      } else {
        return left;
      }
      left = Binary(Expr::Type::kBinary, op, std::move(left), ParseMath1());
    }
  }
  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().value;
      left = Binary(Expr::Type::kBinary, op, std::move(left), ParseConcat());
    }
    return left;
  }
  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (SkipOp("~")) left = Binary(Expr::Type::kBinary, "~", std::move(left), ParseMath2());
    return left;
  }
  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Next().value;
      left = Binary(Expr::Type::kBinary, op, std::move(left), ParsePow());
    }
    return left;
  }
  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (SkipOp("**"))
      left = Binary(Expr::Type::kBinary, "**", std::move(left), ParseUnary(true));
    return left;
  }
  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = Node(Expr::Type::kUnary, Next().value);
      node->args.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    return with_filter ? ParseFilters(std::move(node)) : std::move(node);
  }

  ExprPtr ParsePrimary();
  ExprPtr ParseCollection();
  ExprPtr ParsePostfix(ExprPtr node);
  ExprPtr ParseSubscript(ExprPtr node);
  ExprPtr ParseFilters(ExprPtr node);
  ExprPtr ParseTest(ExprPtr node);
  // `callee(args)`: a call node on callee, at "(".
  ExprPtr ParseCall(ExprPtr callee);
  void ParseCallArgs(Expr& call);

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::set<std::string>*> macro_names_;  // names read in the macros being parsed

  friend struct DepthGuard;
};

ExprPtr Parser::ParsePrimary() {
  const Token& tok = Cur();
  switch (tok.kind) {
    case TokenKind::kName: {
      std::string n = Next().value;
      auto e = Node(Expr::Type::kLiteral);
      if (n == "true" || n == "True") {
        e->literal = Value(true);
      } else if (n == "false" || n == "False") {
        e->literal = Value(false);
      } else if (n == "none" || n == "None") {
        e->literal = Value(None{});
      } else {
        e->type = Expr::Type::kName;
        e->name = n;
        for (std::set<std::string>* names : macro_names_) names->insert(n);
      }
      return e;
    }
    case TokenKind::kString: {
      auto e = Node(Expr::Type::kLiteral);
      std::string s;
      while (Cur().kind == TokenKind::kString) s += Next().value;
      e->literal = Value(std::move(s));
      return e;
    }
    case TokenKind::kInt:
    case TokenKind::kFloat: {
      auto e = Node(Expr::Type::kLiteral);
      const std::string& text = tok.value;
      try {
        e->literal = tok.kind == TokenKind::kInt ? Value(static_cast<int64_t>(std::stoll(text)))
                                                 : Value(std::stod(text));
      } catch (const std::exception&) {
        Fail("number out of range: " + text);
      }
      Next();
      return e;
    }
    case TokenKind::kOp:
      return ParseCollection();
    default:
      Fail("unexpected " + Describe(tok));
  }
}

// ( tuple or parenthesized ), [ list ], { dict }.
ExprPtr Parser::ParseCollection() {
  if (SkipOp("(")) {
    if (SkipOp(")")) return Node(Expr::Type::kList, "tuple");  // empty tuple
    ExprPtr first = ParseExpr();
    if (SkipOp(")")) return first;
    auto list = Node(Expr::Type::kList, "tuple");
    list->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (IsOp(")")) break;
      list->args.push_back(ParseExpr());
    }
    ExpectOp(")");
    return list;
  }
  if (SkipOp("[")) {
    auto list = Node(Expr::Type::kList);
    while (!SkipOp("]")) {
      if (!list->args.empty()) ExpectOp(",");
      if (SkipOp("]")) break;
      list->args.push_back(ParseExpr());
    }
    return list;
  }
  if (SkipOp("{")) {
    auto dict = Node(Expr::Type::kDict);
    while (!SkipOp("}")) {
      if (!dict->args.empty()) ExpectOp(",");
      if (SkipOp("}")) break;
      dict->args.push_back(ParseExpr());
      ExpectOp(":");
      dict->args.push_back(ParseExpr());
    }
    return dict;
  }
  Fail("unexpected " + Describe(Cur()));
}

ExprPtr Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (SkipOp(".")) {
      if (Cur().kind == TokenKind::kInt) {
        auto item = Node(Expr::Type::kItem);
        auto key = Node(Expr::Type::kLiteral);
        key->literal = Value(static_cast<int64_t>(std::stoll(Next().value)));
        item->args.push_back(std::move(node));
        item->args.push_back(std::move(key));
        node = std::move(item);
        continue;
      }
      auto attr = Node(Expr::Type::kAttr, ExpectName());
      attr->args.push_back(std::move(node));
      node = std::move(attr);
    } else if (SkipOp("[")) {
      node = ParseSubscript(std::move(node));
    } else if (IsOp("(")) {
      node = ParseCall(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::ParseSubscript(ExprPtr node) {
  ExprPtr parts[3];
  bool is_slice = false;
  for (int i = 0; i < 3; ++i) {
    if (!IsOp(":") && !IsOp("]")) parts[i] = ParseExpr();
    if (i < 2 && SkipOp(":")) {
      is_slice = true;
      continue;
    }
    break;
  }
  ExpectOp("]");
  auto e = Node(is_slice ? Expr::Type::kSlice : Expr::Type::kItem);
  e->args.push_back(std::move(node));
  if (!is_slice && parts[0] == nullptr) Fail("expected an index");
  e->args.push_back(std::move(parts[0]));
  if (is_slice) {
    e->args.push_back(std::move(parts[1]));
    e->args.push_back(std::move(parts[2]));
  }
  return e;
}

ExprPtr Parser::ParseCall(ExprPtr callee) {
  auto call = Node(Expr::Type::kCall);
  call->args.push_back(std::move(callee));
  ParseCallArgs(*call);
  return call;
}

void Parser::ParseCallArgs(Expr& call) {
  ExpectOp("(");
  while (!SkipOp(")")) {
    if (call.args.size() > 1 || !call.kwargs.empty()) ExpectOp(",");
    if (SkipOp(")")) break;
    if (Cur().kind == TokenKind::kName && Peek().kind == TokenKind::kOp && Peek().value == "=") {
      std::string key = Next().value;
      Next();
      call.kwargs.emplace_back(std::move(key), ParseExpr());
    } else {
      if (!call.kwargs.empty()) Fail("positional argument after keyword argument");
      call.args.push_back(ParseExpr());
    }
  }
}

// `node | f(args) | g`, `node is [not] test arg`, and calls on the result. A null node is the
// filter section of a block set.
ExprPtr Parser::ParseFilters(ExprPtr node) {
  while (true) {
    if (SkipOp("|")) {
      std::string name = ExpectName();
      while (SkipOp(".")) name += "." + ExpectName();
      auto f = Node(Expr::Type::kFilter, name);
      f->args.push_back(std::move(node));
      if (IsOp("(")) ParseCallArgs(*f);
      node = std::move(f);
    } else if (IsName("is") && node != nullptr) {
      node = ParseTest(std::move(node));
    } else if (IsOp("(") && node != nullptr) {
      node = ParseCall(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::ParseTest(ExprPtr node) {
  Next();  // is
  bool negated = SkipName("not");
  std::string name = ExpectName();
  auto test = Node(Expr::Type::kTest, name);
  test->args.push_back(std::move(node));
  if (IsOp("(")) {
    ParseCallArgs(*test);
  } else if ((Cur().kind == TokenKind::kName || Cur().kind == TokenKind::kString ||
              Cur().kind == TokenKind::kInt || Cur().kind == TokenKind::kFloat || IsOp("[") ||
              IsOp("{")) &&
             !IsName("else") && !IsName("or") && !IsName("and")) {
    if (IsName("is")) Fail("You cannot chain multiple tests with is");
    test->args.push_back(ParsePostfix(ParsePrimary()));
  }
  if (!negated) return test;
  auto e = Node(Expr::Type::kUnary, "not");
  e->args.push_back(std::move(test));
  return e;
}

}  // namespace

std::unique_ptr<Program> ParseTemplate(std::string_view source) {
  return Parser(Tokenize(source)).Run();
}

}  // namespace meshnet::jinja
