// The chat-template parser's state (jinja_internal.h, ParseTokens): a
// recursive-descent walk over one template's tokens with jinja2's grammar.
// Statements are parsed in jinja_parser.cc, expressions (jinja2's operator
// precedence, filters and tests) in jinja_parse_expr.cc.
//
// Not thread-safe: one Parser parses one template, once.
#ifndef FUSIONRL_TASKS_JINJA_PARSER_H_
#define FUSIONRL_TASKS_JINJA_PARSER_H_

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {

// Nesting of expressions and blocks; deeper templates are refused rather
// than risk the stack.
inline constexpr int kMaxNesting = 200;

inline ExprPtr NewExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 private:
  using K = Token::Kind;

 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Program Run();

 private:
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() {
    const Token& t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kOperator && Peek(ahead).value == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kName && Peek(ahead).value == name;
  }
  bool AcceptOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool AcceptName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t);
  void ExpectOp(absl::string_view op);
  std::string ExpectName();
  void ExpectBlockEnd();
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxNesting) {
        FailAt(parser->Peek().line,
               absl::StrCat("template nested deeper than ", kMaxNesting));
      }
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  // ------------------------------------------------------------ statements

  // Parses statements into `body` until a block tag named in `ends`; returns
  // that name, with the tag's name consumed (its arguments and '%}' are the
  // caller's), or "" at the end of the template.
  std::string ParseBody(Body* body,
                        std::initializer_list<absl::string_view> ends);
  void ParseStatement(Body* body);
  void ParseIf(Stmt* s);
  void ParseFor(Stmt* s);

  // `x` or `k, v` (optionally parenthesized).
  std::vector<std::string> ParseTargets();
  void ParseSet(Stmt* s);

  // `(a, b=default, ...)` of a macro or call block.
  void ParseParams(Stmt* s);
  void ParseMacro(Stmt* s);
  void ParseCallBlock(Stmt* s);

  // ----------------------------------------------------------- expressions

  // An expression, or a tuple without parentheses (`{{ a, b }}`).
  ExprPtr ParseTupleOrExpression(bool allow_condition = true);
  ExprPtr ParseExpression();
  ExprPtr ParseOr();
  ExprPtr ParseAnd();
  ExprPtr ParseNot();
  ExprPtr ParseCompare();
  ExprPtr Binary(std::string op, int line, ExprPtr left, ExprPtr right);
  ExprPtr ParseMath1();
  ExprPtr ParseConcat();
  ExprPtr ParseMath2();
  ExprPtr ParsePow();
  ExprPtr ParseUnary(bool with_filter);
  ExprPtr ParsePrimary();
  ExprPtr ParsePostfix(ExprPtr node);
  ExprPtr ParseSubscript(ExprPtr node);

  // Positional and keyword arguments up to the closing ')'.
  void ParseArgs(Expr* e);
  ExprPtr ParseCall(ExprPtr callee);
  ExprPtr ParseFilterExpr(ExprPtr node);

  // `| name(args) | name ...` applied to `node` (null for a block's text).
  ExprPtr ParseFilterChain(ExprPtr node);
  ExprPtr ParseTest(ExprPtr node);

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace fusionrl::jinja::internal

#endif  // FUSIONRL_TASKS_JINJA_PARSER_H_
