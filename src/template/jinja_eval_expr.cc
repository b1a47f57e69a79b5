// The chat-template evaluator's expressions: names and attributes, items
// and slices, calls, filters and tests, comparisons and Python's arithmetic.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "template/jinja.h"
#include "template/jinja_internal.h"
#include "template/jinja_interpreter.h"

namespace fusionrl::jinja::internal {
namespace {

int64_t IntOf(const Value& v) { return v.is_int() ? v.as_int() : v.as_bool(); }
bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
bool IsNumeric(const Value& v) { return v.is_number() || v.is_bool(); }

// Python's floor division and modulo.
int64_t FloorDiv(int64_t a, int64_t b) {
  if (b == -1 && a == INT64_MIN) Fail("integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t FloorMod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Python's slice of `n` items: the indices it visits, in order.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start_v,
                                  const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> const Value* {
    if (v.is_undefined() || v.is_none()) return nullptr;
    if (!IsIntLike(v)) {
      Fail(absl::StrCat("slice ", what, " must be an integer or none, not ",
                        v.TypeName()));
    }
    return &v;
  };
  const Value* start_p = as_index(start_v, "start");
  const Value* stop_p = as_index(stop_v, "stop");
  const Value* step_p = as_index(step_v, "step");
  const int64_t step = step_p ? IntOf(*step_p) : 1;
  if (step == 0) Fail("slice step cannot be zero");
  auto clamp = [&](const Value* p, int64_t if_missing) {
    if (p == nullptr) return if_missing;
    int64_t i = IntOf(*p);
    if (i < 0) i += n;
    if (step > 0) return std::max<int64_t>(0, std::min(i, n));
    return std::max<int64_t>(-1, std::min(i, n - 1));
  };
  const int64_t start = clamp(start_p, step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(stop_p, step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(i);
  }
  return out;
}

}  // namespace

CallArgs Interpreter::EvalArgs(const Expr& e, Frame& frame) {
  CallArgs args;
  args.positional.reserve(e.args.size());
  for (const ExprPtr& a : e.args) args.positional.push_back(Eval(*a, frame));
  for (const auto& [k, a] : e.kwargs) {
    args.keyword.emplace_back(k, Eval(*a, frame));
  }
  return args;
}

Value Interpreter::ApplyFilterChain(const Expr& chain, Value input,
                                    Frame& frame) {
  if (chain.operand) input = ApplyFilterChain(*chain.operand, input, frame);
  CallArgs args = EvalArgs(chain, frame);
  line_ = chain.line;
  return chain.filter(*this, input, args);
}

Value Interpreter::GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kDict: {
      // jinja2 tries the Python attribute first: d.items is the method.
      Value method = FindMethod(obj, name);
      if (!method.is_undefined()) return method;
      const Value* v = obj.as_dict().Find(name);
      return v ? *v : Value();
    }
    case Value::Kind::kNamespace: {
      const Value* v = obj.namespace_dict().Find(name);
      return v ? *v : Value();
    }
    case Value::Kind::kLoop:
      return LoopAttribute(obj.as_loop(), name);
    case Value::Kind::kString:
    case Value::Kind::kList:
      return FindMethod(obj, name);
    case Value::Kind::kUndefined:  // jinja2's Undefined raises
      Fail(absl::StrCat("attribute '", name, "' of an undefined value"));
    default:
      return Value();  // undefined, as jinja2's getattr of None or 1
  }
}

Value Interpreter::GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
    case Value::Kind::kLoop:
      return key.is_string() ? GetAttrOrKey(obj, key.as_string()) : Value();
    case Value::Kind::kList: {
      if (!IsIntLike(key)) {
        return key.is_string() ? GetAttr(obj, key.as_string()) : Value();
      }
      const auto& items = obj.as_list().items;
      int64_t i = IntOf(key);
      if (i < 0) i += static_cast<int64_t>(items.size());
      if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value();
      return items[i];
    }
    case Value::Kind::kString: {
      if (!IsIntLike(key)) {
        return key.is_string() ? GetAttr(obj, key.as_string()) : Value();
      }
      const std::vector<uint32_t> cps = DecodeUtf8(obj.as_string());
      int64_t i = IntOf(key);
      if (i < 0) i += static_cast<int64_t>(cps.size());
      if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Value();
      std::string one;
      AppendUtf8(cps[i], &one);
      return Value(std::move(one));
    }
    case Value::Kind::kUndefined:  // jinja2's Undefined raises
      Fail(absl::StrCat("item ", key.Repr(), " of an undefined value"));
    default:
      return Value();
  }
}

