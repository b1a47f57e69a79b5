// The `math` task: GSM8K-style word problems read from JSONL, in plain
// ({"question", "answer", "system"}) or chat ({"messages", "answer"}) form.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tasks/jsonl_task.h"

namespace fusionrl::tasks {
namespace {

std::string Trimmed(const std::string& s) {
  return std::string(absl::StripAsciiWhitespace(s));
}

// `j[key]` as a string; InvalidArgument naming `where` if it is not one.
absl::StatusOr<std::string> StringField(const nlohmann::json& j,
                                        const char* key,
                                        const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) {
    return absl::InvalidArgumentError(absl::StrCat("missing ", where));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must be a string, got ", it->type_name()));
  }
  return it->get<std::string>();
}

// Fills p.answer (and p.solution for a worked "... #### 72" solution).
absl::Status ParseAnswer(const nlohmann::json& j, Problem& p) {
  const auto answer = j.find("answer");
  if (answer == j.end()) {
    return absl::InvalidArgumentError("missing \"answer\"");
  }
  if (answer->is_number()) {
    p.answer = answer->dump();
    return absl::OkStatus();
  }
  if (!answer->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"answer\" must be a string or a number, got ", answer->type_name()));
  }
  const std::string text = answer->get<std::string>();
  const size_t hashes = text.rfind("####");
  if (hashes == std::string::npos) {
    p.answer = Trimmed(text);
  } else {
    p.answer = Trimmed(text.substr(hashes + 4));
    p.solution = Trimmed(text);
    if (p.answer.empty()) {
      return absl::InvalidArgumentError(
          "\"answer\" has nothing after its last \"####\"");
    }
  }
  if (p.answer.empty()) {
    return absl::InvalidArgumentError("\"answer\" is empty");
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const nlohmann::json& messages, Problem& p) {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"messages\" must be an array, got ", messages.type_name()));
  }
  if (messages.empty()) {
    return absl::InvalidArgumentError("\"messages\" is empty");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    const std::string where = absl::StrCat("\"messages\"[", i, "]");
    if (!m.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " must be an object, got ", m.type_name()));
    }
    absl::StatusOr<std::string> role =
        StringField(m, "role", absl::StrCat(where, ".role"));
    if (!role.ok()) return role.status();
    absl::StatusOr<std::string> content =
        StringField(m, "content", absl::StrCat(where, ".content"));
    if (!content.ok()) return content.status();
    if (*role != "system" && *role != "user" && *role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".role must be system, user or assistant, got \"",
                       *role, "\""));
    }
    if (*role == "system" && i != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a system message may only be the first message"));
    }
    p.messages.push_back({*std::move(role), *std::move(content)});
  }
  const ChatMessage& last = p.messages.back();
  if (last.role != "user") {
    return absl::InvalidArgumentError(
        absl::StrCat("the last of \"messages\" must have role \"user\", got \"",
                     last.role, "\""));
  }
  if (Trimmed(last.content).empty()) {
    return absl::InvalidArgumentError(
        "the last of \"messages\" (the question) has empty content");
  }
  p.prompt = last.content;
  if (p.messages.front().role == "system") p.system = p.messages[0].content;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Problem> ParseMathRecord(const nlohmann::json& j) {
  Problem p;
  const auto question = j.find("question");
  const auto messages = j.find("messages");
  if (question != j.end() && messages != j.end()) {
    return absl::InvalidArgumentError(
        "has both \"question\" and \"messages\"; give one");
  }
  if (messages != j.end()) {
    if (j.contains("system")) {
      return absl::InvalidArgumentError(
          "\"system\" cannot be used with \"messages\"; put a system message "
          "first in \"messages\"");
    }
    absl::Status status = ParseMessages(*messages, p);
    if (!status.ok()) return status;
  } else {
    if (question == j.end()) {
      return absl::InvalidArgumentError(
          "missing \"question\" (or \"messages\")");
    }
    absl::StatusOr<std::string> text =
        StringField(j, "question", "\"question\"");
    if (!text.ok()) return text.status();
    if (Trimmed(*text).empty()) {
      return absl::InvalidArgumentError("\"question\" is empty");
    }
    p.prompt = *std::move(text);
    if (j.contains("system")) {
      absl::StatusOr<std::string> system =
          StringField(j, "system", "\"system\"");
      if (!system.ok()) return system.status();
      p.system = *std::move(system);
    }
  }
  absl::Status status = ParseAnswer(j, p);
  if (!status.ok()) return status;
  return p;
}

absl::StatusOr<std::unique_ptr<Task>> MakeMathTask(const TaskConfig& c) {
  return MakeJsonlTaskFromSpec(c, {"math", "math", ParseMathRecord});
}

}  // namespace fusionrl::tasks
