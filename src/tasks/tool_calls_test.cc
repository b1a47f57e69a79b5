// Tests of parsing and writing tool calls in the three formats
// (tool_calls.h) and of choosing the format for a chat template.
#include "tasks/tool_calls.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "template/chat_format.h"
#include "template/chat_template.h"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<ToolSpec> Tools() {
  ToolSpec calc;
  calc.name = "calc";
  calc.description = "Evaluates integer arithmetic";
  calc.parameters_json =
      R"({"type": "object", "properties": {"expression": {"type": "string"}},)"
      R"( "required": ["expression"]})";
  ToolSpec lookup;  // the first property is not the required one
  lookup.name = "lookup";
  lookup.parameters_json =
      R"({"type": "object", "properties": {"limit": {"type": "integer"}, )"
      R"("key": {"type": "string"}}, "required": ["key"]})";
  ToolSpec now;  // no arguments
  now.name = "now";
  return {calc, lookup, now};
}

// The calls as "name args" strings, for compact assertions.
std::vector<std::string> Calls(const ParsedTurn& turn) {
  std::vector<std::string> out;
  for (const ToolCall& c : turn.calls) {
    out.push_back(c.name + " " + c.arguments_json);
  }
  return out;
}

ParsedTurn Parse(ToolFormat format, std::string_view text) {
  return ParseToolCalls(format, text, Tools());
}

TEST(ToolFormatTest, Names) {
  EXPECT_EQ(ToolFormatName(ToolFormat::kHermes), "hermes");
  EXPECT_EQ(ToolFormatName(ToolFormat::kLlama3), "llama3");
  EXPECT_EQ(ToolFormatName(ToolFormat::kPlain), "plain");
}

TEST(HermesToolCallsTest, ParsesSeveralCallsAndTheContent) {
  const ParsedTurn t = Parse(
      ToolFormat::kHermes,
      "Let me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": "
      "{\"expression\": \"3*4\"}}\n</tool_call>\n<tool_call>{\"name\":"
      "\"lookup\",\"arguments\":{\"key\":\"a\",\"limit\":2}}</tool_call>\n"
      "Done.  ");
  EXPECT_THAT(Calls(t), ElementsAre(R"(calc {"expression":"3*4"})",
                                    R"(lookup {"key":"a","limit":2})"));
  EXPECT_THAT(t.errors, IsEmpty());
  EXPECT_EQ(t.content, "Let me compute.\n\n\nDone.");
}

TEST(HermesToolCallsTest, TextWithoutCallsIsAllContent) {
  const ParsedTurn t = Parse(ToolFormat::kHermes, "  The answer is 12.\n");
  EXPECT_THAT(t.calls, IsEmpty());
  EXPECT_THAT(t.errors, IsEmpty());
  EXPECT_EQ(t.content, "The answer is 12.");
}

TEST(HermesToolCallsTest, ArgumentsAsAJsonStringAreAccepted) {
  const ParsedTurn t =
      Parse(ToolFormat::kHermes, R"(<tool_call>{"name": "calc", "arguments": )"
                                 R"("{\"expression\": \"1+1\"}"}</tool_call>)");
  EXPECT_THAT(Calls(t), ElementsAre(R"(calc {"expression":"1+1"})"));
  EXPECT_THAT(t.errors, IsEmpty());
}

TEST(HermesToolCallsTest, MissingOrNullArgumentsAreEmpty) {
  const ParsedTurn t = Parse(ToolFormat::kHermes,
                             R"(<tool_call>{"name": "now"}</tool_call>)"
                             R"(<tool_call>{"name": "now", "arguments": null})"
                             R"(</tool_call>)");
  EXPECT_THAT(Calls(t), ElementsAre("now {}", "now {}"));
}