Value Interpreter::GetAttrOrKey(const Value& obj, const std::string& name) {
  if (obj.is_dict()) {
    const Value* v = obj.as_dict().Find(name);
    return v ? *v : FindMethod(obj, name);
  }
  return GetAttr(obj, name);
}

Value Interpreter::Eval(const Expr& e, Frame& frame) {
  line_ = e.line;
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName: {
      const Value* v = frame.Lookup(e.name);
      return v ? *v : FindGlobal(e.name);
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) items.push_back(Eval(*a, frame));
      return Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Dict dict;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value key = Eval(*e.args[i], frame);
        if (!key.is_string()) {
          Fail(absl::StrCat("unsupported: a dict key of type ", key.TypeName(),
                            " (keys must be strings)"));
        }
        dict.Set(key.as_string(), Eval(*e.args[i + 1], frame));
      }
      return Value::MakeDict(std::move(dict));
    }
    case Expr::Kind::kAttr:
      return GetAttr(Eval(*e.operand, frame), e.name);
    case Expr::Kind::kItem: {
      Value obj = Eval(*e.operand, frame);
      return GetItem(obj, Eval(*e.args[0], frame));
    }
    case Expr::Kind::kSlice:
      return EvalSlice(e, frame);
    case Expr::Kind::kCall:
      return EvalCall(e, frame);
    case Expr::Kind::kFilter: {
      Value input = Eval(*e.operand, frame);
      CallArgs args = EvalArgs(e, frame);
      line_ = e.line;
      return e.filter(*this, input, args);
    }
    case Expr::Kind::kTest: {
      Value input = Eval(*e.operand, frame);
      CallArgs args = EvalArgs(e, frame);
      line_ = e.line;
      return Value(e.test(*this, input, args) != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      Value v = Eval(*e.operand, frame);
      if (!IsNumeric(v)) {
        Fail(absl::StrCat("bad operand type for unary ",
                          e.kind == Expr::Kind::kNeg ? "-" : "+", ": '",
                          v.TypeName(), "'"));
      }
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(IntOf(v)) : v;
      if (v.is_float()) return Value(-v.as_float());
      if (IntOf(v) == INT64_MIN) Fail("integer overflow");
      return Value(-IntOf(v));
    }
    case Expr::Kind::kNot:
      return Value(!Eval(*e.operand, frame).Truthy());
    case Expr::Kind::kAnd: {
      Value left = Eval(*e.args[0], frame);
      return left.Truthy() ? Eval(*e.args[1], frame) : left;
    }
    case Expr::Kind::kOr: {
      Value left = Eval(*e.args[0], frame);
      return left.Truthy() ? left : Eval(*e.args[1], frame);
    }
    case Expr::Kind::kBinary: {
      Value left = Eval(*e.args[0], frame);
      Value right = Eval(*e.args[1], frame);
      line_ = e.line;
      return Arithmetic(e.name, left, right);
    }
    case Expr::Kind::kCompare: {
      Value left = Eval(*e.args[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = Eval(*e.args[i + 1], frame);
        line_ = e.line;
        if (!Compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::kCondition:
      if (Eval(*e.args[1], frame).Truthy()) return Eval(*e.args[0], frame);
      return e.args[2] ? Eval(*e.args[2], frame) : Value();
  }
  return Value();
}

Value Interpreter::EvalSlice(const Expr& e, Frame& frame) {
  Value obj = Eval(*e.operand, frame);
  Value parts[3];
  for (int i = 0; i < 3; ++i) {
    if (e.args[i]) parts[i] = Eval(*e.args[i], frame);
  }
  line_ = e.line;
  if (obj.is_list()) {
    const auto& items = obj.as_list().items;
    std::vector<Value> out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(items.size()), parts[0],
                                  parts[1], parts[2])) {
      out.push_back(items[i]);
    }
    return Value::MakeList(std::move(out), obj.as_list().is_tuple);
  }
  if (obj.is_string()) {
    const std::vector<uint32_t> cps = DecodeUtf8(obj.as_string());
    std::string out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), parts[0],
                                  parts[1], parts[2])) {
      AppendUtf8(cps[i], &out);
    }
    return Value(std::move(out));
  }
  if (obj.is_undefined()) Fail("slice of an undefined value");
  Fail(absl::StrCat("cannot slice a ", obj.TypeName()));
}

