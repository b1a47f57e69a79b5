// Chat formats: turning a conversation (system / user / assistant messages)
// into the prompt text a chat-tuned model was trained on, byte for byte as
// the model's Hugging Face chat template renders it for the cases we use
// (plain-text system, user and assistant turns; no tools, no images).
//
// Two template families are supported, recognised from the `chat_template`
// Jinja text of a tokenizer_config.json:
//   ChatML  (Qwen2, Qwen2.5, Qwen3): "<|im_start|>role\ncontent<|im_end|>\n"
//   Llama-3 (Llama 3, 3.1, 3.2, 3.3): "<|start_header_id|>role
//           <|end_header_id|>\n\ncontent<|eot_id|>" after "<|begin_of_text|>"
// Anything else is an error that asks for `task.chat_template`: we never
// guess a format silently, since a wrong one trains the model on text it
// never saw.
//
// Template details that change the rendered text are captured in
// ChatTemplateInfo when a template is detected (see there); an explicitly
// configured format (`task.chat_template: chatml | llama3`) renders the plain
// format with none of them.
//
// Thread safety: all functions are pure.
#ifndef FUSIONRL_TASKS_CHAT_FORMAT_H_
#define FUSIONRL_TASKS_CHAT_FORMAT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/task.h"  // ChatMessage, Problem

namespace fusionrl {

enum class ChatFormat { kNone, kChatML, kLlama3 };

// The config value naming `format`: "none", "chatml" or "llama3".
std::string_view ChatFormatName(ChatFormat format);

// `task.chat_template` values "none", "chatml", "llama3"; InvalidArgument
// (listing the choices) for anything else, including "" (auto, which the
// caller resolves with DetectChatTemplate).
absl::StatusOr<ChatFormat> ParseChatFormat(std::string_view name);

// Details of a detected template that change the rendered text. All empty /
// false for a plain format.
struct ChatTemplateInfo {
  // ChatML: the system message the template writes when the conversation has
  // none, e.g. Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a
  // helpful assistant." (Qwen2's is "You are a helpful assistant."; Qwen3 has
  // none). "" = no default system turn.
  std::string default_system;
  // Llama-3.1 and later: the template always writes a system turn that opens
  // with "Cutting Knowledge Date: {knowledge_date}\nToday Date:
  // {today_date}\n\n", followed by the (trimmed) system message if any.
  bool llama_date_header = false;
  std::string knowledge_date;  // "December 2023"
  // The template's literal default `date_string` ("26 Jul 2024"). Templates
  // that call strftime_now() when the renderer offers it (Llama 3.2, 3.3)
  // render today's date under transformers; we use the literal fallback so
  // that prompts are reproducible.
  std::string today_date;
};

struct DetectedChatTemplate {
  ChatFormat format = ChatFormat::kNone;
  ChatTemplateInfo info;
};

// Recognises a Hugging Face `chat_template` (the Jinja text, as decoded from
// tokenizer_config.json): ChatML if it contains both "<|im_start|>" and
// "<|im_end|>", Llama-3 if it contains both "<|start_header_id|>" and
// "<|eot_id|>" (never both families). Also fills the ChatTemplateInfo:
//   default_system: in a ChatML template, the literal text of the first
//     "<|im_start|>system\n...<|im_end|>" string that is a constant (no
//     quote or brace inside), Jinja escapes (\n, \', \", \\) undone.
//   llama_date_header: the template contains "Cutting Knowledge Date: "; the
//     knowledge date is the literal up to the next "\n", today_date the
//     literal of `set date_string = "..."`; InvalidArgument if the template
//     has no such literal default.
// InvalidArgument for anything else (including ""), saying that the template
// is not recognised and that `task.chat_template: chatml | llama3 | none`
// must be set.
absl::StatusOr<DetectedChatTemplate> DetectChatTemplate(
    std::string_view chat_template);

// DetectChatTemplate(chat_template)->format.
absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view chat_template);

// Renders `messages` as the template does with add_generation_prompt:
//   kChatML: [default system turn if info.default_system is set and
//     messages[0] is not a system message], then per message
//     "<|im_start|>{role}\n{content}<|im_end|>\n"; then, with
//     add_generation_prompt, "<|im_start|>assistant\n" (Qwen3's default
//     enable_thinking=true adds nothing more). Assistant turns are written
//     verbatim (Qwen3's stripping of <think> from history is not reproduced).
//   kLlama3: "<|begin_of_text|>"; with info.llama_date_header a system turn
//     "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date:
//     ...\nToday Date: ...\n\n{messages[0] content, trimmed, if it is a
//     system message}<|eot_id|>" always comes first; then per (remaining)
//     message "<|start_header_id|>{role}<|end_header_id|>\n\n{content with
//     leading/trailing whitespace stripped}<|eot_id|>"; then, with
//     add_generation_prompt, "<|start_header_id|>assistant<|end_header_id|>
//     \n\n".
//   kNone: the message contents in order (so the system message, if any,
//     first), joined by "\n\n", with no role markers; add_generation_prompt
//     adds nothing. A single user message renders as its bare text, so the
//     built-in character-level tasks see exactly their prompt.
std::string RenderChat(ChatFormat format, const ChatTemplateInfo& info,
                       const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt);

// The conversation of `problem`: problem.messages when non-empty, otherwise
// [system, user: problem.prompt]. The system message is the problem's own
// (problem.system, or a system message in problem.messages); when it has
// none, `system_prompt` (task.system_prompt) is put first unless it is "".
std::vector<ChatMessage> ProblemMessages(const Problem& problem,
                                         std::string_view system_prompt);

}  // namespace fusionrl

#endif  // FUSIONRL_TASKS_CHAT_FORMAT_H_