TEST(HermesToolCallsTest, MalformedCallsAreNumberedErrors) {
  const ParsedTurn t = Parse(
      ToolFormat::kHermes,
      R"(a <tool_call>{"name": calc}</tool_call> b )"
      R"(<tool_call>{"name": "calc", "arguments": {"expression": "1"}})"
      R"(</tool_call><tool_call>{"name": "foo", "arguments": {}})"
      R"(</tool_call><tool_call>{"name": "calc", "arguments": [1]})"
      R"(</tool_call><tool_call>{"name": "calc", "arguments": "nope"})"
      R"(</tool_call><tool_call>{"arguments": {}}</tool_call>)"
      R"(<tool_call>[1]</tool_call><tool_call>{"name": 3}</tool_call> c)");
  EXPECT_THAT(Calls(t), ElementsAre(R"(calc {"expression":"1"})"));
  EXPECT_THAT(
      t.errors,
      ElementsAre("tool call 1: not valid JSON",
                  "tool call 3: unknown tool 'foo' (offered: calc, lookup, "
                  "now)",
                  "tool call 4: \"arguments\" is not an object",
                  "tool call 5: \"arguments\" is not an object",
                  "tool call 6: no \"name\"", "tool call 7: not a JSON object",
                  "tool call 8: \"name\" is not a non-empty string"));
  EXPECT_EQ(t.content, "a  b  c");
}

TEST(HermesToolCallsTest, UnclosedTag) {
  const ParsedTurn t =
      Parse(ToolFormat::kHermes,
            "x <tool_call>{\"name\": \"calc\", \"arguments\": {\"expression\"");
  EXPECT_THAT(t.calls, IsEmpty());
  EXPECT_THAT(
      t.errors,
      ElementsAre("tool call 1: unclosed <tool_call> (no </tool_call>)"));
  EXPECT_EQ(t.content, "x");
}

TEST(HermesToolCallsTest, NoToolsOffered) {
  const ParsedTurn t = ParseToolCalls(
      ToolFormat::kHermes, R"(<tool_call>{"name": "calc"}</tool_call>)", {});
  EXPECT_THAT(t.errors, ElementsAre("tool call 1: unknown tool 'calc' "
                                    "(offered: none)"));
}

TEST(HermesToolCallsTest, DeeplyNestedArgumentsAreRejected) {
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  const ParsedTurn t =
      Parse(ToolFormat::kHermes,
            R"(<tool_call>{"name": "calc", "arguments": {"expression": )" +
                deep + "}}</tool_call>");
  EXPECT_THAT(t.calls, IsEmpty());
  EXPECT_THAT(t.errors, ElementsAre("tool call 1: not valid JSON"));
}

TEST(Llama3ToolCallsTest, ParsesCallsSeparatedBySemicolons) {
  const ParsedTurn t = Parse(
      ToolFormat::kLlama3,
      " <|python_tag|>{\"name\": \"calc\", \"parameters\": {\"expression\": "
      "\"2*3;\"}}; {\"name\": \"lookup\", \"arguments\": {\"key\": \"}\"}}");
  EXPECT_THAT(Calls(t), ElementsAre(R"(calc {"expression":"2*3;"})",
                                    R"(lookup {"key":"}"})"));
  EXPECT_THAT(t.errors, IsEmpty());
  EXPECT_EQ(t.content, "");
}

TEST(Llama3ToolCallsTest, PlainTurnIsContent) {
  const ParsedTurn t = Parse(ToolFormat::kLlama3, " The answer is {6}. ");
  EXPECT_THAT(t.calls, IsEmpty());
  EXPECT_THAT(t.errors, IsEmpty());
  EXPECT_EQ(t.content, "The answer is {6}.");
}

TEST(Llama3ToolCallsTest, TextAfterTheCallIsContent) {
  const ParsedTurn t = Parse(ToolFormat::kLlama3,
                             R"({"name": "now", "parameters": {}} then more)");
  EXPECT_THAT(Calls(t), ElementsAre("now {}"));
  EXPECT_EQ(t.content, "then more");
}

TEST(Llama3ToolCallsTest, Errors) {
  EXPECT_THAT(Parse(ToolFormat::kLlama3, R"({"name": "calc")").errors,
              ElementsAre("tool call 1: not valid JSON (the object never "
                          "closes)"));
  EXPECT_THAT(Parse(ToolFormat::kLlama3, R"({"name": calc})").errors,
              ElementsAre("tool call 1: not valid JSON"));
  EXPECT_THAT(
      Parse(ToolFormat::kLlama3,
            R"({"name": "now"}; {"name": "x", "parameters": {}})")
          .errors,
      ElementsAre("tool call 2: unknown tool 'x' (offered: calc, lookup, "
                  "now)"));
  EXPECT_THAT(
      Parse(ToolFormat::kLlama3, R"({"name": "calc", "parameters": 5})").errors,
      ElementsAre("tool call 1: \"parameters\" is not an object"));
}

