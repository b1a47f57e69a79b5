// Chat formats: turning a conversation (system / user / assistant messages)
// into the text a chat-tuned model was trained on.
//
// `task.chat_template` picks the job's ChatRenderer:
//   "" (auto, the default): a Hugging Face model's own chat template
//        (chat_template.jinja, else tokenizer_config.json's chat_template),
//        rendered by the Jinja interpreter (template/jinja.h) byte for byte as
//        transformers' apply_chat_template renders it; nothing is guessed.
//        Without a model directory (the built-in character tasks): none.
//   chatml | llama3: the plain format, written here, with none of any
//        template's extras (no default system turn, no date header): for a
//        randomly initialised model, or a template that is not wanted.
//          ChatML:  "<|im_start|>role\ncontent<|im_end|>\n"
//          Llama-3: "<|begin_of_text|>" then "<|start_header_id|>role
//                   <|end_header_id|>\n\n{content, trimmed}<|eot_id|>"
//   none: the message texts joined by a blank line, no markers.
//
// Templates that call strftime_now() render a fixed instant, 2024-07-26
// 12:00 UTC (Llama 3.1's own literal default date): a job's prompts must not
// change with the day it runs (transformers renders today's date).
//
// Thread safety: a ChatRenderer is immutable; all functions are pure.
#ifndef FUSIONRL_TEMPLATE_CHAT_FORMAT_H_
#define FUSIONRL_TEMPLATE_CHAT_FORMAT_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fusionrl/task.h"  // ChatMessage, Problem

namespace fusionrl {

struct ChatTemplate;  // template/chat_template.h

enum class ChatFormat { kNone, kChatML, kLlama3 };

// The config value naming `format`: "none", "chatml" or "llama3".
std::string_view ChatFormatName(ChatFormat format);

// `task.chat_template` values "none", "chatml", "llama3"; InvalidArgument
// (listing the choices) for anything else, including "" (auto).
absl::StatusOr<ChatFormat> ParseChatFormat(std::string_view name);

// Renders `messages` in a plain format (see above); with
// add_generation_prompt the assistant's header follows
// ("<|im_start|>assistant\n", "<|start_header_id|>assistant
// <|end_header_id|>\n\n"; none adds nothing).
std::string RenderChat(ChatFormat format,
                       const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt);

// strftime_now()'s clock for chat templates (see above).
absl::Time ChatTemplateClock();

class ChatRenderer {
 public:
  // The plain format `none`.
  ChatRenderer() = default;
  static ChatRenderer Plain(ChatFormat format);
  static ChatRenderer FromTemplate(ChatTemplate chat_template);

  // The job's renderer: `setting` is task.chat_template; `model_dir` the
  // tokenizer directory of a Hugging Face model ("" for the built-in
  // character tokenizer). Errors name task.chat_template or the file.
  static absl::StatusOr<ChatRenderer> ForJob(std::string_view setting,
                                             std::string_view model_dir);

  // The conversation's text; with add_generation_prompt, ready for the
  // assistant's answer. InvalidArgument when the template rejects the
  // conversation (raise_exception: its message) or fails.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;
  // The same with the template's `tools` variable set to `tools_json` (a
  // JSON array, tool_calls.h ToolsJson; "" = none). Plain formats do not
  // write tools.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt,
                                     const std::string& tools_json) const;
  // Whether this is the plain format `none` (no roles, no markers).
  bool is_none() const {
    return template_ == nullptr && format_ == ChatFormat::kNone;
  }

  // The text of the assistant's turn answering `messages` with `answer`, as
  // the model is trained to write it (SFT targets): the rendering of
  // messages + {assistant: answer} minus the rendering of `messages` with
  // the generation prompt, which must be its prefix (InvalidArgument
  // otherwise, naming the template). E.g. Qwen3's template gives
  // "<think>\n\n</think>\n\n{answer}<|im_end|>\n". Plain `none` has no turn
  // markers: the answer itself.
  absl::StatusOr<std::string> AssistantTurn(
      const std::vector<ChatMessage>& messages, std::string_view answer) const;

  // The text that follows an assistant turn when the environment answers
  // with `answer` (token-in/token-out: it is tokenized once and appended
  // after the turn's tokens). `conversation` ends with that assistant turn;
  // `stopped`: the turn's tokens end with the end-of-turn token.
  //   format none: each message as "(content)".
  //   otherwise: the template renders conversation + answer with the
  //   generation prompt; the text after the turn's end-of-turn token (the
  //   first one after the rendering of the conversation before the turn,
  //   which must be its prefix) is the answer's. E.g. Qwen3:
  //   "\n<|im_start|>user\n<tool_response>\n10063\n</tool_response>
  //   <|im_end|>\n<|im_start|>assistant\n".
  // InvalidArgument (naming the template) when the template re-renders the
  // history differently once the answer follows (Qwen3 drops earlier turns'
  // thinking after a new user message) or writes no known end-of-turn token.
  absl::StatusOr<std::string> ObservationText(
      const std::vector<ChatMessage>& conversation,
      const std::vector<ChatMessage>& answer, const std::string& tools_json,
      bool stopped) const;

  // The token text that ends an assistant turn, added to the job's stop
  // ids: "<|im_end|>" (ChatML), "<|eot_id|>" (Llama-3), for a template the
  // first of these (or Gemma's "<end_of_turn>", Phi's "<|end|>") that it
  // writes; "" when none (the tokenizer's eos ends the turn).
  const std::string& end_of_turn() const { return end_of_turn_; }

  // The rendered text holds any begin-of-text token itself (every format
  // but none): the prompt is encoded without adding bos.
  bool writes_bos() const {
    return template_ != nullptr || format_ != ChatFormat::kNone;
  }

  // "the chat template of <file>", or the plain format's name.
  std::string Describe() const;

  // The Jinja source of the model's template; null for a plain format
  // (then format() names it). Read by env.tool_format: auto.
  const std::string* template_source() const;
  ChatFormat format() const { return format_; }

 private:
  ChatFormat format_ = ChatFormat::kNone;
  std::shared_ptr<const ChatTemplate> template_;  // null for a plain format
  std::string end_of_turn_;
};

// The conversation of `problem`: problem.messages when non-empty, otherwise
// [system, user: problem.prompt]. The system message is the problem's own
// (problem.system, or a system message in problem.messages); when it has
// none, `system_prompt` (task.system_prompt) is put first unless it is "".
std::vector<ChatMessage> ProblemMessages(const Problem& problem,
                                         std::string_view system_prompt);

}  // namespace fusionrl

#endif  // FUSIONRL_TEMPLATE_CHAT_FORMAT_H_
