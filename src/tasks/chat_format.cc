// Chat format detection from Hugging Face templates, and prompt rendering.
#include "tasks/chat_format.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {

// Abseil 20220623 (Debian) has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

absl::Status NotRecognised(std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("the model's chat_template is not recognised (", AsAbsl(why),
                   "); set task.chat_template: chatml | llama3 | none"));
}

// Undoes the Jinja string-literal escapes a template may hold.
std::string JinjaUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      switch (c) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        default:  // \' \" \\ and anything else: the character itself
          out.push_back(c);
      }
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The first constant "<|im_start|>system\n<text><|im_end|>" in a ChatML
// template: <text> non-empty and free of quotes and braces (so it is not
// `' + messages[0].content + '`). "" if there is none.
std::string FindDefaultSystem(std::string_view t) {
  static constexpr std::string_view kOpen = "<|im_start|>system\\n";
  static constexpr std::string_view kClose = "<|im_end|>";
  for (size_t pos = t.find(kOpen); pos != std::string_view::npos;
       pos = t.find(kOpen, pos + 1)) {
    const size_t start = pos + kOpen.size();
    const size_t end = t.find(kClose, start);
    if (end == std::string_view::npos) break;
    const std::string_view text = t.substr(start, end - start);
    if (!text.empty() &&
        text.find_first_of("'\"{}") == std::string_view::npos) {
      return JinjaUnescape(text);
    }
  }
  return "";
}

// The text after the first `marker` up to the next `terminator` (exclusive),
// or "" if either is missing.
std::string LiteralAfter(std::string_view t, std::string_view marker,
                         std::string_view terminator) {
  const size_t pos = t.find(marker);
  if (pos == std::string_view::npos) return "";
  const size_t start = pos + marker.size();
  const size_t end = t.find(terminator, start);
  if (end == std::string_view::npos) return "";
  return std::string(t.substr(start, end - start));
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

absl::StatusOr<DetectedChatTemplate> DetectChatTemplate(std::string_view t) {
  if (t.empty()) return NotRecognised("it is empty or absent");
  const bool chatml = Contains(t, "<|im_start|>") && Contains(t, "<|im_end|>");
  const bool llama3 =
      Contains(t, "<|start_header_id|>") && Contains(t, "<|eot_id|>");
  if (chatml && llama3) {
    return NotRecognised("it has both ChatML and Llama-3 markers");
  }
  DetectedChatTemplate detected;
  if (chatml) {
    detected.format = ChatFormat::kChatML;
    detected.info.default_system = FindDefaultSystem(t);
    return detected;
  }
  if (llama3) {
    detected.format = ChatFormat::kLlama3;
    static constexpr std::string_view kKnowledge = "Cutting Knowledge Date: ";
    if (Contains(t, kKnowledge)) {
      ChatTemplateInfo& info = detected.info;
      info.llama_date_header = true;
      info.knowledge_date = LiteralAfter(t, kKnowledge, "\\n");
      info.today_date = LiteralAfter(t, "set date_string = \"", "\"");
      if (info.knowledge_date.empty() || info.today_date.empty()) {
        return NotRecognised(
            "a Llama-3 template with a \"Cutting Knowledge Date\" header but "
            "no literal knowledge date or default date_string");
      }
    }
    return detected;
  }
  return NotRecognised(
      "neither ChatML (<|im_start|>, <|im_end|>) nor Llama-3 "
      "(<|start_header_id|>, <|eot_id|>)");
}

absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view chat_template) {
  absl::StatusOr<DetectedChatTemplate> detected =
      DetectChatTemplate(chat_template);
  if (!detected.ok()) return detected.status();
  return detected->format;
}

std::string RenderChat(ChatFormat format, const ChatTemplateInfo& info,
                       const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt) {
  std::string out;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  switch (format) {
    case ChatFormat::kChatML:
      if (!has_system && !info.default_system.empty()) {
        absl::StrAppend(&out, "<|im_start|>system\n", info.default_system,
                        "<|im_end|>\n");
      }
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content,
                        "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatFormat::kLlama3: {
      out = "<|begin_of_text|>";
      size_t first = 0;
      if (info.llama_date_header) {
        absl::StrAppend(&out,
                        "<|start_header_id|>system<|end_header_id|>\n\n"
                        "Cutting Knowledge Date: ",
                        info.knowledge_date, "\nToday Date: ", info.today_date,
                        "\n\n");
        if (has_system) {
          out += Trimmed(messages[0].content);
          first = 1;
        }
        out += "<|eot_id|>";
      }
      for (size_t i = first; i < messages.size(); ++i) {
        AppendLlamaTurn(messages[i].role, messages[i].content, &out);
      }
      if (add_generation_prompt) {
        out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      }
      return out;
    }
    case ChatFormat::kNone:
      break;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i > 0) out += "\n\n";
    out += messages[i].content;
  }
  return out;
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