TEST(PlainToolCallsTest, ParsesCallsAnywhere) {
  const ParsedTurn t =
      Parse(ToolFormat::kPlain,
            "I will use [calc 347*29] and [lookup some key] then [now]. ");
  EXPECT_THAT(Calls(t), ElementsAre(R"(calc {"expression":"347*29"})",
                                    R"(lookup {"key":"some key"})", "now {}"));
  EXPECT_THAT(t.errors, IsEmpty());
  EXPECT_EQ(t.content, "I will use  and  then .");
}

TEST(PlainToolCallsTest, TextOfAToolWithoutPropertiesIsInput) {
  EXPECT_THAT(Calls(Parse(ToolFormat::kPlain, "[now utc]")),
              ElementsAre(R"(now {"input":"utc"})"));
}

TEST(PlainToolCallsTest, BracketsInsideNest) {
  EXPECT_THAT(Calls(Parse(ToolFormat::kPlain, "[calc [1]+2]x")),
              ElementsAre(R"(calc {"expression":"[1]+2"})"));
}

TEST(PlainToolCallsTest, Errors) {
  const ParsedTurn t =
      Parse(ToolFormat::kPlain, "[calc] [foo 1] [ 2] [calc 1+1] [calc 3");
  EXPECT_THAT(Calls(t), ElementsAre(R"(calc {"expression":"1+1"})"));
  EXPECT_THAT(t.errors,
              ElementsAre("tool call 1: [calc] has no expression (write "
                          "[calc expression])",
                          "tool call 2: unknown tool 'foo' (offered: calc, "
                          "lookup, now)",
                          "tool call 3: no tool name (write [name text])",
                          "tool call 5: unclosed '[' (write [name text])"));
  EXPECT_EQ(t.content, "");
}

TEST(WriteToolCallTest, WritesEachFormat) {
  const ToolCall call{"calc", R"({"expression":"3*4"})"};
  EXPECT_EQ(*WriteToolCall(ToolFormat::kHermes, call, Tools()),
            "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
            "\"3*4\"}}\n</tool_call>");
  EXPECT_EQ(*WriteToolCall(ToolFormat::kLlama3, call, Tools()),
            R"({"name": "calc", "parameters": {"expression": "3*4"}})");
  EXPECT_EQ(*WriteToolCall(ToolFormat::kPlain, call, Tools()), "[calc 3*4]");
  EXPECT_EQ(*WriteToolCall(ToolFormat::kPlain, {"now", "{}"}, Tools()),
            "[now]");
}

TEST(WriteToolCallTest, RoundTripsThroughTheParser) {
  const std::vector<ToolCall> calls = {
      {"calc", R"({"expression":"(1+2)*[3]"})"},
      {"lookup", R"({"key":"a \"quoted\" ; key }"})"},
      {"now", "{}"},
  };
  for (const ToolFormat format :
       {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kPlain}) {
    std::string text;
    for (const ToolCall& call : calls) {
      absl::StatusOr<std::string> written =
          WriteToolCall(format, call, Tools());
      ASSERT_TRUE(written.ok()) << written.status();
      if (!text.empty()) text += format == ToolFormat::kLlama3 ? "; " : "\n";
      text += *written;
    }
    const ParsedTurn t = Parse(format, text);
    SCOPED_TRACE(text);
    EXPECT_THAT(t.errors, IsEmpty());
    EXPECT_EQ(t.content, "");
    EXPECT_THAT(
        Calls(t),
        ElementsAre(R"(calc {"expression":"(1+2)*[3]"})",
                    R"(lookup {"key":"a \"quoted\" ; key }"})", "now {}"));
  }
}

