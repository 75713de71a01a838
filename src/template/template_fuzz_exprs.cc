// The expression half of the template generator (template_fuzz_gen.h).
#include <string>
#include <vector>

#include "template/template_fuzz_gen.h"

namespace meshnet::jinja::fuzz {
namespace {

const std::vector<std::string> kStrings = {
    "'x'",   "'<'",    "\"a'b\"",       "''",        "' '",    "'é'",   "'A b c'", "'&amp;'",
    "'\\n'", "'<b>'",  "'role'",        "'content'", "'user'", "'a&b'", "'\"q\"'", "' pad '",
    "'ÄÖ'",  "'🦙'", "'Hello World'", "'-'",       "'{}'",   "'%s'",  "'a,b'",   "'ab'"};
const std::vector<std::string> kStringVars = {
    "s", "u", "w", "e", "d.k", "msgs[1].content", "tools[0].function.description"};
const std::vector<std::string> kFormats = {"'%s'",   "'<%s>'", "'%s|%s'",  "'%d'",  "'%r'",
                                           "'%%%s'", "'{}'",   "'{0}{0}'", "'{x}'", "'<{}>'"};
const std::vector<std::string> kNumbers = {"0",   "1",     "2",   "3",   "-1", "i",   "z",
                                           "neg", "xs[0]", "d.n", "2.5", "f",  "0.1", "7"};
const std::vector<std::string> kLists = {
    "xs", "ws", "empty", "msgs", "tools", "[1, 'a', none]", "d.l", "(1, 2)", "['<', 'b']", "mixed"};
const std::vector<std::string> kDicts = {
    "d", "ed", "msgs[0]", "{'a': 1, 'b': '<'}", "tools[0].function", "msgs[2]"};
const std::vector<std::string> kBools = {"true", "false", "t", "fa"};
const std::vector<std::string> kMissing = {"n",    "nope", "d.absent", "msgs[0].missing",
                                           "none", "n",    "nope"};
const std::vector<std::string> kAttrs = {"role", "content",  "tool_calls", "k",
                                         "n",    "function", "name",       "missing"};
const std::vector<std::string> kTests = {
    "defined",        "undefined", "none",         "string",      "number",  "mapping",
    "iterable",       "sequence",  "integer",      "float",       "boolean", "true",
    "false",          "callable",  "odd",          "even",        "lower",   "upper",
    "divisibleby(2)", "eq(1)",     "sameas(none)", "in([1, 'x'])"};
const std::vector<std::string> kSelectTests = {"none",    "string", "number",  "defined",
                                               "odd",     "even",   "mapping", "true",
                                               "integer", "lower",  "upper",   "sequence"};

}  // namespace

Node Generator::Leaf(char type) {
  auto pick = [&](const std::vector<std::string>& pool) { return pool[Pick(pool.size())]; };
  std::vector<std::string> names;
  for (const Name& n : scope_) {
    if (n.type == type || type == 'A') names.push_back(n.name);
  }
  if (!names.empty() && Chance(40)) return Text(type, pick(names));
  switch (type) {
    case 'S':
      return Text('S', Chance(50) ? pick(kStrings) : pick(kStringVars));
    case 'I':
      return Text('I', pick(kNumbers));
    case 'L':
      return Text('L', pick(kLists));
    case 'D':
      return Text('D', pick(kDicts));
    case 'B':
      return Text('B', pick(kBools));
    default: {
      static const char kTypes[] = "SILDB";
      if (Chance(35)) return Text('A', pick(kMissing));
      Node n = Leaf(kTypes[Pick(5)]);
      n.type = 'A';
      return n;
    }
  }
}

Node Generator::Expr(char type, int depth) {
  if (depth <= 0 || Chance(30)) return Leaf(type);
  switch (type) {
    case 'S':
      return StringExpr(depth - 1);
    case 'I':
      return NumberExpr(depth - 1);
    case 'L':
      return ListExpr(depth - 1);
    case 'D':
      return DictExpr(depth - 1);
    case 'B':
      return BoolExpr(depth - 1);
    default:
      return AnyExpr(depth - 1);
  }
}

Node Generator::StringExpr(int d) {
  auto S = [&] { return Expr('S', d); };
  auto A = [&] { return Expr('A', d); };
  auto L = [&] { return Expr('L', d); };
  auto fmt = [&] { return Text('S', kFormats[Pick(kFormats.size())]); };
  switch (rng_() % 44) {
    case 0:
    case 1:
      return N('S', {"(", S(), " + ", S(), ")"});
    case 2:
      return N('S', {"(", S(), " ~ ", A(), ")"});
    case 3:
    case 4:
    case 5:
      return N('S', {"(", S(), "|safe)"});
    case 6:
      return N('S', {"(", S(), "|e)"});
    case 7:
      return N('S', {"(", S(), "|", Chance(50) ? "escape" : "forceescape", ")"});
    case 8: {
      static const char* const kF[] = {"upper", "lower",  "capitalize", "title",
                                       "trim",  "string", "reverse"};
      return N('S', {"(", S(), "|", kF[Pick(7)], ")"});
    }
    case 9: {
      static const char* const kM[] = {"strip()", "lstrip()", "rstrip()",     "upper()",
                                       "lower()", "title()",  "capitalize()", "strip('a<')"};
      return N('S', {"(", S(), ").", kM[Pick(8)]});
    }
    case 10:
      return N('S', {"(", S(), ").replace(", S(), ", ", S(), ")"});
    case 11:
      return N('S', {"(", S(), ")|replace(", S(), ", ", S(), ")"});
    case 12:
      return N('S',
               {"(", S(), ")[", Expr('I', 0), ":", Chance(50) ? Expr('I', 0) : Text('I', ""), "]"});
    case 13:
      return N('S', {"(", S(), ")[", Chance(50) ? "::-1" : "1:", "]"});
    case 14:
      return N('S', {"(", S(), ")[", Expr('I', 0), "]"});
    case 15:
      return N('S', {"(", S(), " * ", Text('I', std::to_string(Pick(4))), ")"});
    case 16:
      return N('S', {"(", L(), ")|join(", S(), ")"});
    case 17:
      return N('S', {"(", L(), ")|join"});
    case 18:
      return N('S', {"(", S(), ").join(", L(), ")"});
    case 19:
      return N('S', {"(", Chance(50) ? fmt() : S(), ").format(", A(), ", x=", A(), ")"});
    case 20:
      return N('S', {"(", Chance(60) ? fmt() : S(), " % ", A(), ")"});
    case 21:
      return N('S', {"(", fmt(), " % (", A(), ", ", A(), "))"});
    case 22:
      return N('S', {"(", Chance(60) ? fmt() : S(), ")|format(", A(), ")"});
    case 23:
      return N('S', {"(", A(), ")|string"});
    case 24:
    case 25:
      return N('S', {"(", A(), ")|tojson"});
    case 26:
      return N('S', {"(", A(), ")|default(", S(), ")"});
    case 27:
      return N('S', {"(", A(), ")|d(", S(), ", true)"});
    case 28:
      return N('S', {"(", S(), " if ", Expr('B', d), " else ", S(), ")"});
    case 29:
      return N('S', {"(", S(), ")|indent(", Chance(50) ? "2" : "2, true", ")"});
    case 30:
      return N('S',
               {"(", S(), ").split(", Chance(50) ? Text('S', "") : S(), ")[", Expr('I', 0), "]"});
    case 31:
      if (!macros_.empty()) {
        return N('S', {macros_[Pick(macros_.size())], "(", A(), ")"});
      }
      return N('S', {"(", S(), " ~ ", S(), ")"});
    case 32:
      return N('S', {"(", A(), ")|tojson(indent=2)"});
    case 33:
      return N('S', {"((", S(), "|safe) + ", S(), ")"});
    case 34:
      return N('S', {"(", S(), " + (", S(), "|safe))"});
    case 35:
      return N('S', {"(", A(), " ~ (", S(), "|safe))"});
    case 36:
      return N('S', {"(", L(), ")|join(", S(), "|safe)"});
    case 37:
      return N('S', {"((", S(), "|safe).join(", L(), "))"});
    case 38:
      return N('S', {"((", fmt(), "|safe) % ", A(), ")"});
    case 39:
      return N('S', {"((", fmt(), "|safe).format(", A(), "))"});
    case 40:
      return N('S', {"(", A(), ")|first"});
    case 41:
      return N('S', {"(", S(), "|safe)[", Chance(50) ? "1:" : "::-1", "]"});
    case 42:
      return N('S', {"((", S(), "|safe) * 2)"});
    default:
      return N('S', {"(", A(), ")|", Chance(50) ? "upper" : "trim"});
  }
}

Node Generator::NumberExpr(int d) {
  auto I = [&] { return Expr('I', d); };
  auto S = [&] { return Expr('S', d); };
  auto L = [&] { return Expr('L', d); };
  switch (rng_() % 24) {
    case 0:
      return N('I', {"(", I(), " + ", I(), ")"});
    case 1:
      return N('I', {"(", I(), " - ", I(), ")"});
    case 2:
      return N('I', {"(", I(), " * ", I(), ")"});
    case 3:
      return N('I', {"(", I(), " // ", I(), ")"});
    case 4:
      return N('I', {"(", I(), " % ", I(), ")"});
    case 5:
      return N('I', {"(", I(), " / ", I(), ")"});
    case 6:
      return N('I', {"-(", I(), ")"});
    case 7:
      return N('I', {"(", I(), " ** 2)"});
    case 8:
      return N('I', {"(", L(), ")|length"});
    case 9:
      return N('I', {"(", S(), ")|length"});
    case 10:
      return N('I', {"(", L(), ")|sum"});
    case 11:
      return N('I', {"(", S(), ")|int"});
    case 12:
      return N('I', {"(", Expr('A', d), ")|int"});
    case 13:
      return N('I', {"(", Expr('A', d), ")|float"});
    case 14:
      return N('I', {"(", S(), ").find(", S(), ")"});
    case 15:
      return N('I', {"(", S(), ").count(", S(), ")"});
    case 16:
      return N('I', {"(", L(), ")|", Chance(50) ? "min" : "max"});
    case 17:
      return N('I', {"(", I(), ")|abs"});
    case 18:
      if (loops_ > 0) {
        static const char* const kLoop[] = {"loop.index",     "loop.index0", "loop.revindex",
                                            "loop.revindex0", "loop.length", "loop.depth"};
        return Text('I', kLoop[Pick(6)]);
      }
      return I();
    case 19:
      return N('I', {"(", Expr('A', d), ")|length"});
    case 20:
      return N('I', {"(", S(), ").split()|length"});
    case 21:
      return N('I', {"(", L(), ")|count"});
    case 22:
      return N('I', {"(", I(), " if ", Expr('B', d), " else ", I(), ")"});
    default:
      return N('I', {"(", Expr('A', d), ")|default(", I(), ")"});
  }
}

Node Generator::ListExpr(int d) {
  auto L = [&] { return Chance(15) ? Expr('A', d) : Expr('L', d); };
  auto S = [&] { return Expr('S', d); };
  auto A = [&] { return Expr('A', d); };
  auto attr = [&] { return "'" + kAttrs[Pick(kAttrs.size())] + "'"; };
  auto test = [&] { return "'" + kSelectTests[Pick(kSelectTests.size())] + "'"; };
  switch (rng_() % 34) {
    case 0:
      return N('L', {"[", A(), ", ", A(), "]"});
    case 1:
      return N('L', {"(", L(), " + ", L(), ")"});
    case 2:
      return N('L', {"(", L(), ")[", Expr('I', 0), ":", Expr('I', 0), "]"});
    case 3:
      return N('L', {"(", L(), ")[::-1]"});
    case 4:
      return N('L', {"(", L(), ")|select|list"});
    case 5:
      return N('L', {"(", L(), ")|", Chance(50) ? "select" : "reject", "(",
                     Chance(50) ? "'none'" : "'string'", ")|list"});
    case 6:
      return N('L', {"(", L(), ")|selectattr(", attr(), ")|list"});
    case 7:
      return N('L', {"(", L(), ")|selectattr(", attr(), ", 'equalto', ", S(), ")|list"});
    case 8:
      return N('L', {"(", L(), ")|rejectattr(", attr(), ", 'none')|list"});
    case 9:
      return N('L', {"(", L(), ")|rejectattr(", attr(), ")|list"});
    case 10:
      return N('L', {"(", L(), ")|map(attribute=", attr(), ")|list"});
    case 11:
      return N('L', {"(", L(), ")|map(attribute=", attr(), ", default=", S(), ")|list"});
    case 12:
      return N('L', {"(", L(), ")|map('", Chance(50) ? "upper" : "string", "')|list"});
    case 13:
      return N('L', {"(", L(), ")|sort"});
    case 14:
      return N('L', {"(", L(), ")|sort(", Chance(50) ? "reverse=true" : "attribute='role'", ")"});
    case 15:
      return N('L', {"(", L(), ")|unique|list"});
    case 16:
      return N('L', {"(", L(), ")|reverse|list"});
    case 17:
      return N('L', {"(", L(), ")|list"});
    case 18:
      return N('L', {"(", S(), ")|list"});
    case 19:
      return N('L', {"(", Expr('D', d), ")|list"});
    case 20:
      return N('L', {"(", Chance(30) ? A() : Expr('D', d), ")|items|list"});
    case 21:
      return N('L', {"(", Expr('D', d), ").", Chance(50) ? "items()" : "keys()", "|list"});
    case 22:
      return N('L', {"(", Expr('D', d), ").values()|list"});
    case 23:
      return N('L', {"(", S(), ").split()"});
    case 24:
      return N('L', {"(", S(), ").split(", S(), ")"});
    case 25:
      return N('L', {"(", S(), ").splitlines()"});
    case 26:
      return N('L', {"range(", Text('I', std::to_string(Pick(5))), ")|list"});
    case 27:
      return N('L', {"(", Text('A', kMissing[Pick(kMissing.size())]), ")|",
                     Chance(50) ? "selectattr(" + attr() + ")" : "map(attribute=" + attr() + ")",
                     "|list"});
    case 28:
      return N('L', {"(", Text('A', kMissing[Pick(kMissing.size())]), ")|",
                     Chance(50) ? "select" : "reject", "|list"});
    case 29:
      return N('L', {"(", L(), ")|select(", test(), ")|list"});
    case 30:
      return N('L', {"(", L(), ")|reject(", test(), ")|list"});
    case 31:
      return N('L', {"(", L(), ")|unique(attribute='role')|list"});
    case 32:
      return N('L', {"(", L(), ")|map('default', ", S(), ")|list"});
    default:
      return N('L', {"[", A(), "]"});
  }
}

Node Generator::DictExpr(int d) {
  auto A = [&] { return Expr('A', d); };
  switch (rng_() % 6) {
    case 0:
      return N('D', {"{'a': ", A(), ", 'b': ", A(), "}"});
    case 1:
      return N('D', {"dict(a=", A(), ")"});
    case 2:
      return N('D', {"(", Expr('L', d), ")[", Expr('I', 0), "]"});
    case 3:
      return N('D', {"(", Expr('D', d), ")|default({})"});
    case 4:
      return N('D', {"namespace(a=", A(), ")"});
    default:
      return N('D', {"{", Text('S', kStrings[Pick(kStrings.size())]), ": ", A(), "}"});
  }
}

Node Generator::BoolExpr(int d) {
  auto A = [&] { return Expr('A', d); };
  auto S = [&] { return Expr('S', d); };
  auto I = [&] { return Expr('I', d); };
  switch (rng_() % 18) {
    case 0:
    case 1:
    case 2:
      return N('B', {"(", A(), " is ", Chance(20) ? "not " : "", kTests[Pick(kTests.size())], ")"});
    case 3:
      return N('B', {"(", A(), " in ", Expr('L', d), ")"});
    case 4:
      return N('B', {"(", S(), " in ", S(), ")"});
    case 5:
      return N('B', {"(", A(), " not in ", Chance(50) ? Expr('L', d) : Expr('D', d), ")"});
    case 6:
      return N('B', {"(", A(), " == ", A(), ")"});
    case 7:
      return N('B', {"(", A(), " != ", A(), ")"});
    case 8:
      return N('B', {"(", I(), " < ", I(), ")"});
    case 9:
      return N('B', {"(", S(), " <= ", S(), ")"});
    case 10:
      return N('B', {"(not ", Expr('B', d), ")"});
    case 11:
      return N('B', {"(", Expr('B', d), " and ", Expr('B', d), ")"});
    case 12:
      return N('B', {"(", Expr('B', d), " or ", Expr('B', d), ")"});
    case 13:
      return N('B', {"(", S(), ").", Chance(50) ? "startswith(" : "endswith(", S(), ")"});
    case 14:
      if (loops_ > 0) return Text('B', Chance(50) ? "loop.first" : "loop.last");
      return N('B', {"(", A(), ")"});
    case 15:
      return N('B', {"(", A(), " is defined and ", A(), ")"});
    case 16:
      return N('B', {"(", A(), " is not none)"});
    default:
      return N('B', {"(", A(), ")"});
  }
}

Node Generator::AnyExpr(int d) {
  static const char kTypes[] = "SILDB";
  switch (rng_() % 14) {
    case 0:
      return N('A', {"(", Expr('A', d), " and ", Expr('A', d), ")"});
    case 1:
      return N('A', {"(", Expr('A', d), " or ", Expr('A', d), ")"});
    case 2:
      return N('A', {"(", Expr('L', d), ")[", Expr('I', 0), "]"});
    case 3:
      return N('A', {"(", Expr('D', d), ")[", Expr('S', 0), "]"});
    case 4:
      return N('A', {"(", Expr('D', d), ").get(", Expr('S', 0), ")"});
    case 5:
      return N('A', {"(", Expr('D', d), ").get(", Expr('S', 0), ", ", Expr('A', d), ")"});
    case 6:
      return N('A', {"(", Expr('A', d), ").", kAttrs[Pick(kAttrs.size())]});
    case 7:
      return N('A', {"(", Expr('L', d), ")|", Chance(50) ? "first" : "last"});
    case 8:
      return N('A', {"(", Expr('A', d), ")|default(", Expr('A', d), ")"});
    case 9:
      if (loops_ > 0) {
        static const char* const kLoop[] = {"loop.previtem", "loop.nextitem",
                                            "loop.cycle('a', 'b')"};
        return Text('A', kLoop[Pick(3)]);
      }
      return Expr('A', d);
    case 10:
      return N('A', {"(", Expr('L', d), ")[", Expr('I', 0), "].", kAttrs[Pick(kAttrs.size())]});
    default: {
      Node n = Expr(kTypes[Pick(5)], d + 1);
      n.type = 'A';
      return n;
    }
  }
}

}  // namespace meshnet::jinja::fuzz
