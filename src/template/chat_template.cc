// Loading a model's chat template (chat_template.jinja, then
// tokenizer_config.json) and rendering conversations with it.
#include "template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token of tokenizer_config.json: a string, an AddedToken object
// {"content": ...}, or null / absent ("").
absl::StatusOr<std::string> SpecialToken(const ordered_json& config,
                                         const char* key,
                                         const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return content->get<std::string>();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": '", key,
                   "' must be a string or an object with a string 'content'"));
}

// transformers' special_tokens_map of tokenizer_config.json `config`
// (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES, non-empty ones).
absl::Status ReadSpecialTokens(const ordered_json& config,
                               const std::string& path, ChatTemplate* out) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token",
                          "pad_token", "cls_token", "mask_token"}) {
    absl::StatusOr<std::string> token = SpecialToken(config, key, path);
    if (!token.ok()) return token.status();
    if (std::string_view(key) == "bos_token") out->bos_token = *token;
    if (std::string_view(key) == "eos_token") out->eos_token = *token;
    if (!token->empty()) out->special_tokens.emplace_back(key, *token);
  }
  auto it = config.find("additional_special_tokens");
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": 'additional_special_tokens' must be a list of tokens"));
  }
  for (const ordered_json& entry : *it) {
    ordered_json holder = {{"token", entry}};
    absl::StatusOr<std::string> token = SpecialToken(
        holder, "token", absl::StrCat(path, " additional_special_tokens"));
    if (!token.ok()) return token.status();
    out->additional_special_tokens.push_back(*std::move(token));
  }
  return absl::OkStatus();
}

// The template text of tokenizer_config.json's `chat_template`: the string,
// or the entry of the named list called `name` ("default" if empty).
absl::StatusOr<std::string> ConfigTemplate(const ordered_json& value,
                                           absl::string_view name,
                                           const std::string& path,
                                           std::string* origin) {
  if (value.is_string()) {
    if (!name.empty() && name != "default") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " has a single chat_template, not one named '", name, "'"));
    }
    return value.get<std::string>();
  }
  if (!value.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": 'chat_template' must be a string or a list of "
                     "{\"name\", \"template\"} objects"));
  }
  const std::string wanted = name.empty() ? "default" : std::string(name);
  std::vector<std::string> names;
  for (const ordered_json& entry : value) {
    if (!entry.is_object() || !entry.contains("name") ||
        !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       ": each 'chat_template' entry needs a string 'name' and "
                       "'template'"));
    }
    names.push_back(entry["name"].get<std::string>());
    if (names.back() == wanted) {
      *origin += absl::StrCat(" (template '", wanted, "')");
      return entry["template"].get<std::string>();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, " has no chat template named '", wanted,
                   "'; it has: ", absl::StrJoin(names, ", ")));
}

}  // namespace

absl::StatusOr<ChatTemplate> LoadChatTemplate(std::string_view model_dir_view,
                                              std::string_view name_view) {
  // absl 20220623's string_view is not std::string_view.
  const absl::string_view model_dir(model_dir_view.data(),
                                    model_dir_view.size());
  const absl::string_view name(name_view.data(), name_view.size());
  const std::filesystem::path dir{std::string(model_dir)};
  const std::string jinja_path = (dir / "chat_template.jinja").string();
  const std::string config_path = (dir / "tokenizer_config.json").string();
  const bool has_jinja = std::filesystem::exists(jinja_path);
  const bool has_config = std::filesystem::exists(config_path);
  if (!has_jinja && !has_config) {
    return absl::NotFoundError(absl::StrCat(
        "no chat template in ", model_dir,
        ": neither chat_template.jinja nor tokenizer_config.json"));
  }

  ChatTemplate result;
  ordered_json config = ordered_json::object();
  if (has_config) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config = ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": not a JSON object"));
    }
    absl::Status tokens = ReadSpecialTokens(config, config_path, &result);
    if (!tokens.ok()) return tokens;
  }

  if (has_jinja) {
    if (!name.empty() && name != "default") {
      return absl::InvalidArgumentError(absl::StrCat(
          jinja_path, " is a single template, not one named '", name, "'"));
    }
    absl::StatusOr<std::string> text = ReadFile(jinja_path);
    if (!text.ok()) return text.status();
    result.source = *std::move(text);
    result.origin = jinja_path;
  } else {
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) {
      return absl::NotFoundError(
          absl::StrCat(config_path, " has no 'chat_template' (and there is no ",
                       jinja_path, ")"));
    }
    result.origin = config_path;
    absl::StatusOr<std::string> source =
        ConfigTemplate(*it, name, config_path, &result.origin);
    if (!source.ok()) return source.status();
    result.source = *std::move(source);
  }

  absl::StatusOr<jinja::Template> compiled =
      jinja::Template::Parse(result.source);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(result.origin, ": ", compiled.status().message()));
  }
  result.compiled = *std::move(compiled);
  return result;
}

absl::StatusOr<std::string> RenderConversation(
    const ChatTemplate& chat_template, const ordered_json& variables,
    absl::Time now) {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the conversation must be a JSON object, got ", variables.type_name()));
  }
  // apply_chat_template's render(messages=..., tools=None, documents=None,
  // add_generation_prompt=False, **special_tokens_map, **kwargs): the
  // conversation's own keys take precedence.
  ordered_json context = {{"tools", nullptr},
                          {"documents", nullptr},
                          {"add_generation_prompt", false}};
  for (const auto& [key, token] : chat_template.special_tokens) {
    context[key] = token;
  }
  if (!chat_template.additional_special_tokens.empty()) {
    context["additional_special_tokens"] =
        chat_template.additional_special_tokens;
  }
  for (const auto& [key, value] : variables.items()) context[key] = value;
  jinja::RenderOptions options;
  options.now = now;
  return chat_template.compiled.Render(context, options);
}

absl::StatusOr<std::string> RenderMessages(
    const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
    bool add_generation_prompt, const ordered_json& extra, absl::Time now) {
  if (!extra.is_null() && !extra.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("extra template variables must be a JSON object, got ",
                     extra.type_name()));
  }
  ordered_json variables = extra.is_null() ? ordered_json::object() : extra;
  ordered_json list = ordered_json::array();
  for (const ChatMessage& m : messages) {
    list.push_back({{"role", m.role}, {"content", m.content}});
  }
  variables["messages"] = std::move(list);
  variables["add_generation_prompt"] = add_generation_prompt;
  return RenderConversation(chat_template, variables, now);
}

}  // namespace fusionrl
