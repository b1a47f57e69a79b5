// Tests of the chat-template interpreter (jinja.h). The expected texts of
// the table below were produced by jinja2 3.1 configured as transformers
// configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, json.dumps as tojson).
#include "template/jinja.h"

#include <string>

#include "absl/status/status.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl::jinja {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

RenderOptions Utc() {
  RenderOptions options;
  options.time_zone = absl::UTCTimeZone();
  return options;
}

absl::StatusOr<std::string> Render(
    const std::string& source,
    const ordered_json& variables = ordered_json::object(),
    const RenderOptions& options = Utc()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(variables, options);
}

// The message of a failed parse or render ("" if it succeeded).
std::string ErrorOf(const std::string& source,
                    const ordered_json& variables = ordered_json::object(),
                    const RenderOptions& options = Utc()) {
  absl::StatusOr<std::string> out = Render(source, variables, options);
  return out.ok() ? "" : std::string(out.status().message());
}

struct Case {
  const char* name;
  const char* source;
  const char* variables;  // JSON
  const char* expected;
};

// Each case is one construct; its expected text is jinja2's.
const Case kCases[] = {
    {"PrintsVariables", "Hello {{ name }}!", "{\"name\": \"world\"}",
     "Hello world!"},
    {"UndefinedPrintsEmpty", "[{{ missing }}]", "{}", "[]"},
    {"PrintsScalarsAsPython",
     "{{ none }}|{{ true }}|{{ 1.0 }}|{{ 2.5 }}|{{ 10/4 }}|{{ 7//2 }}|{{ -7//2 "
     "}}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 7 % -3 }}|{{ 7.5 // 2 }}",
     "{}", "None|True|1.0|2.5|2.5|3|-4|2|1024|-2|3.0"},
    {"PrintsContainersAsPythonRepr",
     "{{ [1, 'a', none, true] }}|{{ {'k': 'v'} }}|{{ (1,) }}|{{ (1, 2) }}",
     "{}", "[1, 'a', None, True]|{'k': 'v'}|(1,)|(1, 2)"},
    {"TrimBlocksRemovesNewlineAfterTag",
     "{% if true %}\n  yes\n{% endif %}\nafter", "{}", "  yes\nafter"},
    {"LstripBlocksOnlyAtLineStart", "  {% if true %}x{% endif %}\n  {{ 'y' }}",
     "{}", "x  y"},
    {"MinusStripsWhitespace", "a  {%- if true -%}  b  {%- endif -%}  c", "{}",
     "abc"},
    {"PlusDisablesLstripAndTrim", "  {%+ if true %}x{% endif +%}\nz", "{}",
     "  x\nz"},
    {"CommentsAreDropped", "a\n  {# c #}\nb", "{}", "a\nb"},
    {"RawIsLiteral", "{% raw %}{{ x }}{% endraw %}", "{}", "{{ x }}"},
    {"LoopVariables",
     "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ "
     "loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ "
     "loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
     "{}", "1032TrueFalse3b;2121FalseFalse3ac;3210FalseTrue3b;"},
    {"ForElseAndFilter",
     "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in range(6) if x "
     "is odd %}{{ x }}{{ loop.length }}{% endfor %}",
     "{}", "empty|133353"},
    {"BreakAndContinue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x "
     "== 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "{}", "0134"},
    {"TupleUnpackingOverItems",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1;a=2;"},
    {"NamespaceCarriesStateOutOfLoops",
     "{% set ns = namespace(n=0) %}{% for x in range(3) %}{% set ns.n = ns.n + "
     "x %}{% endfor %}{{ ns.n }}",
     "{}", "3"},
    {"SetInLoopDoesNotLeak",
     "{% set x = 1 %}{% for i in range(2) %}{% set x = 5 %}{% endfor %}{{ x }}",
     "{}", "1"},
    {"BlockSetWithFilter",
     "{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]{% set y | upper %}abc{% "
     "endset %}{{ y }}",
     "{}", "[a2b]ABC"},
    {"MacroWithDefaults",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro "
     "%}{{ greet('A') }} {{ greet('B', punct='?') }}",
     "{}", "Hi A! Hi B?"},
    {"CallBlockPassesCaller",
     "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro "
     "%}{% call wrap('b') %}bold{% endcall %}",
     "{}", "<b>bold</b>"},
    {"FilterBlock", "{% filter upper %}abc{% endfilter %}", "{}", "ABC"},
    {"Slicing",
     "{{ [1,2,3,4,5][1:] }}{{ [1,2,3,4,5][::-1] }}{{ [1,2,3,4,5][-2:] }}{{ "
     "'hello'[1:4] }}{{ 'héllo'[::-1] }}{{ [1,2,3,4,5][::2] }}{{ [1,2,3][5:] "
     "}}",
     "{}", "[2, 3, 4, 5][5, 4, 3, 2, 1][4, 5]ellolléh[1, 3, 5][]"},
    {"StringMethods",
     "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') "
     "}}|{{ 'a b  c'.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ "
     "'abc'.startswith(('x','a')) }}|{{ 'Hello World'.lower() }}|{{ 'hello "
     "world'.title() }}|{{ 'aaa'.replace('a','b',2) }}|{{ 'banana'.count('a') "
     "}}|{{ 'banana'.find('n') }}|{{ 'a b c'.rsplit(' ', 1) }}",
     "{}",
     "a b|a|['a', 'b', '', 'c']|['a', 'b', 'c']|['a', 'b,c']|True|hello "
     "world|Hello World|bba|3|2|['a b', 'c']"},
    {"Filters",
     "{{ '  x '|trim }}|{{ [3,1,2]|sort }}|{{ [1,2,3]|join(',') }}|{{ "
     "'abc'|upper }}|{{ [1,2]|length }}|{{ 'ab'|first }}|{{ [1,2]|last }}|{{ "
     "x|default('d') }}|{{ ''|default('d', true) }}|{{ '42'|int + 1 }}|{{ "
     "'1.5'|float }}|{{ [1,1,2]|unique|list }}|{{ -3|abs }}|{{ 2.567|round(2) "
     "}}|{{ 'hello world'|capitalize }}|{{ 'hello world-foo'|title }}|{{ "
     "[1,2,3]|reverse|list }}|{{ 'aXbX'|replace('X','y') }}",
     "{}",
     "x|[1, 2, 3]|1,2,3|ABC|2|a|2|d|d|43|1.5|[1, 2]|3|2.57|Hello world|Hello "
     "World-Foo|[3, 2, 1]|ayby"},
    {"ToJsonKeepsOrderAndUnicode", "{{ d|tojson }}|{{ d|tojson(indent=2) }}",
     "{\"d\": {\"b\": 1, \"a\": [\"x\", \"é\\n\\\"\\u0001\", null, true, 1.5], "
     "\"c\": {}, \"e\": []}}",
     "{\"b\": 1, \"a\": [\"x\", \"é\\n\\\"\\u0001\", null, true, 1.5], \"c\": "
     "{}, \"e\": []}|{\n  \"b\": 1,\n  \"a\": [\n    \"x\",\n    "
     "\"é\\n\\\"\\u0001\",\n    null,\n    true,\n    1.5\n  ],\n  \"c\": "
     "{},\n  \"e\": []\n}"},
    {"SelectAttrAndMap",
     "{{ "
     "msgs|selectattr('role','equalto','user')|map(attribute='content')|join(',"
     "') }}|{{ msgs|rejectattr('role','eq','user')|list|length }}|{{ "
     "['a','b']|map('upper')|list }}|{{ msgs|selectattr('tool')|list|length }}",
     "{\"msgs\": [{\"role\": \"user\", \"content\": \"u1\"}, {\"role\": "
     "\"assistant\", \"content\": \"a1\", \"tool\": 1}, {\"role\": \"user\", "
     "\"content\": \"u2\"}]}",
     "u1,u2|1|['A', 'B']|1"},
    {"Tests",
     "{{ 1 is odd }}{{ 2 is even }}{{ 6 is divisibleby 3 }}{{ x is defined "
     "}}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1 is integer "
     "}}{{ 1.0 is float }}{{ true is boolean }}{{ {} is mapping }}{{ [] is "
     "iterable }}{{ 'a' is sequence }}{{ range is callable }}{{ 'ab' is lower "
     "}}{{ 'AB' is upper }}{{ 1 is not none }}{{ true is true }}{{ 0 is false "
     "}}",
     "{}",
     "TrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue"
     "False"},
    {"InOperator",
     "{{ 'a' in 'abc' }}{{ 2 in [1,2] }}{{ 'k' in {'k':1} }}{{ 3 not in [1] }}",
     "{}", "TrueTrueTrueTrue"},
    {"ConditionalExpression", "{{ 'y' if true else 'n' }}{{ 'y' if false }}|",
     "{}", "y|"},
    {"TildeConcatenates", "{{ 1 ~ 'a' ~ none }}", "{}", "1aNone"},
    {"DictMethods",
     "{{ d.get('a') }}{{ d.get('z', 'def') }}{{ d.get('z') }}{{ d.keys()|list "
     "}}{{ d.values()|list }}",
     "{\"d\": {\"a\": 1}}", "1defNone['a'][1]"},
    {"IndentFilter",
     "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ "
     "'a\n\nb'|indent(4, blank=true) }}",
     "{}", "a\n  b\n\n  c|  a\n  b|a\n    \n    b"},
    {"DictsortAndItems", "{{ d|dictsort }}|{{ d|items|list }}",
     "{\"d\": {\"b\": 1, \"a\": 2}}",
     "[('a', 2), ('b', 1)]|[('b', 1), ('a', 2)]"},
    {"ChainedComparison", "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}", "{}", "TrueFalse"},
    {"IntegerAttributeAndNegativeIndex",
     "{{ messages.0.content }}{{ messages[-1]['content'] }}",
     "{\"messages\": [{\"content\": \"x\"}, {\"content\": \"y\"}]}", "xy"},
    {"AdjacentStringsAndBoolArithmetic", "{{ 'a' 'b' }}{{ true + 1 }}", "{}",
     "ab2"},
    {"TrimBlocksInLoops", "{% for x in [1,2] %}\n{{ x }}\n{% endfor %}\n", "{}",
     "1\n2\n"},
    {"EscapeFilter", "{{ '<a href=\"x\">&\\'' | e }}", "{}",
     "&lt;a href=&#34;x&#34;&gt;&amp;&#39;"},
    {"FloatRepr",
     "{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 100.0 }} {{ 3.0 * 2 }} {{ "
     "1.5e16 }} {{ 123456789.125 }}",
     "{}", "1e+20 0.30000000000000004 1e-05 100.0 6.0 1.5e+16 123456789.125"},
    {"ListAndStringOperators",
     "{{ [1] + [2] }}{{ 'ab' * 3 }}{{ {'a': \"it's\"} }}{{ 'tab\\there' ~ "
     "[\"q'\"] }}",
     "{}", "[1, 2]ababab{'a': \"it's\"}tab\there[\"q'\"]"},
    {"NestedLoopPrevitem",
     "{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.previtem }}{{ a }}{{ b "
     "}},{% endfor %}{% endfor %}",
     "{}", "1x,x1y,2x,x2y,"},
    {"MiscConversions",
     "{{ '%d'|length }}{{ [1,2,3]|list|first }}{{ none|string }}{{ 3|string }}",
     "{}", "21None3"},
    {"SetUnpacksTuples",
     "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t = (1, 'x') %}{{ t[1] }}",
     "{}", "12x"},
    {"MethodChaining",
     "{{ 'x'.upper() + 'Y'.lower() }}{{ 'ab cd'.split(' ')[-1] }}", "{}",
     "Xycd"},
    {"RealTemplateIdiom",
     "{%- for m in messages %}\n  {%- if m.role == 'user' %}\n    {{- 'U:' + "
     "m.content }}\n  {%- endif %}\n{%- endfor %}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "U:hi"},
    {"SortOptions",
     "{{ [3, 1, 2]|sort(reverse=true) }}{{ [{'n': 'b'}, {'n': "
     "'A'}]|sort(attribute='n')|map(attribute='n')|join }}",
     "{}", "[3, 2, 1]Ab"},
    {"TitleMethodVersusFilter",
     "{{ \"they're bill's\".title() }}|{{ \"they're bill's\"|title }}", "{}",
     "They'Re Bill'S|They're Bill's"},
    {"Round",
     "{{ 10|round }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ "
     "1.23|round(1, 'floor') }}",
     "{}", "10|2.0|4.0|2.67|1.2"},
    {"StringPredicates",
     "{{ '  '.isspace() }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}", "{}",
     "TrueTrueTrue"},
    {"IntAndFloatFilters",
     "{{ 'abc'|int }}|{{ '0x1A'|int(0, 16) }}|{{ '3.9'|int }}|{{ 'nan'|float "
     "}}",
     "{}", "0|26|3|nan"},
};

class JinjaCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(JinjaCaseTest, RendersAsJinja2) {
  const Case& c = GetParam();
  absl::StatusOr<std::string> out =
      Render(c.source, ordered_json::parse(c.variables));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, c.expected) << c.source;
}

INSTANTIATE_TEST_SUITE_P(Constructs, JinjaCaseTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

TEST(JinjaTest, KeepsTheKeyOrderOfJsonVariables) {
  const ordered_json vars = ordered_json::parse(R"({"d": {"z": 1, "a": 2}})");
  EXPECT_EQ(*Render("{% for k in d %}{{ k }}{% endfor %}|{{ d|tojson }}", vars),
            R"(za|{"z": 1, "a": 2})");
}

TEST(JinjaTest, ToJsonOptions) {
  const ordered_json vars = ordered_json::parse(R"({"d": {"b": "é", "a": 1}})");
  EXPECT_EQ(*Render("{{ d|tojson(sort_keys=true) }}", vars),
            R"({"a": 1, "b": "é"})");
  EXPECT_EQ(*Render("{{ d|tojson(ensure_ascii=true) }}", vars),
            R"({"b": "\u00e9", "a": 1})");
  EXPECT_EQ(*Render("{{ d|tojson(separators=(',', ':')) }}", vars),
            R"({"b":"é","a":1})");
  // Undefined is not JSON (json.dumps raises).
  EXPECT_THAT(ErrorOf("{{ missing|tojson }}"),
              HasSubstr("not JSON serializable"));
}

TEST(JinjaTest, GenerationTagRendersItsBody) {
  EXPECT_EQ(*Render("a\n{% generation %}\nb\n{% endgeneration %}\nc"),
            "a\nb\nc");
  EXPECT_EQ(*Render("a {%- generation -%} b {%- endgeneration -%} c"), "abc");
}

TEST(JinjaTest, AttributeOfUndefinedFailsAsInJinja2) {
  // jinja2's Undefined raises UndefinedError on attribute and item access;
  // an attribute missing from a real value is undefined.
  EXPECT_EQ(ErrorOf("{{ x.y }}"),
            "chat template line 1: attribute 'y' of an undefined value");
  EXPECT_EQ(ErrorOf("\n{{ messages[0].role }}",
                    {{"messages", ordered_json::array()}}),
            "chat template line 2: attribute 'role' of an undefined value");
  EXPECT_EQ(ErrorOf("{{ x[0] is defined }}"),
            "chat template line 1: item 0 of an undefined value");
  EXPECT_EQ(*Render("[{{ d.y }}]{{ d.y is defined }}{{ x is defined }}",
                    {{"d", ordered_json::object()}}),
            "[]FalseFalse");
}

TEST(JinjaTest, StrftimeNowUsesThePinnedClock) {
  RenderOptions options = Utc();
  options.now = absl::FromCivil(absl::CivilSecond(2024, 7, 6, 9, 5, 3),
                                absl::UTCTimeZone());
  EXPECT_EQ(*Render("{{ strftime_now('%d %b %Y') }}|"
                    "{{ strftime_now('%A %a %B %m/%d/%y %H:%M:%S %-d %j %p "
                    "%I %%') }}",
                    ordered_json::object(), options),
            "06 Jul 2024|Saturday Sat July 07/06/24 09:05:03 6 188 AM 09 %");
  options.time_zone = absl::FixedTimeZone(-10 * 3600);
  EXPECT_EQ(
      *Render("{{ strftime_now('%d %H') }}", ordered_json::object(), options),
      "05 23");
  EXPECT_THAT(ErrorOf("{{ strftime_now('%Q') }}"),
              HasSubstr("unsupported format code '%Q'"));
}

TEST(JinjaTest, RaiseExceptionCarriesTheMessageAndLine) {
  const std::string error = ErrorOf(
      "line one\n{% if true %}\n{{ raise_exception('Roles must "
      "alternate') }}\n{% endif %}");
  EXPECT_THAT(error, StartsWith("chat template line 3: "));
  EXPECT_THAT(error, HasSubstr("Roles must alternate"));
  EXPECT_EQ(Render("{{ raise_exception('x') }}").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JinjaTest, RefusesUnknownFiltersTestsAndTagsAtParseTime) {
  absl::StatusOr<Template> t = Template::Parse("a\n\n{{ x | wordwrap }}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(),
            "chat template line 3: unsupported filter 'wordwrap'");
  EXPECT_EQ(
      Template::Parse("{% if x is prime %}{% endif %}").status().message(),
      "chat template line 1: unsupported test 'prime'");
  EXPECT_EQ(Template::Parse("\n{% include 'x.jinja' %}").status().message(),
            "chat template line 2: unsupported tag 'include'");
  EXPECT_EQ(Template::Parse("{% for x in y recursive %}{% endfor %}")
                .status()
                .message(),
            "chat template line 1: unsupported: recursive for loops");
}

TEST(JinjaTest, ReportsSyntaxErrorsWithTheLine) {
  EXPECT_THAT(Template::Parse("{% if x %}\nunclosed").status().message(),
              HasSubstr("missing '{% endif %}'"));
  EXPECT_EQ(Template::Parse("\n\n{{ 1 + }}").status().message(),
            "chat template line 3: unexpected '}}'");
  EXPECT_THAT(Template::Parse("{{ 'abc }}").status().message(),
              HasSubstr("unterminated string"));
  EXPECT_EQ(Template::Parse("{% endfor %}").status().message(),
            "chat template line 1: unexpected '{% endfor %}'");
  EXPECT_EQ(Template::Parse("{% break %}").status().message(),
            "chat template line 1: 'break' outside of a for loop");
  EXPECT_THAT(Template::Parse("{# open").status().message(),
              HasSubstr("unclosed comment"));
}

TEST(JinjaTest, RefusesUnsupportedRuntimeConstructsWithTheLine) {
  EXPECT_EQ(ErrorOf("\n{{ 'a {0.real}'.format(1) }}"),
            "chat template line 2: unsupported: attribute or item access in "
            "a format field");
  EXPECT_EQ(ErrorOf("{{ [1].append(2) }}"),
            "chat template line 1: unsupported method 'append' of list");
  EXPECT_EQ(ErrorOf("{{ '%*d' % (2, 1) }}"),
            "chat template line 1: unsupported: '*' in a format");
  EXPECT_EQ(ErrorOf("{{ lipsum() }}"),
            "chat template line 1: 'lipsum' is undefined (unsupported "
            "function?)");
  EXPECT_EQ(ErrorOf("{% for x in 3 %}{% endfor %}"),
            "chat template line 1: 'int' object is not iterable");
  EXPECT_EQ(ErrorOf("{{ 'a' + 1 }}"),
            "chat template line 1: unsupported operand types for +: 'str' "
            "and 'int'");
  EXPECT_EQ(ErrorOf("{% set x = 1 %}{% set x.y = 2 %}"),
            "chat template line 1: cannot set attribute 'y' of a int (only "
            "of a namespace())");
  EXPECT_EQ(ErrorOf("{{ 1 // 0 }}"), "chat template line 1: division by zero");
  EXPECT_EQ(ErrorOf("{% for x in [1] %}{{ loop.changed(x) }}{% endfor %}"),
            "chat template line 1: unsupported: loop.changed");
}

TEST(JinjaTest, MacroErrorsNameTheMacro) {
  EXPECT_EQ(ErrorOf("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
            "chat template line 1: macro 'm' takes 1 arguments, got 2");
  EXPECT_EQ(ErrorOf("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}"),
            "chat template line 1: macro 'm' has no argument 'b'");
}

TEST(JinjaTest, LimitsOutputSize) {
  RenderOptions options = Utc();
  options.max_output_bytes = 1000;
  absl::StatusOr<std::string> out =
      Render("{% for i in range(200) %}0123456789{% endfor %}",
             ordered_json::object(), options);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out.status().message(), HasSubstr("max_output_bytes"));
  EXPECT_EQ(Render("{{ 'x' * 5000 }}", ordered_json::object(), options)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Render("{{ 'x' * 999 }}", ordered_json::object(), options).ok());
}

TEST(JinjaTest, LimitsRecursionAndLoops) {
  absl::StatusOr<std::string> out =
      Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out.status().message(), HasSubstr("max_call_depth"));
  // Bounded recursion is fine.
  EXPECT_EQ(*Render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}"
                    "{% endif %}{% endmacro %}{{ f(3) }}"),
            "321");

  RenderOptions options = Utc();
  options.max_loop_iterations = 50;
  EXPECT_EQ(Render("{% for i in range(10) %}{% for j in range(10) %}"
                   "{% endfor %}{% endfor %}",
                   ordered_json::object(), options)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(ErrorOf("{{ range(1000000) }}"), HasSubstr("range() of more"));

  std::string deep(1000, '(');
  EXPECT_THAT(
      Template::Parse("{{ " + deep + "1" + std::string(1000, ')') + " }}")
          .status()
          .message(),
      HasSubstr("nested deeper than"));
}

TEST(JinjaTest, RenderIsRepeatableAndTakesOnlyObjects) {
  absl::StatusOr<Template> t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for x in xs %}"
      "{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok()) << t.status();
  const ordered_json vars = {{"xs", {1, 2, 3}}};
  EXPECT_EQ(*t->Render(vars, Utc()), "6");
  EXPECT_EQ(*t->Render(vars, Utc()), "6");  // no state kept between renders
  EXPECT_EQ(t->Render(ordered_json::array(), Utc()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*Template().Render(ordered_json::object(), Utc()), "");
}

TEST(JinjaTest, StringIndexingCountsCodePoints) {
  const ordered_json vars = {{"s", "héllo 世界"}};
  EXPECT_EQ(
      *Render("{{ s|length }} {{ s[1] }} {{ s[-2:] }} {{ s|upper }}", vars),
      "8 é 世界 HÉLLO 世界");
}

}  // namespace
}  // namespace fusionrl::jinja
