// `fusionrl chat-template`: renders conversations read from stdin with a
// model's chat template (see chat_template_cli.h).
#include "cli/chat_template_cli.h"

#include <istream>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "nlohmann/json.hpp"
#include "template/chat_template.h"
#include "template/jinja.h"

namespace fusionrl::cli {
namespace {

using nlohmann::ordered_json;

std::string ErrorLine(const std::string& message) {
  return ordered_json{{"error", message}}.dump(
      -1, ' ', false, ordered_json::error_handler_t::replace);
}

// The output line for one input line.
std::string RenderLine(const ChatTemplate& chat_template,
                       const std::string& line, int line_number,
                       absl::Time now) {
  ordered_json variables =
      ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (variables.is_discarded() || !variables.is_object()) {
    return ErrorLine(absl::StrCat("stdin line ", line_number,
                                  ": expected a JSON object per line"));
  }
  if (!variables.contains("messages")) {
    return ErrorLine(
        absl::StrCat("stdin line ", line_number, ": no \"messages\""));
  }
  absl::StatusOr<std::string> text =
      RenderConversation(chat_template, variables, now);
  if (!text.ok()) return ErrorLine(std::string(text.status().message()));
  return ordered_json(*text).dump(-1, ' ', false,
                                  ordered_json::error_handler_t::replace);
}

// The output line for one --inline-templates line: {"template": TEXT,
// "variables": {...}} rendered with exactly those variables.
std::string RenderInlineLine(const std::string& line, int line_number,
                             absl::Time now) {
  ordered_json input =
      ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded() || !input.is_object() ||
      !input.contains("template") || !input["template"].is_string()) {
    return ErrorLine(
        absl::StrCat("stdin line ", line_number,
                     ": expected a JSON object with a string \"template\""));
  }
  const ordered_json variables =
      input.contains("variables") ? input["variables"] : ordered_json::object();
  absl::StatusOr<jinja::Template> compiled =
      jinja::Template::Parse(input["template"].get<std::string>());
  if (!compiled.ok())
    return ErrorLine(std::string(compiled.status().message()));
  jinja::RenderOptions options;
  options.now = now;
  absl::StatusOr<std::string> text = compiled->Render(variables, options);
  if (!text.ok()) return ErrorLine(std::string(text.status().message()));
  return ordered_json(*text).dump(-1, ' ', false,
                                  ordered_json::error_handler_t::replace);
}

}  // namespace

CLI::App* AddChatTemplateCommand(CLI::App& app, ChatTemplateArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "chat-template",
      "render conversations (one JSON object a line on stdin) with a "
      "model's chat template; one JSON string (or {\"error\"}) a line out");
  cmd->add_option("--model", args.model_dir,
                  "model directory with chat_template.jinja or "
                  "tokenizer_config.json (required unless "
                  "--inline-templates)");
  cmd->add_option("--name", args.name,
                  "a named template of tokenizer_config.json (default: "
                  "'default')");
  cmd->add_option("--now", args.now,
                  "strftime_now's clock, RFC 3339 (e.g. "
                  "2024-07-26T12:00:00Z; default: now)");
  cmd->add_flag("--inline-templates", args.inline_templates,
                "each stdin line is {\"template\": TEXT, \"variables\": "
                "{...}}: TEXT rendered with exactly those variables (no "
                "model, no conversation defaults); for checking the "
                "interpreter against jinja2");
  return cmd;
}

int RunChatTemplate(const ChatTemplateArgs& args, std::istream& in,
                    std::ostream& out) {
  absl::Time now = RealClock().Now();
  std::string error;
  if (!args.now.empty() &&
      !absl::ParseTime(absl::RFC3339_full, args.now, &now, &error)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--now '", args.now, "': not an RFC 3339 time (", error, ")")));
  }
  if (args.inline_templates) {
    if (!args.model_dir.empty() || !args.name.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--inline-templates takes no --model or --name (each line carries "
          "its template)"));
    }
    std::string line;
    for (int line_number = 1; std::getline(in, line); ++line_number) {
      out << RenderInlineLine(line, line_number, now) << '\n';
    }
    out << std::flush;
    return kExitOk;
  }
  if (args.model_dir.empty()) {
    return Fail(absl::InvalidArgumentError(
        "chat-template needs --model DIR (or --inline-templates)"));
  }
  absl::StatusOr<ChatTemplate> chat_template =
      LoadChatTemplate(args.model_dir, args.name);
  if (!chat_template.ok()) return Fail(chat_template.status());
  std::string line;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    out << RenderLine(*chat_template, line, line_number, now) << '\n';
  }
  out << std::flush;
  return kExitOk;
}

}  // namespace fusionrl::cli
