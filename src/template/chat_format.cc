// Chat formats: the plain ones written here, a model's own template through
// the Jinja interpreter.
#include "template/chat_format.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "nlohmann/json.hpp"
#include "template/chat_template.h"

namespace fusionrl {
namespace {

// Abseil 20220623 (Debian) has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

std::string Trimmed(std::string_view s) {
  return std::string(absl::StripAsciiWhitespace(AsAbsl(s)));
}

void AppendLlamaTurn(std::string_view role, std::string_view content,
                     std::string* out) {
  absl::StrAppend(out, "<|start_header_id|>", AsAbsl(role),
                  "<|end_header_id|>\n\n", Trimmed(content), "<|eot_id|>");
}

}  // namespace

std::string_view ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<ChatFormat> ParseChatFormat(std::string_view name) {
  if (name == "none") return ChatFormat::kNone;
  if (name == "chatml") return ChatFormat::kChatML;
  if (name == "llama3") return ChatFormat::kLlama3;
  return absl::InvalidArgumentError(
      absl::StrCat("task.chat_template: must be chatml, llama3 or none; got '",
                   AsAbsl(name), "'"));
}

std::string RenderChat(ChatFormat format,
                       const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt) {
  std::string out;
  switch (format) {
    case ChatFormat::kChatML:
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content,
                        "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatFormat::kLlama3:
      out = "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        AppendLlamaTurn(m.role, m.content, &out);
      }
      if (add_generation_prompt) {
        out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      }
      return out;
    case ChatFormat::kNone:
      break;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) out += "\n\n";
    out += messages[i].content;
  }
  return out;
}

absl::Time ChatTemplateClock() {
  // Noon UTC: the same calendar day in every time zone within 12 hours.
  return absl::FromCivil(absl::CivilSecond(2024, 7, 26, 12, 0, 0),
                         absl::UTCTimeZone());
}

ChatRenderer ChatRenderer::Plain(ChatFormat format) {
  ChatRenderer r;
  r.format_ = format;
  if (format == ChatFormat::kChatML) r.end_of_turn_ = "<|im_end|>";
  if (format == ChatFormat::kLlama3) r.end_of_turn_ = "<|eot_id|>";
  return r;
}

