// Internals of the chat-template interpreter (jinja.h), shared by its rooms
// in data-path order: jinja_lexer.cc (text -> tokens, whitespace control),
// jinja_parser.cc and jinja_parse_expr.cc (tokens -> AST: statements,
// expressions; jinja_parser.h), jinja_eval.cc and jinja_eval_expr.cc (AST ->
// output: statements, expressions; jinja_interpreter.h), with
// jinja_filters.cc and jinja_filters_more.cc (filters), jinja_is_tests.cc
// (tests), jinja_strings.cc (str operations and methods), jinja_format.cc
// (Python's % and str.format), jinja_builtins.cc (dict / list methods,
// globals), jinja_value.cc (the value model: printing, equality, UTF-8
// helpers) and jinja_json.cc (JSON in and out).
//
// Errors unwind the recursive parser and evaluator as a JinjaError and are
// turned into absl::Status by Template::Parse / Render; no exception leaves
// the module.
#ifndef FUSIONRL_TEMPLATE_JINJA_INTERNAL_H_
#define FUSIONRL_TEMPLATE_JINJA_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "template/jinja.h"

namespace fusionrl::jinja::internal {

// ---------------------------------------------------------------- errors

struct JinjaError {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  std::string message;
  int line = 0;  // 0: the line of the node being evaluated
};

[[noreturn]] void Fail(std::string message);
[[noreturn]] void FailAt(int line, std::string message);
[[noreturn]] void FailResource(std::string message);

// ---------------------------------------------------------------- values

class Value;
struct CallArgs;
class Evaluator;

struct List {
  std::vector<Value> items;
  bool is_tuple = false;  // prints as (a, b); otherwise the same
};

// A string-keyed mapping in insertion order (JSON objects, dict literals,
// namespaces). Lookup is linear: chat-template dicts are small.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* Find(absl::string_view key) const;
  void Set(std::string key, Value value);
};

struct Callable {
  std::string name;  // for messages: "range", "macro 'render_tool'", ...
  std::function<Value(Evaluator&, CallArgs&)> call;
};

// The `loop` variable of a for loop.
struct LoopInfo;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable,
    kLoop
  };

  Value() = default;  // undefined
  static Value None();
  Value(bool b) : data_(b) {}          // NOLINT: implicit, as Python literals
  Value(int64_t i) : data_(i) {}       // NOLINT
  Value(int i) : data_(int64_t{i}) {}  // NOLINT
  Value(double d) : data_(d) {}        // NOLINT
  Value(std::string s) : data_(std::move(s)) {}          // NOLINT
  Value(const char* s) : data_(std::string(s)) {}        // NOLINT
  Value(absl::string_view s) : data_(std::string(s)) {}  // NOLINT
  static Value MakeList(std::vector<Value> items, bool is_tuple = false);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(Dict dict);
  static Value MakeCallable(std::string name,
                            std::function<Value(Evaluator&, CallArgs&)> fn);
  static Value MakeLoop(std::shared_ptr<const LoopInfo> loop);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }
  bool is_loop() const { return kind() == Kind::kLoop; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<ListPtr>(data_); }
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  Dict& namespace_dict() const { return *std::get<NamespacePtr>(data_); }
  const Callable& as_callable() const { return *std::get<CallablePtr>(data_); }
  const LoopInfo& as_loop() const { return *std::get<LoopPtr>(data_); }

  // Python semantics.
  bool Truthy() const;
  std::string TypeName() const;  // "str", "int", "NoneType", "undefined", ...
  // str(value): what {{ value }} prints (undefined prints "").
  std::string Str() const;
  // repr(value): how a value prints inside a list or dict.
  std::string Repr() const;
  // An int or bool as a number (Python's bools are ints); else fails.
  double AsDouble() const;

 private:
  struct NoneTag {};
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NamespacePtr = std::shared_ptr<Dict>;  // mutable: `set ns.x = ...`
  using CallablePtr = std::shared_ptr<const Callable>;
  using LoopPtr = std::shared_ptr<const LoopInfo>;
  // The order matches Kind.
  std::variant<std::monostate, NoneTag, bool, int64_t, double, std::string,
               ListPtr, DictPtr, NamespacePtr, CallablePtr, LoopPtr>
      data_;
};

