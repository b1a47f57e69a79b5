// The chat-template parser: tokens to the AST, with jinja2's grammar
// (jinja2/parser.py). This file holds the statements (blocks, for, if, set,
// macros); the expressions are in jinja_parse_expr.cc, where filters and
// tests are resolved, so an unsupported one fails when the template is
// loaded.
#include "template/jinja_parser.h"

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {

Program Parser::Run() {
  Program program;
  std::string end = ParseBody(&program.body, {});
  if (!end.empty()) {
    FailAt(Peek().line, absl::StrCat("unexpected '", end, "'"));
  }
  return program;
}

std::string Parser::Describe(const Token& t) {
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

void Parser::ExpectOp(absl::string_view op) {
  if (!AcceptOp(op)) {
    FailAt(Peek().line,
           absl::StrCat("expected '", op, "', got ", Describe(Peek())));
  }
}

std::string Parser::ExpectName() {
  if (Peek().kind != K::kName) {
    FailAt(Peek().line,
           absl::StrCat("expected a name, got ", Describe(Peek())));
  }
  return Next().value;
}

void Parser::ExpectBlockEnd() {
  if (Peek().kind != K::kBlockEnd) {
    FailAt(Peek().line, absl::StrCat("expected '%}', got ", Describe(Peek())));
  }
  Next();
}

std::string Parser::ParseBody(Body* body,
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

void Parser::ParseStatement(Body* body) {
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

void Parser::ParseIf(Stmt* s) {
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

void Parser::ParseFor(Stmt* s) {
  s->kind = Stmt::Kind::kFor;
  s->targets = ParseTargets();
  if (!AcceptName("in")) {
    FailAt(Peek().line,
           absl::StrCat("expected 'in' in a for loop, got ", Describe(Peek())));
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

std::vector<std::string> Parser::ParseTargets() {
  std::vector<std::string> names;
  const bool paren = AcceptOp("(");
  do {
    names.push_back(ExpectName());
  } while (AcceptOp(",") && Peek().kind == K::kName);
  if (paren) ExpectOp(")");
  return names;
}

void Parser::ParseSet(Stmt* s) {
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

void Parser::ParseParams(Stmt* s) {
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

void Parser::ParseMacro(Stmt* s) {
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

void Parser::ParseCallBlock(Stmt* s) {
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

Program ParseTokens(const std::vector<Token>& tokens) {
  return Parser(tokens).Run();
}

}  // namespace fusionrl::jinja::internal
