// A model's own chat template, loaded from its Hugging Face directory and
// rendered with the Jinja interpreter (jinja.h) exactly as transformers'
// apply_chat_template renders it.
//
// Precedence (transformers'): `chat_template.jinja` in the directory, then
// tokenizer_config.json's `chat_template`, either a string or a list of
// {"name", "template"} entries (the one named `name`, else "default").
//
// Thread safety: a loaded ChatTemplate is immutable; the functions are
// pure and may run concurrently on one template.
#ifndef FUSIONRL_TEMPLATE_CHAT_TEMPLATE_H_
#define FUSIONRL_TEMPLATE_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fusionrl/task.h"  // ChatMessage
#include "nlohmann/json_fwd.hpp"
#include "template/jinja.h"

namespace fusionrl {

struct ChatTemplate {
  std::string source;  // the Jinja text
  // Where it came from: "<dir>/chat_template.jinja" or
  // "<dir>/tokenizer_config.json" (+ " (template 'name')" for a named one).
  std::string origin;
  // From tokenizer_config.json ("" when absent or null).
  std::string bos_token;
  std::string eos_token;
  // transformers' tokenizer.special_tokens_map, what every render gets:
  // each of bos_token, eos_token, unk_token, sep_token, pad_token,
  // cls_token, mask_token that tokenizer_config.json sets to a non-empty
  // string (or AddedToken), in that order; a token that is absent, null or
  // "" is left undefined, as transformers leaves it.
  std::vector<std::pair<std::string, std::string>> special_tokens;
  // Its `additional_special_tokens` (passed only when non-empty).
  std::vector<std::string> additional_special_tokens;
  jinja::Template compiled;
};

// Loads and compiles the template of the model directory `model_dir`.
// NotFound when the directory has neither file or no `chat_template`;
// InvalidArgument (naming the file) for malformed JSON, a template that
// does not parse, or a `name` that is not among the named templates (the
// message lists them).
absl::StatusOr<ChatTemplate> LoadChatTemplate(std::string_view model_dir,
                                              std::string_view name = "");

// Renders `variables`, the whole template context: `messages`, and
// optionally `tools`, `documents` (both None when absent, as
// apply_chat_template passes them), `add_generation_prompt` (default false)
// and any other keyword (e.g. `enable_thinking`). The special tokens come
// from the template's config unless `variables` sets them; `now` is
// strftime_now's clock
// (shown in the local time zone, as transformers does). Errors as
// jinja::Template::Render; a raise_exception message is in the status.
absl::StatusOr<std::string> RenderConversation(
    const ChatTemplate& chat_template, const nlohmann::ordered_json& variables,
    absl::Time now);

// RenderConversation for plain-text messages: `extra` (a JSON object, or
// null) adds keywords such as `tools` or `enable_thinking`.
absl::StatusOr<std::string> RenderMessages(
    const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
    bool add_generation_prompt, const nlohmann::ordered_json& extra,
    absl::Time now);

}  // namespace fusionrl

#endif  // FUSIONRL_TEMPLATE_CHAT_TEMPLATE_H_
