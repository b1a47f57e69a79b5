// The chat-template parser's expressions: jinja2's operator precedence
// (or, and, not, comparisons, ~, + -, * / // %, **, unary), primaries,
// postfix subscripts and calls, filter chains and `is` tests.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"
#include "template/jinja_parser.h"

namespace fusionrl::jinja::internal {

ExprPtr Parser::ParseTupleOrExpression(bool allow_condition) {
  const int line = Peek().line;
  ExprPtr first = allow_condition ? ParseExpression() : ParseOr();
  if (!IsOp(",")) return first;
  auto tuple = NewExpr(Expr::Kind::kTuple, line);
  tuple->args.push_back(std::move(first));
  while (AcceptOp(",")) {
    if (Peek().kind == K::kBlockEnd || Peek().kind == K::kVarEnd) break;
    tuple->args.push_back(allow_condition ? ParseExpression() : ParseOr());
  }
  return tuple;
}

ExprPtr Parser::ParseExpression() {
  DepthGuard guard(this);
  ExprPtr expr = ParseOr();
  while (IsName("if")) {
    auto cond = NewExpr(Expr::Kind::kCondition, Next().line);
    cond->args.push_back(std::move(expr));
    cond->args.push_back(ParseOr());
    cond->args.push_back(AcceptName("else") ? ParseExpression() : nullptr);
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr Parser::ParseOr() {
  ExprPtr left = ParseAnd();
  while (IsName("or")) {
    auto e = NewExpr(Expr::Kind::kOr, Next().line);
    e->args.push_back(std::move(left));
    e->args.push_back(ParseAnd());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseAnd() {
  ExprPtr left = ParseNot();
  while (IsName("and")) {
    auto e = NewExpr(Expr::Kind::kAnd, Next().line);
    e->args.push_back(std::move(left));
    e->args.push_back(ParseNot());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseNot() {
  if (IsName("not")) {
    DepthGuard guard(this);
    auto e = NewExpr(Expr::Kind::kNot, Next().line);
    e->operand = ParseNot();
    return e;
  }
  return ParseCompare();
}

ExprPtr Parser::ParseCompare() {
  const int line = Peek().line;
  ExprPtr first = ParseMath1();
  std::unique_ptr<Expr> cmp;
  while (true) {
    std::string op;
    const Token& t = Peek();
    if (t.kind == K::kOperator &&
        (t.value == "==" || t.value == "!=" || t.value == "<" ||
         t.value == ">" || t.value == "<=" || t.value == ">=")) {
      op = Next().value;
    } else if (IsName("in")) {
      Next();
      op = "in";
    } else if (IsName("not") && IsName("in", 1)) {
      Next();
      Next();
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = NewExpr(Expr::Kind::kCompare, line);
      cmp->args.push_back(std::move(first));
    }
    cmp->ops.push_back(op);
    cmp->args.push_back(ParseMath1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

ExprPtr Parser::Binary(std::string op, int line, ExprPtr left, ExprPtr right) {
  auto e = NewExpr(Expr::Kind::kBinary, line);
  e->name = std::move(op);
  e->args.push_back(std::move(left));
  e->args.push_back(std::move(right));
  return e;
}

ExprPtr Parser::ParseMath1() {
  ExprPtr left = ParseConcat();
  while (IsOp("+") || IsOp("-")) {
    const Token& op = Next();
    left = Binary(op.value, op.line, std::move(left), ParseConcat());
  }
  return left;
}

ExprPtr Parser::ParseConcat() {
  ExprPtr left = ParseMath2();
  while (IsOp("~")) {
    const int line = Next().line;
    left = Binary("~", line, std::move(left), ParseMath2());
  }
  return left;
}

ExprPtr Parser::ParseMath2() {
  ExprPtr left = ParsePow();
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const Token& op = Next();
    left = Binary(op.value, op.line, std::move(left), ParsePow());
  }
  return left;
}

ExprPtr Parser::ParsePow() {
  ExprPtr left = ParseUnary(true);
  while (IsOp("**")) {
    const int line = Next().line;
    left = Binary("**", line, std::move(left), ParseUnary(true));
  }
  return left;
}

ExprPtr Parser::ParseUnary(bool with_filter) {
  DepthGuard guard(this);
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    const Token& op = Next();
    node =
        NewExpr(op.value == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, op.line);
    node->operand = ParseUnary(false);
  } else {
    node = ParsePrimary();
  }
  node = ParsePostfix(std::move(node));
  if (with_filter) node = ParseFilterExpr(std::move(node));
  return node;
}

ExprPtr Parser::ParsePrimary() {
  const Token& t = Next();
  switch (t.kind) {
    case K::kName: {
      auto e = NewExpr(Expr::Kind::kLiteral, t.line);
      if (t.value == "true" || t.value == "True") {
        e->literal = Value(true);
      } else if (t.value == "false" || t.value == "False") {
        e->literal = Value(false);
      } else if (t.value == "none" || t.value == "None") {
        e->literal = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.value;
      }
      return e;
    }
    case K::kString: {
      auto e = NewExpr(Expr::Kind::kLiteral, t.line);
      std::string s = t.value;
      while (Peek().kind == K::kString) s += Next().value;  // "a" "b"
      e->literal = Value(std::move(s));
      return e;
    }
    case K::kInt: {
      auto e = NewExpr(Expr::Kind::kLiteral, t.line);
      int64_t i;
      if (!absl::SimpleAtoi(t.value, &i)) {
        FailAt(t.line, absl::StrCat("integer literal out of range: ", t.value));
      }
      e->literal = Value(i);
      return e;
    }
    case K::kFloat: {
      auto e = NewExpr(Expr::Kind::kLiteral, t.line);
      e->literal = Value(std::strtod(t.value.c_str(), nullptr));
      return e;
    }
    case K::kOperator:
      if (t.value == "(") {
        if (AcceptOp(")")) {
          return NewExpr(Expr::Kind::kTuple, t.line);
        }
        ExprPtr first = ParseExpression();
        if (AcceptOp(")")) return first;  // parenthesized expression
        auto tuple = NewExpr(Expr::Kind::kTuple, t.line);
        tuple->args.push_back(std::move(first));
        while (AcceptOp(",")) {
          if (IsOp(")")) break;
          tuple->args.push_back(ParseExpression());
        }
        ExpectOp(")");
        return tuple;
      }
      if (t.value == "[") {
        auto list = NewExpr(Expr::Kind::kList, t.line);
        while (!IsOp("]")) {
          if (!list->args.empty()) {
            ExpectOp(",");
            if (IsOp("]")) break;
          }
          list->args.push_back(ParseExpression());
        }
        ExpectOp("]");
        return list;
      }
      if (t.value == "{") {
        auto dict = NewExpr(Expr::Kind::kDict, t.line);
        while (!IsOp("}")) {
          if (!dict->args.empty()) {
            ExpectOp(",");
            if (IsOp("}")) break;
          }
          dict->args.push_back(ParseExpression());
          ExpectOp(":");
          dict->args.push_back(ParseExpression());
        }
        ExpectOp("}");
        return dict;
      }
      break;
    default:
      break;
  }
  FailAt(t.line, absl::StrCat("unexpected ", Describe(t)));
}

ExprPtr Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (IsOp(".")) {
      const int line = Next().line;
      const Token& t = Next();
      if (t.kind == K::kName) {
        auto e = NewExpr(Expr::Kind::kAttr, line);
        e->operand = std::move(node);
        e->name = t.value;
        node = std::move(e);
      } else if (t.kind == K::kInt) {  // messages.0
        auto e = NewExpr(Expr::Kind::kItem, line);
        e->operand = std::move(node);
        auto index = NewExpr(Expr::Kind::kLiteral, line);
        int64_t i = 0;
        (void)absl::SimpleAtoi(t.value, &i);
        index->literal = Value(i);
        e->args.push_back(std::move(index));
        node = std::move(e);
      } else {
        FailAt(t.line, absl::StrCat("expected an attribute name after '.',"
                                    " got ",
                                    Describe(t)));
      }
    } else if (IsOp("[")) {
      node = ParseSubscript(std::move(node));
    } else if (IsOp("(")) {
      node = ParseCall(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::ParseSubscript(ExprPtr node) {
  const int line = Next().line;  // [
  ExprPtr parts[3];
  int colons = 0;
  while (!IsOp("]")) {
    if (AcceptOp(":")) {
      if (++colons > 2) FailAt(line, "a slice takes at most two ':'");
      continue;
    }
    if (parts[colons]) {
      FailAt(Peek().line,
             "unsupported subscript (expected one index or a "
             "slice)");
    }
    parts[colons] = ParseExpression();
  }
  ExpectOp("]");
  if (colons == 0) {
    if (!parts[0]) FailAt(line, "empty subscript");
    auto e = NewExpr(Expr::Kind::kItem, line);
    e->operand = std::move(node);
    e->args.push_back(std::move(parts[0]));
    return e;
  }
  auto e = NewExpr(Expr::Kind::kSlice, line);
  e->operand = std::move(node);
  for (auto& part : parts) e->args.push_back(std::move(part));
  return e;
}

void Parser::ParseArgs(Expr* e) {
  ExpectOp("(");
  while (!IsOp(")")) {
    if (!e->args.empty() || !e->kwargs.empty()) {
      ExpectOp(",");
      if (IsOp(")")) break;
    }
    if (IsOp("*") || IsOp("**")) {
      FailAt(Peek().line, "unsupported: *args / **kwargs in a call");
    }
    if (Peek().kind == K::kName && IsOp("=", 1)) {
      std::string name = Next().value;
      Next();  // =
      e->kwargs.emplace_back(std::move(name), ParseExpression());
    } else {
      if (!e->kwargs.empty()) {
        FailAt(Peek().line, "positional argument after keyword argument");
      }
      e->args.push_back(ParseExpression());
    }
  }
  ExpectOp(")");
}

ExprPtr Parser::ParseCall(ExprPtr callee) {
  auto e = NewExpr(Expr::Kind::kCall, Peek().line);
  e->operand = std::move(callee);
  ParseArgs(e.get());
  return e;
}

ExprPtr Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (IsOp("|")) {
      node = ParseFilterChain(std::move(node));
    } else if (IsName("is")) {
      node = ParseTest(std::move(node));
    } else if (IsOp("(")) {
      node = ParseCall(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::ParseFilterChain(ExprPtr node) {
  bool first = node == nullptr;  // `{% filter upper %}` has no leading '|'
  while (first || IsOp("|")) {
    if (!first) Next();
    first = false;
    const Token& name_token = Peek();
    std::string name = ExpectName();
    while (AcceptOp(".")) name += "." + ExpectName();
    auto e = NewExpr(Expr::Kind::kFilter, name_token.line);
    e->filter = FindFilter(name);
    if (e->filter == nullptr) {
      FailAt(name_token.line, absl::StrCat("unsupported filter '", name, "'"));
    }
    e->name = std::move(name);
    e->operand = std::move(node);
    if (IsOp("(")) ParseArgs(e.get());
    node = std::move(e);
  }
  return node;
}

ExprPtr Parser::ParseTest(ExprPtr node) {
  const int line = Next().line;  // is
  auto e = NewExpr(Expr::Kind::kTest, line);
  e->negated = AcceptName("not");
  const Token& name_token = Peek();
  std::string name = ExpectName();
  e->test = FindTest(name);
  if (e->test == nullptr) {
    FailAt(name_token.line, absl::StrCat("unsupported test '", name, "'"));
  }
  e->name = std::move(name);
  e->operand = std::move(node);
  const Token& t = Peek();
  if (IsOp("(")) {
    ParseArgs(e.get());
  } else if ((t.kind == K::kName || t.kind == K::kString || t.kind == K::kInt ||
              t.kind == K::kFloat || IsOp("[") || IsOp("{")) &&
             !IsName("else") && !IsName("or") && !IsName("and") &&
             !IsName("is") && !IsName("in") && !IsName("not") &&
             !IsName("if")) {
    // `x is divisibleby 3`, `x is equalto y`: one argument, no parens.
    e->args.push_back(ParsePostfix(ParsePrimary()));
  }
  return e;
}

}  // namespace fusionrl::jinja::internal