TEST(WriteToolCallTest, PlainRejectsWhatItCannotCarry) {
  const auto message = [](const ToolCall& call) {
    return std::string(
        WriteToolCall(ToolFormat::kPlain, call, Tools()).status().message());
  };
  EXPECT_EQ(message({"lookup", R"({"key":"a","limit":2})"}),
            "tool call 'lookup': has 2 arguments; the plain format [name "
            "text] carries one");
  EXPECT_EQ(message({"lookup", R"({"limit":2})"}),
            "tool call 'lookup': argument 'limit' is not the one [name text] "
            "fills ('key')");
  EXPECT_EQ(message({"calc", R"({"expression":12})"}),
            "tool call 'calc': argument 'expression' is not a string; the "
            "plain format [name text] carries text");
  EXPECT_EQ(message({"calc", R"({"expression":"1]"})"}),
            "tool call 'calc': text with unbalanced brackets cannot be "
            "written as [name text]");
  EXPECT_EQ(message({"calc", "[]"}),
            "tool call 'calc': arguments_json is not a JSON object");
  EXPECT_EQ(WriteToolCall(ToolFormat::kHermes, {"calc", "{"}, Tools())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ToolsJsonTest, OpenAIFunctionFormat) {
  std::vector<ToolSpec> tools(1);
  tools[0].name = "calc";
  tools[0].description = "Adds";
  tools[0].parameters_json = R"({"type": "object", "properties": {}})";
  EXPECT_EQ(*ToolsJson(tools),
            R"([{"type":"function","function":{"name":"calc","description":)"
            R"("Adds","parameters":{"type":"object","properties":{}}}}])");
  EXPECT_EQ(*ToolsJson({}), "[]");
  tools[0].parameters_json = "[1]";
  EXPECT_EQ(ToolsJson(tools).status().message(),
            "tool 'calc': parameters_json is not a JSON object");
}

class ResolveToolFormatTest : public ::testing::Test {
 protected:
  // A renderer for a template whose text is `source` plus a minimal body.
  ChatRenderer Template(const std::string& source) {
    const std::filesystem::path dir =
        std::filesystem::path(::testing::TempDir()) /
        ("resolve_tool_format_" + std::to_string(count_++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "chat_template.jinja")
        << "{% for m in messages %}{{ m.content }}" << source << "{% endfor %}";
    absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir.string());
    EXPECT_TRUE(t.ok()) << t.status();
    return ChatRenderer::FromTemplate(*std::move(t));
  }
  int count_ = 0;
};

TEST_F(ResolveToolFormatTest, ExplicitSettings) {
  const ChatRenderer none;
  EXPECT_EQ(*ResolveToolFormat("hermes", none), ToolFormat::kHermes);
  EXPECT_EQ(*ResolveToolFormat("llama3", none), ToolFormat::kLlama3);
  EXPECT_EQ(*ResolveToolFormat("plain", none), ToolFormat::kPlain);
  EXPECT_EQ(ResolveToolFormat("json", none).status().message(),
            "env.tool_format: must be auto, hermes, llama3 or plain; got "
            "'json'");
}

TEST_F(ResolveToolFormatTest, AutoForPlainFormats) {
  EXPECT_EQ(*ResolveToolFormat("auto", ChatRenderer()), ToolFormat::kPlain);
  EXPECT_EQ(*ResolveToolFormat("auto", ChatRenderer::Plain(ChatFormat::kNone)),
            ToolFormat::kPlain);
  EXPECT_EQ(
      *ResolveToolFormat("auto", ChatRenderer::Plain(ChatFormat::kChatML)),
      ToolFormat::kHermes);
  EXPECT_EQ(
      *ResolveToolFormat("auto", ChatRenderer::Plain(ChatFormat::kLlama3)),
      ToolFormat::kLlama3);
}