struct LoopInfo {
  int64_t index0 = 0;
  int64_t length = 0;
  Value previtem;  // undefined on the first item
  Value nextitem;  // undefined on the last item
};

// Python ==.
bool Equals(const Value& a, const Value& b);
// Python <: numbers, strings (by code point), lists; fails for other types.
bool LessThan(const Value& a, const Value& b);
// `item in container`.
bool Contains(const Value& container, const Value& item);
// The attribute of a loop variable (`loop.index`); undefined if unknown.
Value LoopAttribute(const LoopInfo& loop, absl::string_view name);

// The items a for loop visits: list items, dict keys, string characters;
// undefined is empty. Fails for other types.
std::vector<Value> Iterate(const Value& value);

// Python's float repr (1.0, 0.1, 1e+16, inf).
std::string FloatRepr(double d);

Value FromJson(const nlohmann::ordered_json& json);

struct JsonDumpOptions {
  int indent = -1;  // < 0: one line with ", " and ": " separators
  std::string indent_string;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(value) as transformers' tojson calls it; fails for undefined,
// callables and loops (not JSON serializable).
std::string ToJson(const Value& value, const JsonDumpOptions& options);

// UTF-8 helpers (Python str semantics on code points). Invalid UTF-8 bytes
// count as one code point each.
std::vector<uint32_t> DecodeUtf8(absl::string_view s);
void AppendUtf8(uint32_t code_point, std::string* out);
std::string EncodeUtf8(const std::vector<uint32_t>& code_points);
bool IsPythonSpace(uint32_t c);
uint32_t ToUpper(uint32_t c);
uint32_t ToLower(uint32_t c);
bool IsCased(uint32_t c);

// ---------------------------------------------------------------- strings
// Python str operations shared by filters and methods (jinja_strings.cc).

// Argument checks: fail naming `what` unless the value has the type.
const std::string& RequireString(const Value* v, absl::string_view what);
int64_t RequireInt(const Value* v, absl::string_view what);  // int or bool
bool OptionalBool(const Value* v, bool if_missing);          // truthiness
// Each code point through `fn`; with ToUpper / ToLower, Python's full case
// mappings that expand a letter ('ß'.upper() == 'SS') apply.
std::string MapCodePoints(const std::string& s, uint32_t (*fn)(uint32_t));
// A character of Python's regex \w (letters, numbers, '_').
bool IsPythonWordChar(uint32_t c);
std::string Capitalize(const std::string& s);  // str.capitalize()
// str.strip(chars) (left and right), lstrip (left) or rstrip (right).
std::string Strip(const std::string& s, const Value* chars, bool left,
                  bool right);
std::vector<std::string> SplitLines(const std::string& s);
// str.replace(old, new, count); count < 0: all.
std::string Replace(Evaluator& ev, const std::string& s, const std::string& old,
                    const std::string& replacement, int64_t count);
// The attribute of map/selectattr/sort(attribute=...): a dotted path of
// keys or list indices ("function.name", "0"); undefined if absent.
Value AttributePath(const Value& item, const std::string& path);
// Python's float(str): surrounding whitespace, inf, nan, exponents.
bool ParseFloat(const std::string& text, double* out);
// Python's str.islower() (lower) or str.isupper(): at least one cased
// character, and every cased one already lower (upper) case.
bool IsPyLowerOrUpper(const std::string& s, bool lower);
// Python's `fmt % args` (args: a tuple of values, a mapping for %(key)s,
// or the one value) and `fmt.format(*args, **kwargs)` (jinja_format.cc).
std::string PercentFormat(Evaluator& ev, const std::string& fmt,
                          const Value& args);
std::string StrFormat(Evaluator& ev, const std::string& fmt,
                      const CallArgs& args);
// The safe str methods (`s.split`, ...): IsStrMethod says which exist.
bool IsStrMethod(absl::string_view name);
Value StrMethod(Evaluator& ev, const std::string& s, absl::string_view name,
                CallArgs& args);

// ---------------------------------------------------------------- AST

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

using FilterFn = Value (*)(Evaluator&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Evaluator&, const Value& input, CallArgs& args);

// nullptr when the name is not supported.
FilterFn FindFilter(absl::string_view name);
// The filters of jinja_filters_more.cc (FindFilter's fallback).
FilterFn FindMoreFilter(absl::string_view name);
TestFn FindTest(absl::string_view name);
// A global function (range, namespace, ...) or undefined.
Value FindGlobal(absl::string_view name);
// A method of a str, dict or list (`s.split`, `d.items`) bound to
// `receiver`; undefined if the type has no such (safe) method.
Value FindMethod(const Value& receiver, absl::string_view name);

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args
    kTuple,     // args
    kDict,      // args: key, value, key, value, ...
    kAttr,      // operand.name
    kItem,      // operand[args[0]]
    kSlice,     // operand[args[0]:args[1]:args[2]] (each may be null)
    kCall,      // operand(args, kwargs)
    kFilter,    // operand | name(args, kwargs)
    kTest,      // operand is [not] name(args)
    kNeg,       // -operand
    kPos,       // +operand
    kNot,       // not operand
    kBinary,    // args[0] name args[1]; name is + - * / // % ** ~
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    kCondition  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line;
  Value literal;
  std::string name;
  ExprPtr operand;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: == != < > <= >= in notin
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool negated = false;  // kTest: `is not`
};

