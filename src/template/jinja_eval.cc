// The chat-template evaluator: runs the statements of one render with its
// own scopes and output buffer (expressions: jinja_eval_expr.cc), and
// Template's Parse/Render entry points, where a JinjaError becomes an
// absl::Status naming the template line.
#include <cmath>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "template/jinja.h"
#include "template/jinja_internal.h"
#include "template/jinja_interpreter.h"

namespace fusionrl::jinja {
namespace internal {

void Evaluator::CheckSize(size_t bytes) const {
  if (bytes > options().max_output_bytes) {
    FailResource(absl::StrCat("output larger than ", options().max_output_bytes,
                              " bytes (RenderOptions::max_output_bytes)"));
  }
}

std::string Interpreter::Run(const Program& program, const Value& variables) {
  auto root = std::make_shared<Frame>(nullptr);
  for (const auto& [name, value] : variables.as_dict().entries) {
    root->vars[name] = value;
  }
  std::string out;
  Exec(program.body, root, &out);
  return out;
}

Value Interpreter::Call(const Value& callable, CallArgs& args) {
  if (!callable.is_callable()) {
    Fail(callable.is_undefined() ? "cannot call an undefined value"
                                 : absl::StrCat("'", callable.TypeName(),
                                                "' object is not callable"));
  }
  return callable.as_callable().call(*this, args);
}

Flow Interpreter::Exec(const Body& body, const FramePtr& frame,
                       std::string* out) {
  for (const StmtPtr& s : body) {
    line_ = s->line;
    const Flow flow = ExecOne(*s, frame, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Flow Interpreter::ExecOne(const Stmt& s, const FramePtr& frame,
                          std::string* out) {
  switch (s.kind) {
    case Stmt::Kind::kText:
      Append(out, s.text);
      return Flow::kNormal;
    case Stmt::Kind::kOutput:
      Append(out, Eval(*s.expr, *frame).Str());
      return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conditions.size(); ++i) {
        if (Eval(*s.conditions[i], *frame).Truthy()) {
          return Exec(s.bodies[i], frame, out);
        }
      }
      return Exec(s.else_body, frame, out);
    case Stmt::Kind::kFor:
      ExecFor(s, frame, out);
      return Flow::kNormal;
    case Stmt::Kind::kSet:
      ExecSet(s, *frame);
      return Flow::kNormal;
    case Stmt::Kind::kSetBlock: {
      std::string text;
      Exec(s.body, frame, &text);
      frame->vars[s.targets[0]] =
          s.expr ? ApplyFilterChain(*s.expr, Value(std::move(text)), *frame)
                 : Value(std::move(text));
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      frame->vars[s.text] = MakeMacro(s, frame, s.text);
      return Flow::kNormal;
    case Stmt::Kind::kCallBlock: {
      const Expr& call = *s.expr;
      Value callee = Eval(*call.operand, *frame);
      CallArgs args = EvalArgs(call, *frame);
      args.keyword.emplace_back("caller", MakeMacro(s, frame, "caller"));
      line_ = s.line;
      Append(out, Call(callee, args).Str());
      return Flow::kNormal;
    }
    case Stmt::Kind::kFilterBlock: {
      std::string text;
      Exec(s.body, frame, &text);
      Append(out,
             ApplyFilterChain(*s.expr, Value(std::move(text)), *frame).Str());
      return Flow::kNormal;
    }
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::Bind(const std::vector<std::string>& targets,
                       const Value& value, Frame& frame) {
  if (targets.size() == 1) {
    frame.vars[targets[0]] = value;
    return;
  }
  if (!value.is_list()) {
    Fail(absl::StrCat("cannot unpack a ", value.TypeName(), " into ",
                      targets.size(), " names"));
  }
  const auto& items = value.as_list().items;
  if (items.size() != targets.size()) {
    Fail(absl::StrCat(items.size() < targets.size() ? "not enough" : "too many",
                      " values to unpack (expected ", targets.size(), ", got ",
                      items.size(), ")"));
  }
  for (size_t i = 0; i < items.size(); ++i) frame.vars[targets[i]] = items[i];
}

void Interpreter::ExecFor(const Stmt& s, const FramePtr& frame,
                          std::string* out) {
  const Value iterable = Eval(*s.expr, *frame);
  if (iterable.is_none()) Fail("'NoneType' object is not iterable");
  std::vector<Value> items = Iterate(iterable);
  if (s.condition) {  // `for x in xs if cond`: filtered before `loop`
    std::vector<Value> kept;
    for (Value& item : items) {
      auto test_frame = std::make_shared<Frame>(frame);
      Bind(s.targets, item, *test_frame);
      if (Eval(*s.condition, *test_frame).Truthy()) {
        kept.push_back(std::move(item));
      }
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Exec(s.else_body, frame, out);
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    if (++iterations_ > options_.max_loop_iterations) {
      FailResource(absl::StrCat(
          "more than ", options_.max_loop_iterations,
          " loop iterations (RenderOptions::max_loop_iterations)"));
    }
    auto info = std::make_shared<LoopInfo>();
    info->index0 = i;
    info->length = n;
    if (i > 0) info->previtem = items[i - 1];
    if (i + 1 < n) info->nextitem = items[i + 1];
    auto iteration = std::make_shared<Frame>(frame);
    Bind(s.targets, items[i], *iteration);
    iteration->vars["loop"] = Value::MakeLoop(std::move(info));
    if (Exec(s.body, iteration, out) == Flow::kBreak) break;
  }
}

void Interpreter::ExecSet(const Stmt& s, Frame& frame) {
  Value value = Eval(*s.expr, frame);
  if (s.attr_owner) {
    const Value owner = Eval(*s.attr_owner, frame);
    if (!owner.is_namespace()) {
      Fail(absl::StrCat("cannot set attribute '", s.text, "' of a ",
                        owner.TypeName(), " (only of a namespace())"));
    }
    owner.namespace_dict().Set(s.text, std::move(value));
    return;
  }
  Bind(s.targets, value, frame);
}

Value Interpreter::MakeMacro(const Stmt& s, const FramePtr& defined_in,
                             const std::string& name) {
  const Stmt* stmt = &s;
  // The macro lives in `defined_in` itself: hold that frame weakly, or the
  // two would keep each other alive after the render.
  std::weak_ptr<Frame> weak = defined_in;
  return Value::MakeCallable(
      absl::StrCat("macro '", name, "'"),
      [this, stmt, weak, name](Evaluator&, CallArgs& args) -> Value {
        FramePtr closure = weak.lock();
        if (closure == nullptr) {
          Fail(absl::StrCat("macro '", name, "' called after its scope"));
        }
        return CallMacro(*stmt, name, closure, args);
      });
}

Value Interpreter::CallMacro(const Stmt& s, const std::string& name,
                             const FramePtr& closure, CallArgs& args) {
  if (++call_depth_ > options_.max_call_depth) {
    FailResource(absl::StrCat("macro calls nested deeper than ",
                              options_.max_call_depth,
                              " (RenderOptions::max_call_depth)"));
  }
  auto frame = std::make_shared<Frame>(closure);
  if (args.positional.size() > s.params.size()) {
    Fail(absl::StrCat("macro '", name, "' takes ", s.params.size(),
                      " arguments, got ", args.positional.size()));
  }
  std::vector<bool> bound(s.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    frame->vars[s.params[i].first] = args.positional[i];
    bound[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < s.params.size() && s.params[i].first != key) ++i;
    if (i < s.params.size()) {
      if (bound[i]) {
        Fail(absl::StrCat("macro '", name, "' got argument '", key, "' twice"));
      }
      bound[i] = true;
    } else if (key != "caller") {
      Fail(absl::StrCat("macro '", name, "' has no argument '", key, "'"));
    }
    frame->vars[key] = value;
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (bound[i]) continue;
    const ExprPtr& default_value = s.params[i].second;
    frame->vars[s.params[i].first] =
        default_value ? Eval(*default_value, *frame) : Value();
  }
  std::string out;
  const int saved_line = line_;
  Exec(s.body, frame, &out);
  line_ = saved_line;
  --call_depth_;
  return Value(std::move(out));
}

namespace {

absl::Status ToStatus(const JinjaError& error, int line) {
  if (error.line > 0) line = error.line;
  return absl::Status(
      error.code,
      line > 0 ? absl::StrCat("chat template line ", line, ": ", error.message)
               : absl::StrCat("chat template: ", error.message));
}

}  // namespace
}  // namespace internal

Template::Template() : program_(std::make_shared<internal::Program>()) {}

Template::Template(std::shared_ptr<const internal::Program> program)
    : program_(std::move(program)) {}

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  try {
    auto program = std::make_shared<internal::Program>(internal::ParseTokens(
        internal::Tokenize(absl::string_view(source.data(), source.size()))));
    return Template(std::move(program));
  } catch (const internal::JinjaError& error) {
    return internal::ToStatus(error, 0);
  }
}

absl::StatusOr<std::string> Template::Render(
    const nlohmann::ordered_json& variables,
    const RenderOptions& options) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template variables must be a JSON object, got ",
                     variables.type_name()));
  }
  internal::Interpreter interpreter(options);
  try {
    return interpreter.Run(*program_, internal::FromJson(variables));
  } catch (const internal::JinjaError& error) {
    return internal::ToStatus(error, interpreter.line());
  }
}

}  // namespace fusionrl::jinja
