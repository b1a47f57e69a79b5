#include "tasks/tool_calls.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "template/chat_format.h"

namespace fusionrl {
namespace {

using nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// Tool arguments are flat in practice; the limit keeps the recursive code
// (nlohmann's dump, AppendJson) off deep stacks whatever the policy writes.
constexpr int kMaxJsonDepth = 32;
// Tool names quoted back to the model are cut to this many bytes.
constexpr size_t kMaxQuotedName = 64;

// Abseil 20220623 (Debian) has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

std::string_view Trim(std::string_view s) {
  const absl::string_view t = absl::StripAsciiWhitespace(AsAbsl(s));
  return {t.data(), t.size()};
}

std::string_view TrimLeft(std::string_view s) {
  const absl::string_view t = absl::StripLeadingAsciiWhitespace(AsAbsl(s));
  return {t.data(), t.size()};
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Dumps without throwing: invalid UTF-8 (possible in strings built from
// decoded bytes) becomes U+FFFD instead of a type_error.
std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// A name as quoted in an error message: printable ASCII, cut short.
std::string QuoteName(std::string_view name) {
  std::string shown(name.substr(0, kMaxQuotedName));
  std::string quoted = absl::CHexEscape(shown);
  if (name.size() > kMaxQuotedName) quoted += "...";
  return quoted;
}

// True when `text` nests [ and { (outside strings) at most `limit` deep.
bool JsonDepthWithin(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// `text` as a JSON value, or discarded (invalid, or nested too deep).
ordered_json ParseJson(std::string_view text) {
  if (!JsonDepthWithin(text, kMaxJsonDepth)) {
    return ordered_json(ordered_json::value_t::discarded);
  }
  return ordered_json::parse(text.begin(), text.end(), nullptr, false);
}

// JSON with Python's json.dumps separators (", " and ": "), as the chat
// templates' tojson writes tool calls: demonstrations look like the calls
// the model saw. Depth is bounded by ParseJson.
void AppendJson(const ordered_json& j, std::string* out) {
  if (j.is_object()) {
    out->push_back('{');
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out->append(", ");
      first = false;
      out->append(Dump(ordered_json(it.key())));
      out->append(": ");
      AppendJson(it.value(), out);
    }
    out->push_back('}');
  } else if (j.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < j.size(); ++i) {
      if (i > 0) out->append(", ");
      AppendJson(j[i], out);
    }
    out->push_back(']');
  } else {
    out->append(Dump(j));
  }
}

const ToolSpec* FindTool(const std::vector<ToolSpec>& tools,
                         std::string_view name) {
  for (const ToolSpec& tool : tools) {
    if (tool.name == name) return &tool;
  }
  return nullptr;
}

// The argument `[name text]` fills: the first required property, else the
// first property, else "input"; `has_properties` is false for a tool that
// takes no arguments (then `[name]` is a complete call).
struct PlainArgument {
  std::string name = "input";
  bool has_properties = false;
};

PlainArgument PlainArgumentOf(const ToolSpec* tool) {
  PlainArgument arg;
  if (tool == nullptr) return arg;
  const ordered_json schema = ParseJson(tool->parameters_json);
  if (!schema.is_object()) return arg;
  const auto required = schema.find("required");
  const auto properties = schema.find("properties");
  if (properties != schema.end() && properties->is_object() &&
      !properties->empty()) {
    arg.has_properties = true;
    arg.name = properties->begin().key();
  }
  if (required != schema.end() && required->is_array()) {
    for (const ordered_json& r : *required) {
      if (r.is_string()) {
        arg.has_properties = true;
        arg.name = r.get<std::string>();
        break;
      }
    }
  }
  return arg;
}

// Numbers calls as the model wrote them (parsed or not) and collects the
// results into a ParsedTurn.
class CallCollector {
 public:
  CallCollector(const std::vector<ToolSpec>& tools, ParsedTurn* out)
      : tools_(tools), out_(out) {}

  // Starts the next call; returns its 1-based number.
  int Next() { return ++count_; }

  void Fail(int n, std::string_view why) {
    out_->errors.push_back(absl::StrCat("tool call ", n, ": ", AsAbsl(why)));
  }

  // The offered tool `name`, or null after recording the error.
  const ToolSpec* Offered(int n, std::string_view name) {
    const ToolSpec* tool = FindTool(tools_, name);
    if (tool != nullptr) return tool;
    std::vector<std::string> offered;
    for (const ToolSpec& t : tools_) offered.push_back(t.name);
    Fail(n, absl::StrCat(
                "unknown tool '", QuoteName(name), "' (offered: ",
                offered.empty() ? "none" : absl::StrJoin(offered, ", "), ")"));
    return nullptr;
  }

  void Add(std::string name, const ordered_json& arguments) {
    out_->calls.push_back({std::move(name), Dump(arguments)});
  }

  // A call written as a JSON object {"name": ..., "arguments" or
  // "parameters": {...}} (hermes, llama3). Arguments may also be a JSON
  // string holding an object (Qwen writes that at times), or absent/null
  // for {}.
  void AddJsonCall(std::string_view text) {
    const int n = Next();
    const ordered_json call = ParseJson(Trim(text));
    if (call.is_discarded()) return Fail(n, "not valid JSON");
    if (!call.is_object()) return Fail(n, "not a JSON object");
    const auto name = call.find("name");
    if (name == call.end()) return Fail(n, "no \"name\"");
    if (!name->is_string() || name->get_ref<const std::string&>().empty()) {
      return Fail(n, "\"name\" is not a non-empty string");
    }
    const std::string& tool = name->get_ref<const std::string&>();
    if (Offered(n, tool) == nullptr) return;
    const char* key = "arguments";
    auto args = call.find(key);
    if (args == call.end()) {
      key = "parameters";
      args = call.find(key);
    }
    if (args == call.end() || args->is_null()) {
      return Add(tool, ordered_json::object());
    }
    if (args->is_object()) return Add(tool, *args);
    if (args->is_string()) {
      const ordered_json inner = ParseJson(args->get_ref<const std::string&>());
      if (inner.is_object()) return Add(tool, inner);
    }
    Fail(n, absl::StrCat("\"", key, "\" is not an object"));
  }

  // The inside of "[name text]".
  void AddPlainCall(std::string_view inside) {
    const int n = Next();
    const size_t space = inside.find(' ');
    const std::string_view name = inside.substr(0, space);
    if (name.empty()) return Fail(n, "no tool name (write [name text])");
    const ToolSpec* tool = Offered(n, name);
    if (tool == nullptr) return;
    const PlainArgument arg = PlainArgumentOf(tool);
    if (space == std::string_view::npos) {
      if (arg.has_properties) {
        return Fail(
            n, absl::StrCat("[", AsAbsl(name), "] has no ", arg.name,
                            " (write [", AsAbsl(name), " ", arg.name, "])"));
      }
      return Add(std::string(name), ordered_json::object());
    }
    ordered_json args = ordered_json::object();
    args[arg.name] = std::string(inside.substr(space + 1));
    Add(std::string(name), args);
  }

 private:
  const std::vector<ToolSpec>& tools_;
  ParsedTurn* const out_;
  int count_ = 0;
};

void ParseHermes(std::string_view text, CallCollector& calls,
                 std::string* content) {
  size_t pos = 0;
  while (true) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string_view::npos) break;
    content->append(text.substr(pos, open - pos));
    const size_t body = open + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body);
    if (close == std::string_view::npos) {
      // Usually a turn cut by its token budget: the rest is the call's.
      calls.Fail(calls.Next(), "unclosed <tool_call> (no </tool_call>)");
      return;
    }
    calls.AddJsonCall(text.substr(body, close - body));
    pos = close + kHermesClose.size();
  }
  content->append(text.substr(pos));
}

