// The chat-template tests (`x is defined`, `is divisibleby(3)`, ...):
// jinja2's that chat templates use; looked up by name when a template is
// parsed.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

const Value& TestArg(CallArgs& args, absl::string_view test) {
  if (args.positional.size() != 1 || !args.keyword.empty()) {
    Fail(absl::StrCat("test '", test, "' takes one argument"));
  }
  return args.positional[0];
}
void NoTestArgs(CallArgs& args, absl::string_view test) {
  if (!args.positional.empty() || !args.keyword.empty()) {
    Fail(absl::StrCat("test '", test, "' takes no arguments"));
  }
}

#define FUSIONRL_JINJA_SIMPLE_TEST(fn_name, test_name, expr) \
  bool fn_name(Evaluator&, const Value& v, CallArgs& args) { \
    NoTestArgs(args, test_name);                             \
    return (expr);                                           \
  }
FUSIONRL_JINJA_SIMPLE_TEST(TestDefined, "defined", !v.is_undefined())
FUSIONRL_JINJA_SIMPLE_TEST(TestUndefined, "undefined", v.is_undefined())
FUSIONRL_JINJA_SIMPLE_TEST(TestNone, "none", v.is_none())
FUSIONRL_JINJA_SIMPLE_TEST(TestString, "string", v.is_string())
// Python's bools are numbers (isinstance(True, Number)), not integers for
// jinja2's `integer` test.
FUSIONRL_JINJA_SIMPLE_TEST(TestNumber, "number", v.is_number() || v.is_bool())
FUSIONRL_JINJA_SIMPLE_TEST(TestInteger, "integer", v.is_int())
FUSIONRL_JINJA_SIMPLE_TEST(TestFloat, "float", v.is_float())
FUSIONRL_JINJA_SIMPLE_TEST(TestBoolean, "boolean", v.is_bool())
FUSIONRL_JINJA_SIMPLE_TEST(TestTrue, "true", v.is_bool() && v.as_bool())
FUSIONRL_JINJA_SIMPLE_TEST(TestFalse, "false", v.is_bool() && !v.as_bool())
FUSIONRL_JINJA_SIMPLE_TEST(TestMapping, "mapping", v.is_dict())
FUSIONRL_JINJA_SIMPLE_TEST(TestIterable, "iterable",
                           v.is_list() || v.is_dict() || v.is_string() ||
                               v.is_undefined())
FUSIONRL_JINJA_SIMPLE_TEST(TestSequence, "sequence",
                           v.is_list() || v.is_dict() || v.is_string() ||
                               v.is_undefined())
FUSIONRL_JINJA_SIMPLE_TEST(TestCallable, "callable", v.is_callable())
// jinja2: str(value).islower() / .isupper().
FUSIONRL_JINJA_SIMPLE_TEST(TestLower, "lower",
                           IsPyLowerOrUpper(v.Str(), /*lower=*/true))
FUSIONRL_JINJA_SIMPLE_TEST(TestUpper, "upper",
                           IsPyLowerOrUpper(v.Str(), /*lower=*/false))
#undef FUSIONRL_JINJA_SIMPLE_TEST

int64_t RequireIntOperand(const Value& v, absl::string_view test) {
  if (!v.is_int() && !v.is_bool()) {
    Fail(
        absl::StrCat("test '", test, "' needs an integer, not ", v.TypeName()));
  }
  return v.is_int() ? v.as_int() : v.as_bool();
}
bool TestOdd(Evaluator&, const Value& v, CallArgs& args) {
  NoTestArgs(args, "odd");
  return RequireIntOperand(v, "odd") % 2 != 0;
}
bool TestEven(Evaluator&, const Value& v, CallArgs& args) {
  NoTestArgs(args, "even");
  return RequireIntOperand(v, "even") % 2 == 0;
}
bool TestDivisibleBy(Evaluator&, const Value& v, CallArgs& args) {
  const int64_t n =
      RequireIntOperand(TestArg(args, "divisibleby"), "divisibleby");
  if (n == 0) Fail("division by zero");
  return RequireIntOperand(v, "divisibleby") % n == 0;
}
bool TestEq(Evaluator&, const Value& v, CallArgs& args) {
  return Equals(v, TestArg(args, "eq"));
}
bool TestNe(Evaluator&, const Value& v, CallArgs& args) {
  return !Equals(v, TestArg(args, "ne"));
}
bool TestLt(Evaluator&, const Value& v, CallArgs& args) {
  return LessThan(v, TestArg(args, "lt"));
}
bool TestLe(Evaluator&, const Value& v, CallArgs& args) {
  return !LessThan(TestArg(args, "le"), v);
}
bool TestGt(Evaluator&, const Value& v, CallArgs& args) {
  return LessThan(TestArg(args, "gt"), v);
}
bool TestGe(Evaluator&, const Value& v, CallArgs& args) {
  return !LessThan(v, TestArg(args, "ge"));
}
bool TestIn(Evaluator&, const Value& v, CallArgs& args) {
  return Contains(TestArg(args, "in"), v);
}

struct NamedTest {
  absl::string_view name;
  TestFn fn;
};
constexpr NamedTest kTests[] = {
    {"!=", TestNe},
    {"<", TestLt},
    {"<=", TestLe},
    {"==", TestEq},
    {">", TestGt},
    {">=", TestGe},
    {"boolean", TestBoolean},
    {"callable", TestCallable},
    {"defined", TestDefined},
    {"divisibleby", TestDivisibleBy},
    {"eq", TestEq},
    {"equalto", TestEq},
    {"even", TestEven},
    {"false", TestFalse},
    {"float", TestFloat},
    {"ge", TestGe},
    {"greaterthan", TestGt},
    {"gt", TestGt},
    {"in", TestIn},
    {"integer", TestInteger},
    {"iterable", TestIterable},
    {"le", TestLe},
    {"lessthan", TestLt},
    {"lower", TestLower},
    {"lt", TestLt},
    {"mapping", TestMapping},
    {"ne", TestNe},
    {"none", TestNone},
    {"number", TestNumber},
    {"odd", TestOdd},
    {"sequence", TestSequence},
    {"string", TestString},
    {"true", TestTrue},
    {"undefined", TestUndefined},
    {"upper", TestUpper},
};

}  // namespace

TestFn FindTest(absl::string_view name) {
  for (const NamedTest& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

}  // namespace fusionrl::jinja::internal
