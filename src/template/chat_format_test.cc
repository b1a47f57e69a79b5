#include "template/chat_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tasks/tool_calls.h"
#include "template/chat_template.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

const std::vector<ChatMessage> kSystemAndUser = {
    {"system", "You are a careful math tutor."},
    {"user", "What is 6 * 7?"},
};

TEST(ChatFormatTest, ParsesConfigNames) {
  EXPECT_EQ(*ParseChatFormat("none"), ChatFormat::kNone);
  EXPECT_EQ(*ParseChatFormat("chatml"), ChatFormat::kChatML);
  EXPECT_EQ(*ParseChatFormat("llama3"), ChatFormat::kLlama3);
  for (ChatFormat f :
       {ChatFormat::kNone, ChatFormat::kChatML, ChatFormat::kLlama3}) {
    EXPECT_EQ(*ParseChatFormat(ChatFormatName(f)), f);
  }
}

TEST(ChatFormatTest, RejectsUnknownNamesListingTheChoices) {
  for (const char* name : {"", "ChatML", "qwen", "llama-3"}) {
    absl::StatusOr<ChatFormat> f = ParseChatFormat(name);
    ASSERT_FALSE(f.ok()) << name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(f.status().message(),
                HasSubstr("task.chat_template: must be chatml, llama3 or "
                          "none"));
  }
}

TEST(ChatFormatTest, RendersChatML) {
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, kSystemAndUser, true),
            "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
            "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, {{"user", " hi\n"}}, false),
            "<|im_start|>user\n hi\n<|im_end|>\n");  // content verbatim
}

TEST(ChatFormatTest, RendersLlama3TrimmingContent) {
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3,
                       {{"system", "  Be brief.\n"}, {"user", "\nHi there \n"}},
                       true),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3, {{"user", "x"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
            "x<|eot_id|>");
}

TEST(ChatFormatTest, NoneJoinsContentsWithoutMarkers) {
  EXPECT_EQ(RenderChat(ChatFormat::kNone, {{"user", "12+34="}}, true),
            "12+34=");
  EXPECT_EQ(RenderChat(ChatFormat::kNone, kSystemAndUser, true),
            "You are a careful math tutor.\n\nWhat is 6 * 7?");
  EXPECT_EQ(RenderChat(ChatFormat::kNone, {}, true), "");
}

TEST(ChatFormatTest, ProblemMessagesAppliesSystemPrompt) {
  Problem plain;
  plain.prompt = "1+1?";
  EXPECT_EQ(ProblemMessages(plain, "").size(), 1u);
  std::vector<ChatMessage> m = ProblemMessages(plain, "Be brief.");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[0].content, "Be brief.");
  EXPECT_EQ(m[1].role, "user");
  EXPECT_EQ(m[1].content, "1+1?");

  Problem own = plain;
  own.system = "Own system.";
  m = ProblemMessages(own, "Be brief.");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].content, "Own system.");

  Problem chat;
  chat.prompt = "q2";
  chat.messages = {{"user", "q1"}, {"assistant", "a1"}, {"user", "q2"}};
  m = ProblemMessages(chat, "Be brief.");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].role, "system");
  chat.system = "S";
  chat.messages.insert(chat.messages.begin(), {"system", "S"});
  m = ProblemMessages(chat, "Be brief.");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].content, "S");
}

// A model directory holding `files` (name -> content), fresh per test.
std::string ModelDir(
    const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& files) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("chat_format_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& [file, content] : files) {
    std::ofstream(dir / file) << content;
  }
  return dir.string();
}

// Qwen2.5-Math's shape: a default system prompt with braces in it, which
// the former marker-based detection dropped. The model's own template
// renders it.
constexpr char kMathDefaultSystem[] =
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\nPlease reason step by step, and put your final "
    "answer within \\\\boxed{}.<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + "
    "'<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- endif %}";

// Qwen3's shape: the last assistant turn opens with an empty thinking
// block.
constexpr char kThinkingTemplate[] =
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\n' }}"
    "{%- if m.role == 'assistant' and loop.last %}"
    "{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- endif %}";