// The end (one past the closing brace) of the JSON object starting at
// text[start] == '{', by bracket matching outside strings; npos when it
// does not close.
size_t JsonObjectEnd(std::string_view text, size_t start) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

void ParseLlama3(std::string_view text, CallCollector& calls,
                 std::string* content) {
  std::string_view rest = TrimLeft(text);
  if (StartsWith(rest, kPythonTag)) {
    rest = TrimLeft(rest.substr(kPythonTag.size()));
  }
  size_t pos = 0;
  while (pos < rest.size() && rest[pos] == '{') {
    const size_t end = JsonObjectEnd(rest, pos);
    if (end == std::string_view::npos) {
      calls.Fail(calls.Next(), "not valid JSON (the object never closes)");
      return;
    }
    calls.AddJsonCall(rest.substr(pos, end - pos));
    pos = rest.size() - TrimLeft(rest.substr(end)).size();
    if (pos < rest.size() && rest[pos] == ';') {
      pos = rest.size() - TrimLeft(rest.substr(pos + 1)).size();
    }
  }
  // A turn that is not a call, or text after the calls, is content.
  content->append(rest.substr(pos));
}

void ParsePlain(std::string_view text, CallCollector& calls,
                std::string* content) {
  size_t pos = 0;
  while (true) {
    const size_t open = text.find('[', pos);
    if (open == std::string_view::npos) break;
    content->append(text.substr(pos, open - pos));
    // The matching ']': brackets inside the text nest.
    size_t close = std::string_view::npos;
    int depth = 0;
    for (size_t i = open; i < text.size(); ++i) {
      if (text[i] == '[') {
        ++depth;
      } else if (text[i] == ']' && --depth == 0) {
        close = i;
        break;
      }
    }
    if (close == std::string_view::npos) {
      calls.Fail(calls.Next(), "unclosed '[' (write [name text])");
      return;
    }
    calls.AddPlainCall(text.substr(open + 1, close - open - 1));
    pos = close + 1;
  }
  content->append(text.substr(pos));
}

}  // namespace