// A filter applied to a block (`{% filter upper %}`, `{% set x | trim %}`):
// a kFilter chain whose innermost operand is null (the block's text).
struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; else_body
    kFor,          // for targets in expr [if condition]: body [else else_body]
    kSet,          // set targets = expr   |  set expr.attr = value
    kSetBlock,     // set targets[0] [| filter] %} body {% endset
    kMacro,        // macro name(params) body
    kCallBlock,    // call[(params)] expr: body
    kFilterBlock,  // filter chain: body
    kBreak,
    kContinue
  };
  Kind kind;
  int line;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;   // kFor's `if`
  ExprPtr attr_owner;  // kSet on `ns.attr`: ns (attribute in `text`)
  std::vector<std::string> targets;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  // kMacro / kCallBlock parameters with their defaults (null: required).
  std::vector<std::pair<std::string, ExprPtr>> params;
};

struct Program {
  Body body;
};

// ---------------------------------------------------------------- lexer

struct Token {
  enum class Kind {
    kText,        // template text (whitespace control already applied)
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kVarBegin,    // {{
    kVarEnd,      // }}
    kName,
    kString,
    kInt,
    kFloat,
    kOperator,  // ( ) [ ] { } , . : | = + - * / // % ** ~ < > <= >= == !=
    kEnd
  };
  Kind kind;
  std::string value;  // text, name, decoded string, number or operator
  int line;
};

// Tokens of `source` with trim_blocks, lstrip_blocks, `-`/`+` whitespace
// control, comments and {% raw %} resolved. Fails on a lexical error.
std::vector<Token> Tokenize(absl::string_view source);

// The AST of `tokens`. Fails on a syntax error or an unsupported construct.
Program ParseTokens(const std::vector<Token>& tokens);

// ---------------------------------------------------------------- calls

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Binds these arguments to the parameter `names` of `function` (Python
  // rules: positional first, then by keyword); a slot is nullptr when not
  // given. Fails on too many arguments or an unknown keyword.
  std::vector<const Value*> Bind(
      absl::string_view function,
      std::initializer_list<absl::string_view> names) const;
};

// What the builtins need from the evaluator.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual const RenderOptions& options() const = 0;
  virtual Value Call(const Value& callable, CallArgs& args) = 0;
  // Fails with ResourceExhausted when a string of `bytes` would pass
  // RenderOptions::max_output_bytes.
  void CheckSize(size_t bytes) const;
};

}  // namespace fusionrl::jinja::internal

#endif  // FUSIONRL_TEMPLATE_JINJA_INTERNAL_H_
