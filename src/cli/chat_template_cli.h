// `fusionrl chat-template --model DIR [--name NAME] [--now RFC3339]
// [--inline-templates]`: a
// model's own chat template (chat_template.jinja or tokenizer_config.json's
// `chat_template`) as a filter, for scripts and for checking renders
// against other implementations. Needs no tokenizer.json and no weights.
//   stdin:  one JSON object a line: {"messages": [...], "tools": [...],
//           "add_generation_prompt": true, ...}; every key but `messages`
//           is optional and becomes a template variable.
//   stdout: one line per input line: the rendered text as a JSON string, or
//           {"error": "..."} when the template rejects the conversation
//           (raise_exception, a render error) or the line is not a JSON
//           object (the error names the line number).
// --inline-templates: each stdin line is {"template": TEXT, "variables":
// {...}} instead, rendered with exactly those variables (no model, no
// special tokens or conversation defaults); a template that does not parse
// gives an {"error"} line. For probing the interpreter against jinja2.
// --now pins strftime_now's clock (default: the current time), shown in the
// local time zone (TZ) as transformers does.
// A template that does not load or parse exits 2 with one message.
#ifndef FUSIONRL_CLI_CHAT_TEMPLATE_CLI_H_
#define FUSIONRL_CLI_CHAT_TEMPLATE_CLI_H_

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct ChatTemplateArgs {
  std::string model_dir;  // holds chat_template.jinja / tokenizer_config.json
  std::string name;       // a named template of tokenizer_config.json
  std::string now;        // RFC 3339; "" = the current time
  bool inline_templates = false;  // each line carries its own template
};

CLI::App* AddChatTemplateCommand(CLI::App& app, ChatTemplateArgs& args);

// Runs the command on `in` / `out`, errors to stderr; returns the exit code.
int RunChatTemplate(const ChatTemplateArgs& args, std::istream& in,
                    std::ostream& out);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_CHAT_TEMPLATE_CLI_H_