std::string_view ToolFormatName(ToolFormat format) {
  switch (format) {
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kPlain:
      break;
  }
  return "plain";
}

absl::StatusOr<ToolFormat> ResolveToolFormat(std::string_view setting,
                                             const ChatRenderer& chat) {
  if (setting == "hermes") return ToolFormat::kHermes;
  if (setting == "llama3") return ToolFormat::kLlama3;
  if (setting == "plain") return ToolFormat::kPlain;
  if (setting != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "env.tool_format: must be auto, hermes, llama3 or plain; got '",
        AsAbsl(setting), "'"));
  }
  const std::string* source = chat.template_source();
  if (source == nullptr) {
    switch (chat.format()) {
      case ChatFormat::kChatML:
        return ToolFormat::kHermes;
      case ChatFormat::kLlama3:
        return ToolFormat::kLlama3;
      case ChatFormat::kNone:
        break;
    }
    return ToolFormat::kPlain;
  }
  // The template's own tool-call markup decides; Llama-3 templates write
  // <|python_tag|> for tool calls and all of them end turns with <|eot_id|>.
  if (source->find(kHermesOpen) != std::string::npos) {
    return ToolFormat::kHermes;
  }
  if (source->find(kPythonTag) != std::string::npos ||
      source->find("<|eot_id|>") != std::string::npos) {
    return ToolFormat::kLlama3;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "env.tool_format: auto cannot tell how ", chat.Describe(),
      " writes tool calls; set env.tool_format: hermes | llama3 | plain"));
}

ParsedTurn ParseToolCalls(ToolFormat format, std::string_view text,
                          const std::vector<ToolSpec>& tools) {
  ParsedTurn turn;
  CallCollector calls(tools, &turn);
  std::string content;
  switch (format) {
    case ToolFormat::kHermes:
      ParseHermes(text, calls, &content);
      break;
    case ToolFormat::kLlama3:
      ParseLlama3(text, calls, &content);
      break;
    case ToolFormat::kPlain:
      ParsePlain(text, calls, &content);
      break;
  }
  turn.content = std::string(Trim(content));
  return turn;
}

absl::StatusOr<std::string> WriteToolCall(ToolFormat format,
                                          const ToolCall& call,
                                          const std::vector<ToolSpec>& tools) {
  const std::string who =
      absl::StrCat("tool call '", QuoteName(call.name), "'");
  if (call.name.empty()) {
    return absl::InvalidArgumentError("tool call with an empty name");
  }
  const ordered_json args = ParseJson(call.arguments_json);
  if (!args.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": arguments_json is not a JSON object"));
  }
  std::string out;
  switch (format) {
    case ToolFormat::kHermes:
      out = std::string(kHermesOpen) + "\n";
      AppendJson({{"name", call.name}, {"arguments", args}}, &out);
      absl::StrAppend(&out, "\n", AsAbsl(kHermesClose));
      return out;
    case ToolFormat::kLlama3:
      AppendJson({{"name", call.name}, {"parameters", args}}, &out);
      return out;
    case ToolFormat::kPlain:
      break;
  }
  if (call.name.find_first_of(" []") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        who,
        ": a name with a space or bracket cannot be written as [name "
        "text]"));
  }
  if (args.empty()) return absl::StrCat("[", call.name, "]");
  if (args.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": has ", args.size(),
                     " arguments; the plain format [name text] carries one"));
  }
  const PlainArgument arg = PlainArgumentOf(FindTool(tools, call.name));
  if (args.begin().key() != arg.name) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": argument '", QuoteName(args.begin().key()),
                     "' is not the one [name text] fills ('", arg.name, "')"));
  }
  if (!args.begin()->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": argument '", arg.name,
        "' is not a string; the plain format [name text] carries text"));
  }
  const std::string& text = args.begin()->get_ref<const std::string&>();
  // The parser ends the call at the ']' that balances its '['.
  int depth = 0;
  for (const char c : text) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who,
        ": text with unbalanced brackets cannot be written as [name "
        "text]"));
  }
  return absl::StrCat("[", call.name, " ", text, "]");
}

absl::StatusOr<std::string> ToolsJson(const std::vector<ToolSpec>& tools) {
  ordered_json list = ordered_json::array();
  for (const ToolSpec& tool : tools) {
    ordered_json parameters = ParseJson(tool.parameters_json);
    if (!parameters.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool '", QuoteName(tool.name),
                       "': parameters_json is not a JSON object"));
    }
    list.push_back({{"type", "function"},
                    {"function",
                     {{"name", tool.name},
                      {"description", tool.description},
                      {"parameters", std::move(parameters)}}}});
  }
  return Dump(list);
}

}  // namespace fusionrl