TEST(ChatRendererTest, RendersTheModelsOwnTemplateDefaultSystemIncluded) {
  const std::string dir = ModelDir(
      "math", {{"tokenizer_config.json",
                nlohmann::json{{"chat_template", kMathDefaultSystem}}.dump()}});
  absl::StatusOr<ChatRenderer> r = ChatRenderer::ForJob("", dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->end_of_turn(), "<|im_end|>");
  EXPECT_TRUE(r->writes_bos());
  EXPECT_EQ(*r->Render({{"user", "1+1?"}}, true),
            "<|im_start|>system\nPlease reason step by step, and put your "
            "final answer within \\boxed{}.<|im_end|>\n"
            "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*r->Render(kSystemAndUser, false),
            "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
            "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n");
}

// chat_template.jinja takes precedence over tokenizer_config.json, as in
// transformers; strftime_now renders the fixed clock.
TEST(ChatRendererTest, JinjaFileWinsAndTheClockIsFixed) {
  const std::string dir = ModelDir(
      "precedence",
      {{"tokenizer_config.json",
        nlohmann::json{{"chat_template", "config"}}.dump()},
       {"chat_template.jinja", "file {{ strftime_now('%d %b %Y') }}"}});
  absl::StatusOr<ChatRenderer> r = ChatRenderer::ForJob("", dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->Render({{"user", "x"}}, true), "file 26 Jul 2024");
  EXPECT_THAT(r->Describe(), HasSubstr("chat_template.jinja"));
}

// The SFT target is the assistant's turn as the template writes it: the
// answered conversation minus the generation prompt's text.
TEST(ChatRendererTest, AssistantTurnIsWhatTheTemplateWritesAfterThePrompt) {
  const std::string dir =
      ModelDir("thinking", {{"chat_template.jinja", kThinkingTemplate}});
  absl::StatusOr<ChatRenderer> r = ChatRenderer::ForJob("", dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->AssistantTurn({{"user", "q"}}, "a"),
            "<think>\n\n</think>\n\na<|im_end|>\n");
  EXPECT_EQ(*ChatRenderer::Plain(ChatFormat::kChatML)
                 .AssistantTurn({{"user", "q"}}, "a"),
            "a<|im_end|>\n");
  EXPECT_EQ(*ChatRenderer::Plain(ChatFormat::kLlama3)
                 .AssistantTurn({{"user", "q"}}, " a "),
            "a<|eot_id|>");
  EXPECT_EQ(*ChatRenderer().AssistantTurn({{"user", "q"}}, "a"), "a");
  // A template whose answered conversation does not extend its prompt.
  const std::string odd = ModelDir(
      "odd", {{"chat_template.jinja",
               "{% if add_generation_prompt %}P{% else %}Q{% endif %}"}});
  absl::StatusOr<std::string> turn =
      ChatRenderer::ForJob("", odd)->AssistantTurn({{"user", "q"}}, "a");
  ASSERT_FALSE(turn.ok());
  EXPECT_THAT(turn.status().message(),
              HasSubstr("does not start with the text of its generation "
                        "prompt"));
}

TEST(ChatRendererTest, TemplateErrorsNameTheTemplateAndItsMessage) {
  const std::string dir = ModelDir(
      "raises",
      {{"chat_template.jinja",
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Conversation must start with a user turn') }}"
        "{% endif %}ok"}});
  absl::StatusOr<ChatRenderer> r = ChatRenderer::ForJob("", dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->Render({{"user", "x"}}, true), "ok");
  absl::StatusOr<std::string> bad = r->Render({{"assistant", "x"}}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("Conversation must start with a user turn"));
  EXPECT_THAT(bad.status().message(), HasSubstr("chat_template.jinja"));
}

