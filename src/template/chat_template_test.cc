// Tests of loading a model's chat template and rendering conversations
// (chat_template.h), on model directories written by the tests.
#include "template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  void WriteConfig(const ordered_json& config) {
    Write("tokenizer_config.json", config.dump());
  }
  std::string dir() const { return dir_.string(); }

  std::filesystem::path dir_;
};

constexpr char kChatML[] =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
    "assistant\n{% endif %}";

TEST_F(ChatTemplateTest, ReadsTokenizerConfigWithAddedTokens) {
  WriteConfig({{"chat_template", "{{ bos_token }}|{{ eos_token }}"},
               {"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
               {"eos_token", "</s>"}});
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->origin, dir() + "/tokenizer_config.json");
  EXPECT_EQ(t->bos_token, "<s>");
  EXPECT_EQ(t->eos_token, "</s>");
  EXPECT_EQ(*RenderConversation(*t, {{"messages", ordered_json::array()}},
                                absl::UnixEpoch()),
            "<s>|</s>");
  // The conversation's own keys win.
  EXPECT_EQ(*RenderConversation(
                *t, {{"messages", ordered_json::array()}, {"bos_token", "B"}},
                absl::UnixEpoch()),
            "B|</s>");
}

TEST_F(ChatTemplateTest, NullTokensAreEmpty) {
  WriteConfig({{"chat_template", "[{{ bos_token }}]"}, {"bos_token", nullptr}});
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*RenderConversation(*t, ordered_json::object(), absl::UnixEpoch()),
            "[]");
}

TEST_F(ChatTemplateTest, ChatTemplateJinjaTakesPrecedence) {
  WriteConfig({{"chat_template", "from config"}, {"eos_token", "E"}});
  Write("chat_template.jinja", "from file {{ eos_token }}\n");
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->origin, dir() + "/chat_template.jinja");
  EXPECT_EQ(*RenderConversation(*t, ordered_json::object(), absl::UnixEpoch()),
            "from file E");
}

TEST_F(ChatTemplateTest, NamedTemplates) {
  WriteConfig({{"chat_template",
                {{{"name", "default"}, {"template", "D"}},
                 {{"name", "tool_use"}, {"template", "T"}}}}});
  absl::StatusOr<ChatTemplate> d = LoadChatTemplate(dir());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->source, "D");
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir(), "tool_use");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "T");
  EXPECT_THAT(t->origin, HasSubstr("(template 'tool_use')"));
  absl::StatusOr<ChatTemplate> missing = LoadChatTemplate(dir(), "rag");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("no chat template named 'rag'; it has: default, "
                        "tool_use"));
}

TEST_F(ChatTemplateTest, ErrorsNameTheFile) {
  absl::StatusOr<ChatTemplate> none = LoadChatTemplate(dir());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("chat_template.jinja"));

  WriteConfig({{"eos_token", "E"}});
  absl::StatusOr<ChatTemplate> no_template = LoadChatTemplate(dir());
  EXPECT_EQ(no_template.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_template.status().message(),
              HasSubstr("has no 'chat_template'"));

  Write("tokenizer_config.json", "{not json");
  EXPECT_THAT(LoadChatTemplate(dir()).status().message(),
              HasSubstr("tokenizer_config.json: not a JSON object"));

  WriteConfig({{"chat_template", "{{ x | wordwrap }}"}});
  absl::StatusOr<ChatTemplate> bad = LoadChatTemplate(dir());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("tokenizer_config.json: chat template line 1: "
                        "unsupported filter 'wordwrap'"));
}

TEST_F(ChatTemplateTest, RenderMessagesAddsTheGenerationPrompt) {
  WriteConfig({{"chat_template", kChatML}});
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir());
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<ChatMessage> messages = {{"system", "Be brief."},
                                             {"user", "Hi"}};
  EXPECT_EQ(*RenderMessages(*t, messages, true, nullptr, absl::UnixEpoch()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
            "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*RenderMessages(*t, messages, false, ordered_json::object(),
                            absl::UnixEpoch()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
            "<|im_end|>\n");
  EXPECT_EQ(RenderMessages(*t, messages, false, ordered_json::array(),
                           absl::UnixEpoch())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ChatTemplateTest, RaiseExceptionRejectsTheConversation) {
  WriteConfig({{"chat_template",
                "{% if messages[0].role != 'user' %}"
                "{{ raise_exception('Conversation must start with user') }}"
                "{% endif %}ok"}});
  absl::StatusOr<ChatTemplate> t = LoadChatTemplate(dir());
  ASSERT_TRUE(t.ok()) << t.status();
  const ordered_json bad = {{"messages", {{{"role", "system"}}}}};
  absl::StatusOr<std::string> out =
      RenderConversation(*t, bad, absl::UnixEpoch());
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(),
              HasSubstr("Conversation must start with user"));
}

}  // namespace
}  // namespace fusionrl
