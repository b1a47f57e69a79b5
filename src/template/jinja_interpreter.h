// The chat-template evaluator's state (jinja_internal.h): one render's walk
// over the AST with its own scopes and output buffer. Statements run in
// jinja_eval.cc, expressions are evaluated in jinja_eval_expr.cc.
//
// Not thread-safe: one Interpreter renders one template, once.
#ifndef FUSIONRL_TASKS_JINJA_INTERPRETER_H_
#define FUSIONRL_TASKS_JINJA_INTERPRETER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "template/jinja.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {

// A variable scope: the render's variables at the root, then one frame per
// for-loop iteration and macro call. Frames are shared because a macro keeps
// the frame it was defined in (Jinja's lexical scoping).
struct Frame {
  explicit Frame(std::shared_ptr<Frame> p) : parent(std::move(p)) {}
  std::shared_ptr<Frame> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* Lookup(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter final : public Evaluator {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}

  const RenderOptions& options() const override { return options_; }
  int line() const { return line_; }

  std::string Run(const Program& program, const Value& variables);
  Value Call(const Value& callable, CallArgs& args) override;

 private:
  void Append(std::string* out, std::string_view text) {
    CheckSize(out->size() + text.size());
    out->append(text);
  }

  // ------------------------------------------------------------ statements

  Flow Exec(const Body& body, const FramePtr& frame, std::string* out);
  Flow ExecOne(const Stmt& s, const FramePtr& frame, std::string* out);
  void Bind(const std::vector<std::string>& targets, const Value& value,
            Frame& frame);

  // jinja2's scoping: each iteration runs in a frame of its own below
  // `frame`, so a `set` in the body (also inside an `if`) lasts until the
  // end of that iteration, and neither the targets nor those names are
  // visible after the loop (namespace() is the way out).
  void ExecFor(const Stmt& s, const FramePtr& frame, std::string* out);
  void ExecSet(const Stmt& s, Frame& frame);

  // A macro (or a call block's `caller`) as a callable that renders its
  // body in a new frame below the frame it was defined in.
  Value MakeMacro(const Stmt& s, const FramePtr& defined_in,
                  const std::string& name);
  Value CallMacro(const Stmt& s, const std::string& name,
                  const FramePtr& closure, CallArgs& args);

  // ----------------------------------------------------------- expressions

  CallArgs EvalArgs(const Expr& e, Frame& frame);

  // `chain` is a kFilter chain whose innermost operand is null: `input`.
  Value ApplyFilterChain(const Expr& chain, Value input, Frame& frame);
  Value GetAttr(const Value& obj, const std::string& name);
  Value GetItem(const Value& obj, const Value& key);

  // obj['name']: the key first (jinja2's getitem), then the attribute.
  Value GetAttrOrKey(const Value& obj, const std::string& name);
  Value Eval(const Expr& e, Frame& frame);
  Value EvalSlice(const Expr& e, Frame& frame);
  Value EvalCall(const Expr& e, Frame& frame);
  bool Compare(const std::string& op, const Value& a, const Value& b);
  Value Arithmetic(const std::string& op, const Value& a, const Value& b);

  const RenderOptions& options_;
  int line_ = 0;  // of the node being evaluated: errors name it
  int call_depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace fusionrl::jinja::internal

#endif  // FUSIONRL_TASKS_JINJA_INTERPRETER_H_
