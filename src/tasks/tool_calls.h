// Tool calls in the model's own format: parsing an assistant turn's calls
// and writing a demonstration's calls (multi-turn rollouts,
// include/fusionrl/environment.h, docs/agents.md#tool-call-formats).
//
//   hermes (Qwen2.5/Qwen3, Hermes, most chat templates that list tools):
//     <tool_call>
//     {"name": "calculator", "arguments": {"expression": "3*4"}}
//     </tool_call>
//     any number of them, anywhere in the turn; the content is the text
//     outside them, trimmed.
//   llama3 (Llama-3.1/3.2 JSON tool calling): the whole turn is one JSON
//     object {"name": ..., "parameters": {...}} (or "arguments"), an
//     optional leading "<|python_tag|>"; several separated by ";". A turn
//     that does not start with "{" (after the tag) is plain content.
//   plain (the character-level models, no chat template): [name text],
//     e.g. "[calc 347*29]"; `text` (up to the closing bracket) becomes the
//     tool's first required argument (else its first property, else
//     "input").
//
// A call that does not parse (bad JSON, no name, arguments not an object,
// an unclosed tag) or names a tool the episode does not offer becomes one
// entry of `errors`, worded for the model to read ("tool call 1: unknown
// tool 'foo' (offered: calc)"); never an exception.
//
// Thread safety: pure functions.
#ifndef FUSIONRL_TASKS_TOOL_CALLS_H_
#define FUSIONRL_TASKS_TOOL_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/environment.h"

namespace fusionrl {

class ChatRenderer;

enum class ToolFormat { kHermes, kLlama3, kPlain };

std::string_view ToolFormatName(ToolFormat format);

// env.tool_format: "hermes" | "llama3" | "plain", or "auto": hermes when the
// chat template mentions "<tool_call>", llama3 when it writes
// "<|python_tag|>" or "<|eot_id|>", plain for format none; InvalidArgument
// naming env.tool_format when auto finds none of these.
absl::StatusOr<ToolFormat> ResolveToolFormat(std::string_view setting,
                                             const ChatRenderer& chat);

struct ParsedTurn {
  std::string content;  // the turn without the call markup, trimmed
  std::vector<ToolCall> calls;
  std::vector<std::string> errors;
};

// The calls of `text` (a decoded assistant turn, end-of-turn token
// excluded), checked against the offered `tools`.
ParsedTurn ParseToolCalls(ToolFormat format, std::string_view text,
                          const std::vector<ToolSpec>& tools);

// The text a model writes for `call` in `format` (the inverse of
// ParseToolCalls, for demonstrations): hermes
// "<tool_call>\n{json}\n</tool_call>", llama3 the JSON object, plain
// "[name text]" (the first argument's value; InvalidArgument if the call
// has more than one argument or a non-string one).
absl::StatusOr<std::string> WriteToolCall(ToolFormat format,
                                          const ToolCall& call,
                                          const std::vector<ToolSpec>& tools);

// `tools` as the chat template's `tools` variable: a JSON array of
// {"type": "function", "function": {"name", "description",
// "parameters"}}. InvalidArgument naming the tool if parameters_json is
// not a JSON object.
absl::StatusOr<std::string> ToolsJson(const std::vector<ToolSpec>& tools);

}  // namespace fusionrl

#endif  // FUSIONRL_TASKS_TOOL_CALLS_H_
