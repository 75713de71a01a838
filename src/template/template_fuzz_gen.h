// Random chat-template programs for differential fuzzing against Python jinja2: a generator of
// well-typed-ish templates (strings, numbers, lists, dicts, tests, loops, macros, namespaces,
// Markup arithmetic, filters on none and undefined) over a fixed set of variables, kept as a
// tree so a diverging template can be minimized by replacing subtrees.
//
// Thread-safety: plain values; a Generator is used by one thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace meshnet::jinja::fuzz {

// A generated fragment: text[0] kid[0] text[1] kid[1] ... text[n]. `type` is the fragment's
// kind: 'S' string, 'I' number, 'L' list, 'D' dict, 'B' boolean, 'A' any value (none and
// undefined included), 'X' one statement, 'T' a statement list.
struct Node {
  char type = 'A';
  std::vector<std::string> text{""};
  std::vector<Node> kids;
  std::string Render() const;
  size_t Size() const;  // nodes in the tree
};

// A fragment of `type` from text pieces and kids, in order.
using Part = std::variant<std::string, Node>;
Node N(char type, std::vector<Part> parts);
Node Text(char type, std::string s);

// The variables every generated template renders with (JSON, as the API passes them).
nlohmann::ordered_json Vars();

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}
  // A whole template: a few macro definitions, then statements.
  Node Template();

 private:
  struct Name {
    std::string name;
    char type;
  };
  Node Expr(char type, int depth);
  Node Leaf(char type);
  Node StringExpr(int depth);
  Node NumberExpr(int depth);
  Node ListExpr(int depth);
  Node DictExpr(int depth);
  Node BoolExpr(int depth);
  Node AnyExpr(int depth);
  Node Statements(int depth, int count);
  Node Statement(int depth);
  Node ForLoop(int depth);
  Node Macro(int depth);
  Node Tag(const std::string& body);  // {% body %} with random whitespace control
  Node OpenTag(const std::string& head, std::vector<Node> kids);
  size_t Pick(size_t n) { return static_cast<size_t>(rng_() % n); }
  bool Chance(int percent) { return static_cast<int>(rng_() % 100) < percent; }
  std::string Sign();

  std::mt19937_64 rng_;
  std::vector<Name> scope_;  // loop variables, sets and macro parameters in reach
  std::vector<std::string> macros_;
  int loops_ = 0;  // enclosing for loops (break/continue, loop.*)
  int in_macro_ = 0;
  int counter_ = 0;
};

// The trees one edit smaller than `root`: each node replaced by one of its kids of a fitting
// type or by the simplest leaf of its type, each statement of a list dropped. Smallest first.
std::vector<Node> Reductions(const Node& root);

}  // namespace meshnet::jinja::fuzz
