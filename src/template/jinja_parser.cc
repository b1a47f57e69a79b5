// The chat-template parser: tokens to the AST, with jinja2's grammar and
// operator precedence (jinja2/parser.py). Filters and tests are resolved
// here, so an unsupported one fails when the template is loaded.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

using K = Token::Kind;

// Nesting of expressions and blocks; deeper templates are refused rather
// than risk the stack.
constexpr int kMaxNesting = 200;

ExprPtr NewExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Program Run() {
    Program program;
    std::string end = ParseBody(&program.body, {});
    if (!end.empty()) {
      FailAt(Peek().line, absl::StrCat("unexpected '", end, "'"));
    }
    return program;
  }

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
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case K::kEnd:
        return "end of template";
      case K::kBlockEnd:
        return "'%}'";
      case K::kVarEnd:
        return "'}}'";
      case K::kString:
        return "a string";
      default:
        return absl::StrCat("'", t.value, "'");
    }
  }
  void ExpectOp(absl::string_view op) {
    if (!AcceptOp(op)) {
      FailAt(Peek().line,
             absl::StrCat("expected '", op, "', got ", Describe(Peek())));
    }
  }
  std::string ExpectName() {
    if (Peek().kind != K::kName) {
      FailAt(Peek().line,
             absl::StrCat("expected a name, got ", Describe(Peek())));
    }
    return Next().value;
  }
  void ExpectBlockEnd() {
    if (Peek().kind != K::kBlockEnd) {
      FailAt(Peek().line,
             absl::StrCat("expected '%}', got ", Describe(Peek())));
    }
    Next();
  }

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
                        std::initializer_list<absl::string_view> ends) {
    DepthGuard guard(this);
    while (true) {
      const Token& t = Peek();
      if (t.kind == K::kEnd) {
        if (ends.size() == 0) return "";
        // The last end tag closes the block ("endif" of elif/else/endif).
        FailAt(t.line, absl::StrCat("missing '{% ", *(ends.end() - 1), " %}'"));
      }
      if (t.kind == K::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = Next().value;
        body->push_back(std::move(s));
      } else if (t.kind == K::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        s->expr = ParseTupleOrExpression();
        if (Peek().kind != K::kVarEnd) {
          FailAt(Peek().line,
                 absl::StrCat("expected '}}', got ", Describe(Peek())));
        }
        Next();
        body->push_back(std::move(s));
      } else if (t.kind == K::kBlockBegin) {
        Next();
        const Token& name = Peek();
        if (name.kind != K::kName) {
          FailAt(name.line,
                 absl::StrCat("expected a tag name, got ", Describe(name)));
        }
        for (absl::string_view end : ends) {
          if (name.value == end) {
            Next();
            return name.value;
          }
        }
        ParseStatement(body);
      } else {
        FailAt(t.line, absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  void ParseStatement(Body* body) {
    const Token& tag = Next();
    const std::string& name = tag.value;
    auto s = std::make_unique<Stmt>();
    s->line = tag.line;
    if (name == "if") {
      ParseIf(s.get());
    } else if (name == "for") {
      ParseFor(s.get());
    } else if (name == "set") {
      ParseSet(s.get());
    } else if (name == "macro") {
      ParseMacro(s.get());
    } else if (name == "call") {
      ParseCallBlock(s.get());
    } else if (name == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->expr = ParseFilterChain(nullptr);
      ExpectBlockEnd();
      ParseBody(&s->body, {"endfilter"});
      ExpectBlockEnd();
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) {
        FailAt(tag.line, absl::StrCat("'", name, "' outside of a for loop"));
      }
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
    } else if (name == "generation") {
      // transformers' AssistantTracker: the body renders unchanged (the
      // tag only marks assistant tokens for return_assistant_tokens_mask).
      ExpectBlockEnd();
      ParseBody(body, {"endgeneration"});
      ExpectBlockEnd();
      return;
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      FailAt(tag.line, absl::StrCat("unexpected '{% ", name, " %}'"));
    } else {
      FailAt(tag.line, absl::StrCat("unsupported tag '", name, "'"));
    }
    body->push_back(std::move(s));
  }

  void ParseIf(Stmt* s) {
    s->kind = Stmt::Kind::kIf;
    while (true) {
      s->conditions.push_back(ParseTupleOrExpression());
      ExpectBlockEnd();
      s->bodies.emplace_back();
      std::string end = ParseBody(&s->bodies.back(), {"elif", "else", "endif"});
      if (end == "elif") continue;
      if (end == "else") {
        ExpectBlockEnd();
        ParseBody(&s->else_body, {"endif"});
      }
      ExpectBlockEnd();
      return;
    }
  }

  void ParseFor(Stmt* s) {
    s->kind = Stmt::Kind::kFor;
    s->targets = ParseTargets();
    if (!AcceptName("in")) {
      FailAt(Peek().line, absl::StrCat("expected 'in' in a for loop, got ",
                                       Describe(Peek())));
    }
    s->expr = ParseTupleOrExpression(/*allow_condition=*/false);
    if (AcceptName("if")) s->condition = ParseExpression();
    if (IsName("recursive")) {
      FailAt(Peek().line, "unsupported: recursive for loops");
    }
    ExpectBlockEnd();
    ++loop_depth_;
    std::string end = ParseBody(&s->body, {"else", "endfor"});
    --loop_depth_;
    if (end == "else") {
      ExpectBlockEnd();
      ParseBody(&s->else_body, {"endfor"});
    }
    ExpectBlockEnd();
  }

  // `x` or `k, v` (optionally parenthesized).
  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = AcceptOp("(");
    do {
      names.push_back(ExpectName());
    } while (AcceptOp(",") && Peek().kind == K::kName);
    if (paren) ExpectOp(")");
    return names;
  }

  void ParseSet(Stmt* s) {
    if (Peek().kind == K::kName && IsOp(".", 1)) {
      // set ns.attr = value
      s->kind = Stmt::Kind::kSet;
      auto owner = NewExpr(Expr::Kind::kName, Peek().line);
      owner->name = Next().value;
      Next();  // .
      s->attr_owner = std::move(owner);
      s->text = ExpectName();
      ExpectOp("=");
      s->expr = ParseTupleOrExpression();
      ExpectBlockEnd();
      return;
    }
    s->targets = ParseTargets();
    if (AcceptOp("=")) {
      s->kind = Stmt::Kind::kSet;
      s->expr = ParseTupleOrExpression();
      ExpectBlockEnd();
      return;
    }
    if (s->targets.size() != 1) {
      FailAt(s->line, "a block set takes one name");
    }
    s->kind = Stmt::Kind::kSetBlock;
    if (AcceptOp("|")) s->expr = ParseFilterChain(nullptr);
    ExpectBlockEnd();
    ParseBody(&s->body, {"endset"});
    ExpectBlockEnd();
  }

  // `(a, b=default, ...)` of a macro or call block.
  void ParseParams(Stmt* s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      std::string name = ExpectName();
      ExprPtr default_value;
      if (AcceptOp("=")) default_value = ParseExpression();
      s->params.emplace_back(std::move(name), std::move(default_value));
    }
    ExpectOp(")");
  }

  void ParseMacro(Stmt* s) {
    s->kind = Stmt::Kind::kMacro;
    s->text = ExpectName();
    ParseParams(s);
    ExpectBlockEnd();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // a loop around the definition is not the body's
    ParseBody(&s->body, {"endmacro"});
    loop_depth_ = saved_loop_depth;
    if (Peek().kind == K::kName) Next();  // {% endmacro name %}
    ExpectBlockEnd();
  }

  void ParseCallBlock(Stmt* s) {
    s->kind = Stmt::Kind::kCallBlock;
    if (IsOp("(")) ParseParams(s);
    s->expr = ParseExpression();
    if (s->expr->kind != Expr::Kind::kCall) {
      FailAt(s->line, "expected a macro call after 'call'");
    }
    ExpectBlockEnd();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    ParseBody(&s->body, {"endcall"});
    loop_depth_ = saved_loop_depth;
    ExpectBlockEnd();
  }

  // ----------------------------------------------------------- expressions

  // An expression, or a tuple without parentheses (`{{ a, b }}`).
  ExprPtr ParseTupleOrExpression(bool allow_condition = true) {
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

  ExprPtr ParseExpression() {
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

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      auto e = NewExpr(Expr::Kind::kOr, Next().line);
      e->args.push_back(std::move(left));
      e->args.push_back(ParseAnd());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      auto e = NewExpr(Expr::Kind::kAnd, Next().line);
      e->args.push_back(std::move(left));
      e->args.push_back(ParseNot());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      auto e = NewExpr(Expr::Kind::kNot, Next().line);
      e->operand = ParseNot();
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
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

  ExprPtr Binary(std::string op, int line, ExprPtr left, ExprPtr right) {
    auto e = NewExpr(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& op = Next();
      left = Binary(op.value, op.line, std::move(left), ParseConcat());
    }
    return left;
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp("~")) {
      const int line = Next().line;
      left = Binary("~", line, std::move(left), ParseMath2());
    }
    return left;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = Next();
      left = Binary(op.value, op.line, std::move(left), ParsePow());
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Next().line;
      left = Binary("**", line, std::move(left), ParseUnary(true));
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = Next();
      node = NewExpr(op.value == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos,
                     op.line);
      node->operand = ParseUnary(false);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
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
          FailAt(t.line,
                 absl::StrCat("integer literal out of range: ", t.value));
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

  ExprPtr ParsePostfix(ExprPtr node) {
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

  ExprPtr ParseSubscript(ExprPtr node) {
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

  // Positional and keyword arguments up to the closing ')'.
  void ParseArgs(Expr* e) {
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

  ExprPtr ParseCall(ExprPtr callee) {
    auto e = NewExpr(Expr::Kind::kCall, Peek().line);
    e->operand = std::move(callee);
    ParseArgs(e.get());
    return e;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
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

  // `| name(args) | name ...` applied to `node` (null for a block's text).
  ExprPtr ParseFilterChain(ExprPtr node) {
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
        FailAt(name_token.line,
               absl::StrCat("unsupported filter '", name, "'"));
      }
      e->name = std::move(name);
      e->operand = std::move(node);
      if (IsOp("(")) ParseArgs(e.get());
      node = std::move(e);
    }
    return node;
  }

  ExprPtr ParseTest(ExprPtr node) {
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
    } else if ((t.kind == K::kName || t.kind == K::kString ||
                t.kind == K::kInt || t.kind == K::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and") &&
               !IsName("is") && !IsName("in") && !IsName("not") &&
               !IsName("if")) {
      // `x is divisibleby 3`, `x is equalto y`: one argument, no parens.
      e->args.push_back(ParsePostfix(ParsePrimary()));
    }
    return e;
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Program ParseTokens(const std::vector<Token>& tokens) {
  return Parser(tokens).Run();
}

}  // namespace fusionrl::jinja::internal