Value Interpreter::EvalCall(const Expr& e, Frame& frame) {
  Value callee;
  if (e.operand->kind == Expr::Kind::kAttr) {
    // A method call: name the method if the type has no such method.
    Value receiver = Eval(*e.operand->operand, frame);
    callee = GetAttr(receiver, e.operand->name);
    if (callee.is_undefined() &&
        (receiver.is_string() || receiver.is_list() || receiver.is_dict())) {
      line_ = e.line;
      Fail(absl::StrCat("unsupported method '", e.operand->name, "' of ",
                        receiver.TypeName()));
    }
    if (callee.is_undefined()) {
      line_ = e.line;
      Fail(absl::StrCat("'", e.operand->name, "' is undefined (called on a ",
                        receiver.TypeName(), ")"));
    }
  } else {
    callee = Eval(*e.operand, frame);
    if (callee.is_undefined() && e.operand->kind == Expr::Kind::kName) {
      line_ = e.line;
      Fail(absl::StrCat("'", e.operand->name,
                        "' is undefined (unsupported function?)"));
    }
  }
  CallArgs args = EvalArgs(e, frame);
  line_ = e.line;
  return Call(callee, args);
}

bool Interpreter::Compare(const std::string& op, const Value& a,
                          const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "<") return LessThan(a, b);
  if (op == ">") return LessThan(b, a);
  if (op == "<=") return !LessThan(b, a);
  if (op == ">=") return !LessThan(a, b);
  if (op == "in") return Contains(b, a);
  return !Contains(b, a);  // notin
}

Value Interpreter::Arithmetic(const std::string& op, const Value& a,
                              const Value& b) {
  if (op == "~") {
    std::string s = a.Str();
    std::string t = b.Str();
    CheckSize(s.size() + t.size());
    return Value(s + t);
  }
  const bool numeric = IsNumeric(a) && IsNumeric(b);
  const bool ints = numeric && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(IntOf(a), IntOf(b), &r)) {
        Fail("integer overflow");
      }
      return Value(r);
    }
    if (numeric) return Value(a.AsDouble() + b.AsDouble());
    if (a.is_string() && b.is_string()) {
      CheckSize(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() &&
        a.as_list().is_tuple == b.as_list().is_tuple) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(),
                   b.as_list().items.end());
      return Value::MakeList(std::move(items), a.as_list().is_tuple);
    }
  } else if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(IntOf(a), IntOf(b), &r)) {
        Fail("integer overflow");
      }
      return Value(r);
    }
    if (numeric) return Value(a.AsDouble() - b.AsDouble());
  } else if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(IntOf(a), IntOf(b), &r)) {
        Fail("integer overflow");
      }
      return Value(r);
    }
    if (numeric) return Value(a.AsDouble() * b.AsDouble());
    const Value& seq = IsIntLike(a) ? b : a;
    const Value& count = IsIntLike(a) ? a : b;
    if (IsIntLike(count) && (seq.is_string() || seq.is_list())) {
      const int64_t n = std::max<int64_t>(0, IntOf(count));
      if (seq.is_string()) {
        CheckSize(seq.as_string().size() * static_cast<size_t>(n));
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value(std::move(out));
      }
      CheckSize(seq.as_list().items.size() * static_cast<size_t>(n));
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq.as_list().items.begin(),
                     seq.as_list().items.end());
      }
      return Value::MakeList(std::move(items), seq.as_list().is_tuple);
    }
  } else if (op == "/") {
    if (numeric) {
      if (b.AsDouble() == 0) Fail("division by zero");
      return Value(a.AsDouble() / b.AsDouble());
    }
  } else if (op == "//" || op == "%") {
    if (a.is_string() && op == "%") {
      return Value(PercentFormat(*this, a.as_string(), b));
    }
    if (numeric) {
      if (b.AsDouble() == 0) Fail("division by zero");
      if (ints) {
        return Value(op == "//" ? FloorDiv(IntOf(a), IntOf(b))
                                : FloorMod(IntOf(a), IntOf(b)));
      }
      const double x = a.AsDouble();
      const double y = b.AsDouble();
      if (op == "//") return Value(std::floor(x / y));
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
  } else if (op == "**") {
    if (ints && IntOf(b) >= 0) {
      int64_t result = 1;
      int64_t base = IntOf(a);
      for (int64_t e = IntOf(b); e > 0; --e) {
        if (__builtin_mul_overflow(result, base, &result)) {
          Fail("integer overflow");
        }
        if (result == 0 || result == 1) break;
      }
      return Value(result);
    }
    if (numeric) return Value(std::pow(a.AsDouble(), b.AsDouble()));
  }
  Fail(absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(),
                    "' and '", b.TypeName(), "'"));
}

}  // namespace fusionrl::jinja::internal