ChatRenderer ChatRenderer::FromTemplate(ChatTemplate chat_template) {
  ChatRenderer r;
  for (const char* marker :
       {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"}) {
    if (Contains(chat_template.source, marker)) {
      r.end_of_turn_ = marker;
      break;
    }
  }
  r.template_ = std::make_shared<const ChatTemplate>(std::move(chat_template));
  return r;
}

absl::StatusOr<ChatRenderer> ChatRenderer::ForJob(std::string_view setting,
                                                  std::string_view model_dir) {
  if (!setting.empty()) {
    absl::StatusOr<ChatFormat> format = ParseChatFormat(setting);
    if (!format.ok()) return format.status();
    return Plain(*format);
  }
  if (model_dir.empty()) return ChatRenderer();
  absl::StatusOr<ChatTemplate> loaded = LoadChatTemplate(model_dir);
  if (!loaded.ok()) {
    return absl::Status(
        loaded.status().code(),
        absl::StrCat(loaded.status().message(),
                     "; set task.chat_template: chatml | llama3 | none to "
                     "render prompts without the model's template"));
  }
  return FromTemplate(*std::move(loaded));
}

absl::StatusOr<std::string> ChatRenderer::Render(
    const std::vector<ChatMessage>& messages,
    bool add_generation_prompt) const {
  if (template_ == nullptr) {
    return RenderChat(format_, messages, add_generation_prompt);
  }
  absl::StatusOr<std::string> text =
      RenderMessages(*template_, messages, add_generation_prompt,
                     nlohmann::ordered_json(), ChatTemplateClock());
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat(Describe(), ": ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::string> ChatRenderer::Render(
    const std::vector<ChatMessage>& messages, bool add_generation_prompt,
    const std::string& tools_json) const {
  if (template_ == nullptr || tools_json.empty()) {
    return Render(messages, add_generation_prompt);
  }
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  extra["tools"] = nlohmann::ordered_json::parse(tools_json, nullptr, false);
  if (extra["tools"].is_discarded()) {
    return absl::InvalidArgumentError("chat template: tools are not JSON");
  }
  absl::StatusOr<std::string> text = RenderMessages(
      *template_, messages, add_generation_prompt, extra, ChatTemplateClock());
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat(Describe(), ": ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::string> ChatRenderer::ObservationText(
    const std::vector<ChatMessage>& conversation,
    const std::vector<ChatMessage>& answer, const std::string& tools_json,
    bool stopped) const {
  std::string text;
  if (is_none()) {
    for (const ChatMessage& m : answer) {
      absl::StrAppend(&text, "(", m.content, ")");
    }
    return text;
  }
  const std::string& eot = end_of_turn_;
  if (eot.empty() || conversation.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(),
        ": no end-of-turn token is known for it, so the environment's "
        "answer cannot be placed after the model's turn"));
  }
  const std::vector<ChatMessage> before(conversation.begin(),
                                        conversation.end() - 1);
  absl::StatusOr<std::string> prompt = Render(before, true, tools_json);
  if (!prompt.ok()) return prompt.status();
  std::vector<ChatMessage> after = conversation;
  after.insert(after.end(), answer.begin(), answer.end());
  absl::StatusOr<std::string> full = Render(after, true, tools_json);
  if (!full.ok()) return full.status();
  const size_t turn_end = full->find(eot, prompt->size());
  if (full->compare(0, prompt->size(), *prompt) != 0 ||
      turn_end == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(),
        ": the conversation with the environment's answer does not start "
        "with the conversation the turn answered (the template renders the "
        "history differently once the answer follows), so the answer "
        "cannot be appended token-in/token-out"));
  }
  if (!stopped) text = eot;
  text += full->substr(turn_end + eot.size());
  return text;
}

absl::StatusOr<std::string> ChatRenderer::AssistantTurn(
    const std::vector<ChatMessage>& messages, std::string_view answer) const {
  if (template_ == nullptr && format_ == ChatFormat::kNone) {
    return std::string(answer);
  }
  absl::StatusOr<std::string> prompt = Render(messages, true);
  if (!prompt.ok()) return prompt.status();
  std::vector<ChatMessage> answered = messages;
  answered.push_back({"assistant", std::string(answer)});
  absl::StatusOr<std::string> full = Render(answered, false);
  if (!full.ok()) return full.status();
  if (full->compare(0, prompt->size(), *prompt) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(),
        ": the conversation with the assistant's answer does not start with "
        "the text of its generation prompt, so the answer's turn cannot be "
        "cut out of it (prompt ends '",
        AsAbsl(std::string_view(*prompt).substr(
            prompt->size() > 40 ? prompt->size() - 40 : 0)),
        "')"));
  }
  return full->substr(prompt->size());
}

std::string ChatRenderer::Describe() const {
  if (template_ != nullptr) {
    return absl::StrCat("the chat template of ", template_->origin);
  }
  return absl::StrCat("chat format ", AsAbsl(ChatFormatName(format_)));
}

const std::string* ChatRenderer::template_source() const {
  return template_ == nullptr ? nullptr : &template_->source;
}

std::vector<ChatMessage> ProblemMessages(const Problem& problem,
                                         std::string_view system_prompt) {
  std::vector<ChatMessage> messages;
  const bool own_system =
      !problem.system.empty() ||
      (!problem.messages.empty() && problem.messages[0].role == "system");
  if (!own_system && !system_prompt.empty()) {
    messages.push_back({"system", std::string(system_prompt)});
  }
  if (!problem.messages.empty()) {
    messages.insert(messages.end(), problem.messages.begin(),
                    problem.messages.end());
    return messages;
  }
  if (!problem.system.empty()) messages.push_back({"system", problem.system});
  messages.push_back({"user", problem.prompt});
  return messages;
}

}  // namespace fusionrl