TEST_F(ResolveToolFormatTest, AutoReadsTheTemplate) {
  EXPECT_EQ(*ResolveToolFormat("auto", Template("<|im_end|><tool_call>")),
            ToolFormat::kHermes);
  EXPECT_EQ(*ResolveToolFormat("auto", Template("<|eot_id|>")),
            ToolFormat::kLlama3);
  EXPECT_EQ(*ResolveToolFormat("auto", Template("<|python_tag|>")),
            ToolFormat::kLlama3);
  // The explicit setting wins over the template.
  EXPECT_EQ(*ResolveToolFormat("plain", Template("<tool_call>")),
            ToolFormat::kPlain);
  const ChatRenderer gemma = Template("<end_of_turn>");
  const absl::Status s = ResolveToolFormat("auto", gemma).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "env.tool_format: auto cannot tell how " +
                             gemma.Describe() +
                             " writes tool calls; set env.tool_format: "
                             "hermes | llama3 | plain");
  EXPECT_EQ(*gemma.template_source(),
            "{% for m in messages %}{{ m.content }}<end_of_turn>{% endfor %}");
  EXPECT_EQ(ChatRenderer::Plain(ChatFormat::kChatML).template_source(),
            nullptr);
}

// Checks what a parser returned for arbitrary input: offered names, object
// arguments, numbered errors; and that writing the calls back never crashes.
void CheckWellFormed(ToolFormat format, const std::string& text, int* num_calls,
                     int* num_errors) {
  const std::vector<ToolSpec> tools = Tools();
  const ParsedTurn t = ParseToolCalls(format, text, tools);
  for (const ToolCall& call : t.calls) {
    EXPECT_TRUE(call.name == "calc" || call.name == "lookup" ||
                call.name == "now")
        << call.name;
    const nlohmann::json args =
        nlohmann::json::parse(call.arguments_json, nullptr, false);
    EXPECT_TRUE(args.is_object()) << call.arguments_json;
    (void)WriteToolCall(format, call, tools);
  }
  for (const std::string& e : t.errors) {
    EXPECT_EQ(e.rfind("tool call ", 0), 0u) << e;
  }
  *num_calls += static_cast<int>(t.calls.size());
  *num_errors += static_cast<int>(t.errors.size());
}

constexpr ToolFormat kFormats[] = {ToolFormat::kHermes, ToolFormat::kLlama3,
                                   ToolFormat::kPlain};

// Random bytes, biased towards the markup, never crash a parser.
TEST(ToolCallsRobustnessTest, RandomBytes) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "<|python_tag|>",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           "\\",
                                           ";",
                                           ":",
                                           ",",
                                           " ",
                                           "calc",
                                           "\"name\"",
                                           "\"arguments\"",
                                           "\"parameters\"",
                                           "\"calc\"",
                                           "now",
                                           "\"expression\"",
                                           "null",
                                           "1",
                                           "\xff",
                                           "\xc3"};
  std::mt19937_64 rng(20240726);
  int num_calls = 0;
  int num_errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) {
        text.push_back(static_cast<char>(rng() % 256));
      } else {
        text += pieces[rng() % pieces.size()];
      }
    }
    for (const ToolFormat format : kFormats) {
      CheckWellFormed(format, text, &num_calls, &num_errors);
    }
  }
  // The inputs reach both outcomes (the checks above are not vacuous).
  EXPECT_GT(num_calls, 0);
  EXPECT_GT(num_errors, 1000);
}

// Valid calls with a few bytes deleted, replaced or inserted: the JSON and
// bracket paths see nearly-right input.
TEST(ToolCallsRobustnessTest, MutatedCalls) {
  const ToolCall call{"calc", R"({"expression":"(1+2)*3"})"};
  std::mt19937_64 rng(99);
  int num_calls = 0;
  int num_errors = 0;
  for (const ToolFormat format : kFormats) {
    const std::string valid = *WriteToolCall(format, call, Tools());
    for (int iter = 0; iter < 2000; ++iter) {
      std::string text = valid + "\n" + valid;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits && !text.empty(); ++e) {
        const size_t at = rng() % text.size();
        switch (rng() % 3) {
          case 0:
            text.erase(at, 1);
            break;
          case 1:
            text[at] = static_cast<char>(rng() % 256);
            break;
          default:
            text.insert(at, 1, "{}[]\":,\\ <>/"[rng() % 12]);
        }
      }
      CheckWellFormed(format, text, &num_calls, &num_errors);
    }
  }
  EXPECT_GT(num_calls, 1000);
  EXPECT_GT(num_errors, 1000);
}

}  // namespace
}  // namespace fusionrl