TEST(ChatRendererTest, ForJobPicksThePlainFormatOrRefusesAMissingTemplate) {
  EXPECT_EQ(ChatRenderer::ForJob("chatml", "")->end_of_turn(), "<|im_end|>");
  EXPECT_EQ(ChatRenderer::ForJob("llama3", "/nonexistent")->end_of_turn(),
            "<|eot_id|>");
  absl::StatusOr<ChatRenderer> none = ChatRenderer::ForJob("", "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->writes_bos());
  EXPECT_EQ(*none->Render({{"user", "12+34="}}, true), "12+34=");
  const std::string empty =
      ModelDir("no_template",
               {{"tokenizer_config.json", R"({"eos_token": "<|im_end|>"})"}});
  absl::StatusOr<ChatRenderer> missing = ChatRenderer::ForJob("", empty);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("set task.chat_template: chatml | llama3 | none"));
  EXPECT_FALSE(ChatRenderer::ForJob("qwen", "").ok());
}

}  // namespace
}  // namespace fusionrl

namespace fusionrl {
namespace {

TEST(ObservationTextTest, FormatNoneWritesEachMessageInParentheses) {
  const ChatRenderer none;
  auto text = none.ObservationText(
      {{"user", "347*29="}, {"assistant", "[calc 347*29]"}},
      {{"tool", "10063"}, {"tool", "error: tool call 2: unclosed ["}}, "",
      true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "(10063)(error: tool call 2: unclosed [)");
}

TEST(ObservationTextTest, ChatMLFollowsTheTurnsEndOfTurnToken) {
  const ChatRenderer chatml = ChatRenderer::Plain(ChatFormat::kChatML);
  const std::vector<ChatMessage> conversation = {
      {"user", "1+1="}, {"assistant", "<tool_call>{}</tool_call>"}};
  auto text = chatml.ObservationText(conversation, {{"tool", "2"}}, "", true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n");
  // A turn cut by its token budget did not write the end-of-turn token.
  text = chatml.ObservationText(conversation, {{"tool", "2"}}, "", false);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(
      *text,
      "<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n");
}

std::string TestDataDir() {
  if (const char* env = std::getenv("FUSIONRL_TEST_DATA");
      env != nullptr && *env != '\0') {
    return env;
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/fusionrl/test-data";
}

// Qwen3's own template re-renders the turn being answered differently once
// it is no longer the last message (no empty think block): the answer's
// text is still exactly what follows the turn's <|im_end|>, with the tools
// in the system prompt and across two rounds.
TEST(RealTemplatesObservationTest, Qwen3ToolResponses) {
  const std::string dir = TestDataDir() + "/qwen3-tokenizer";
  absl::StatusOr<ChatTemplate> tmpl = LoadChatTemplate(dir);
  if (!tmpl.ok()) GTEST_SKIP() << "qwen3 tokenizer not found at " << dir;
  const ChatRenderer qwen3 = ChatRenderer::FromTemplate(*std::move(tmpl));
  ASSERT_EQ(qwen3.end_of_turn(), "<|im_end|>");
  std::vector<ToolSpec> tools(1);
  tools[0].name = "calc";
  tools[0].parameters_json =
      R"({"type": "object", "properties": {"expression": {"type": "string"}}})";
  const std::string tools_json = ToolsJson(tools).value();
  std::vector<ChatMessage> conversation = {
      {"user", "What is 347*29?"},
      {"assistant",
       "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
       "\"347*29\"}}\n</tool_call>"}};
  auto text = qwen3.ObservationText(conversation, {{"tool", "10063"}},
                                    tools_json, true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "\n<|im_start|>user\n<tool_response>\n10063\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n");
  conversation.push_back({"tool", "10063"});
  conversation.push_back({"assistant",
                          "<tool_call>\n{\"name\": \"calc\", \"arguments\": "
                          "{\"expression\": \"10063+1\"}}\n</tool_call>"});
  text = qwen3.ObservationText(conversation, {{"tool", "10064"}, {"tool", "x"}},
                               tools_json, true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "\n<|im_start|>user\n<tool_response>\n10064\n</tool_response>\n"
            "<tool_response>\nx\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

}  // namespace
}  // namespace fusionrl
