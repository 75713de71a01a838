#include "template/template_fuzz_gen.h"

#include <algorithm>
#include <functional>
#include <string_view>
#include <variant>

namespace meshnet::jinja::fuzz {

Node N(char type, std::vector<Part> parts) {
  Node n;
  n.type = type;
  for (Part& p : parts) {
    if (auto* s = std::get_if<std::string>(&p)) {
      n.text.back() += *s;
    } else {
      n.kids.push_back(std::move(std::get<Node>(p)));
      n.text.emplace_back();
    }
  }
  return n;
}

Node Text(char type, std::string s) { return N(type, {std::move(s)}); }

namespace {

const std::vector<std::string> kTexts = {"x", " ",    "\n",  "  \n", "<b>", "\t", "a\n  ",
                                         "&", "\n\n", "{ }", "'",    "é",   "  "};

}  // namespace

std::string Node::Render() const {
  std::string out = text[0];
  for (size_t i = 0; i < kids.size(); ++i) out += kids[i].Render() + text[i + 1];
  return out;
}

size_t Node::Size() const {
  size_t n = 1;
  for (const Node& k : kids) n += k.Size();
  return n;
}

nlohmann::ordered_json Vars() {
  return nlohmann::ordered_json::parse(R"({
    "n": null, "s": "a<b & \"c\" 'd'", "u": "héllo 🦙 Wörld", "w": "  padded\ttext \n", "e": "",
    "i": 3, "z": 0, "neg": -7, "f": 2.5, "t": true, "fa": false,
    "xs": [3, 1, 2, 1], "ws": ["b", "A", "a", "c<"], "empty": [],
    "mixed": [1, "1", 1.0, true, null, "a"],
    "msgs": [{"role": "system", "content": "sys <1>"}, {"role": "user", "content": "hi & bye"},
             {"role": "assistant", "content": null,
              "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
             {"role": "tool", "content": "42"}, {"role": "user", "content": "Thanks"}],
    "d": {"k": "v<", "n": 2, "none": null, "l": [1, 2]}, "ed": {},
    "tools": [{"type": "function", "function": {"name": "get", "description": "Get <x>",
               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
  })");
}

std::string Generator::Sign() {
  switch (rng_() % 6) {
    case 0:
      return "-";
    case 1:
      return "+";
    default:
      return "";
  }
}

Node Generator::Tag(const std::string& body) {
  return Text('X', "{%" + Sign() + " " + body + " " + Sign() + "%}");
}

Node Generator::Statements(int depth, int count) {
  Node list = N('T', {});
  size_t scope = scope_.size();
  for (int i = 0; i < count; ++i) {
    list.kids.push_back(Statement(depth));
    list.text.emplace_back();
  }
  scope_.resize(std::min(scope, scope_.size()));
  return list;
}

Node Generator::ForLoop(int d) {
  std::string var = "v" + std::to_string(counter_++);
  bool pairs = Chance(20);
  Node iter = pairs ? N('L', {"(", Expr('D', 2), ")|items"}) : Expr('L', 3);
  std::string head = pairs ? var + "k, " + var : var;
  Node cond = Chance(20) ? N('B', {" if ", Expr('B', 1)}) : Text('B', "");
  ++loops_;
  scope_.push_back({var, 'A'});
  if (pairs) scope_.push_back({var + "k", 'S'});
  Node body = Statements(d - 1, 1 + static_cast<int>(Pick(3)));
  scope_.pop_back();
  if (pairs) scope_.pop_back();
  --loops_;
  Node otherwise = Chance(20) ? N('T', {"{% else %}", Statements(d - 1, 1)}) : N('T', {});
  return N('X', {"{%" + Sign() + " for " + head + " in ", std::move(iter), std::move(cond),
                 " " + Sign() + "%}", std::move(body), std::move(otherwise),
                 "{%" + Sign() + " endfor " + Sign() + "%}"});
}

Node Generator::Macro(int d) {
  std::string name = "m" + std::to_string(macros_.size());
  scope_.push_back({"a", 'A'});
  scope_.push_back({"b", 'S'});
  ++in_macro_;
  Node body = Statements(d, 2);
  --in_macro_;
  scope_.resize(scope_.size() - 2);
  Node caller = Chance(40) ? Text('T', "{{ caller() if caller is defined }}") : N('T', {});
  macros_.push_back(name);
  return N('X', {"{%" + Sign() + " macro " + name + "(a, b=", Expr('S', 0), ") " + Sign() + "%}",
                 std::move(body), std::move(caller), "{%" + Sign() + " endmacro " + Sign() + "%}"});
}

Node Generator::Statement(int d) {
  auto expr_out = [&] { return N('X', {"{{" + Sign().substr(0, 1) + " ", Expr('A', 3), " }}"}); };
  if (d <= 0) return Chance(50) ? Text('X', kTexts[Pick(kTexts.size())]) : expr_out();
  switch (rng_() % 16) {
    case 0:
    case 1:
      return Text('X', kTexts[Pick(kTexts.size())]);
    case 2:
    case 3:
    case 4:
      return expr_out();
    case 5:
      return N('X', {"{{ ", Expr('S', 3), " }}"});
    case 6:
    case 7: {
      Node then = Statements(d - 1, 1 + static_cast<int>(Pick(2)));
      Node elif =
          Chance(30) ? N('T', {"{%" + Sign() + " elif ", Expr('B', 2), " %}", Statements(d - 1, 1)})
                     : N('T', {});
      Node otherwise = Chance(40) ? N('T', {"{% else %}", Statements(d - 1, 1)}) : N('T', {});
      return N('X',
               {"{%" + Sign() + " if ", Expr('B', 3), " " + Sign() + "%}", std::move(then),
                std::move(elif), std::move(otherwise), "{%" + Sign() + " endif " + Sign() + "%}"});
    }
    case 8:
    case 9:
      return ForLoop(d);
    case 10: {
      std::string var = "x" + std::to_string(counter_++);
      static const char kTypes[] = "SILDBA";
      char type = kTypes[Pick(6)];
      Node n = N('X', {"{% set " + var + " = ", Expr(type, 3), " %}"});
      scope_.push_back({var, type});
      return n;
    }
    case 11: {
      std::string ns = "ns" + std::to_string(counter_++);
      Node init = N('X', {"{% set " + ns + " = namespace(c=0, s=", Expr('S', 1), ") %}"});
      scope_.push_back({ns + ".c", 'I'});
      scope_.push_back({ns + ".s", 'S'});
      Node body = Statements(d - 1, 2);
      Node update = N(
          'X',
          {"{% set " + ns + ".c = " + ns + ".c + 1 %}{% set " + ns + ".s = ", Expr('S', 2), " %}"});
      return N('X', {std::move(init), Chance(60) ? ForLoop(d) : std::move(body), std::move(update),
                     "{{ " + ns + ".c }}{{ " + ns + ".s }}"});
    }
    case 12:
      if (loops_ > 0) {
        return N('X', {"{% if ", Expr('B', 2), " %}{% ", Chance(50) ? "break" : "continue",
                       " %}{% endif %}"});
      }
      return expr_out();
    case 13: {
      std::string var = "blk" + std::to_string(counter_++);
      Node n = N('X', {"{% set " + var + (Chance(30) ? " | upper" : "") + " %}",
                       Statements(d - 1, 2), "{% endset %}{{ " + var + " }}"});
      return n;
    }
    case 14:
      if (!macros_.empty() && in_macro_ == 0) {
        std::string m = macros_[Pick(macros_.size())];
        if (Chance(50)) {
          return N('X', {"{% call " + m + "(", Expr('A', 2), ") %}", Statements(d - 1, 1),
                         "{% endcall %}"});
        }
        return N('X', {"{{ " + m + "(", Expr('A', 2), ", b=", Expr('S', 1), ") }}"});
      }
      return expr_out();
    default:
      return Text('X', Chance(50) ? "{# note #}" : "{% raw %}{{ raw }}{% endraw %}");
  }
}

Node Generator::Template() {
  macros_.clear();
  scope_.clear();
  counter_ = 0;
  Node t = N('T', {});
  int macros = static_cast<int>(Pick(3));
  for (int i = 0; i < macros; ++i) {
    t.kids.push_back(Macro(1));
    t.text.emplace_back();
  }
  int n = 1 + static_cast<int>(Pick(4));
  for (int i = 0; i < n; ++i) {
    t.kids.push_back(Statement(3));
    t.text.emplace_back();
  }
  return t;
}

namespace {

Node SimplestLeaf(char type) {
  switch (type) {
    case 'S':
      return Text('S', "'x'");
    case 'I':
      return Text('I', "1");
    case 'L':
      return Text('L', "[]");
    case 'D':
      return Text('D', "{}");
    case 'B':
      return Text('B', "true");
    case 'A':
      return Text('A', "none");
    default:
      return Text(type, "");
  }
}

bool IsExpr(char t) { return std::string_view("SILDBA").find(t) != std::string_view::npos; }

// Calls emit(tree) for each single edit of the subtree at `node`; `rebuild` puts a replacement
// for `node` back into the whole tree.
void Edits(const Node& node, const std::function<Node(Node)>& rebuild,
           const std::function<void(Node)>& emit) {
  if (node.type == 'T') {
    for (size_t i = 0; i < node.kids.size(); ++i) {
      Node copy = node;
      copy.kids.erase(copy.kids.begin() + static_cast<std::ptrdiff_t>(i));
      copy.text[i] += copy.text[i + 1];
      copy.text.erase(copy.text.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      emit(rebuild(std::move(copy)));
    }
  } else {
    Node leaf = SimplestLeaf(node.type);
    if (leaf.Render() != node.Render()) emit(rebuild(std::move(leaf)));
    for (const Node& kid : node.kids) {
      bool fits = IsExpr(node.type)
                      ? kid.type == node.type || (node.type == 'A' && IsExpr(kid.type))
                      : kid.type == 'X' || kid.type == 'T';
      if (fits) emit(rebuild(kid));
    }
  }
  for (size_t i = 0; i < node.kids.size(); ++i) {
    Edits(
        node.kids[i],
        [&](Node replacement) {
          Node copy = node;
          copy.kids[i] = std::move(replacement);
          return rebuild(std::move(copy));
        },
        emit);
  }
}

}  // namespace

std::vector<Node> Reductions(const Node& root) {
  std::vector<Node> out;
  Edits(
      root, [](Node n) { return n; }, [&](Node n) { out.push_back(std::move(n)); });
  std::stable_sort(out.begin(), out.end(), [](const Node& a, const Node& b) {
    return a.Render().size() < b.Render().size();
  });
  return out;
}

}  // namespace meshnet::jinja::fuzz
