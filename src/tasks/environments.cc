// EnvironmentRegistry and the built-in environments: "calculator" (a calc
// tool; the final answer is graded against the problem's answer) and
// "no_tools" (the same grading with no tool: its ablation).
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "fusionrl/environment.h"
#include "nlohmann/json.hpp"
#include "tasks/calculator.h"

namespace fusionrl {
namespace {

constexpr char kCalcName[] = "calc";
constexpr char kCalcParameters[] =
    R"({"type": "object", "properties": {"expression": {"type": "string", )"
    R"("description": "e.g. 347*29"}}, "required": ["expression"]})";

// Abseil 20220623 (Debian) has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

std::string Trimmed(std::string_view s) {
  return std::string(absl::StripAsciiWhitespace(AsAbsl(s)));
}

ToolSpec CalcTool() {
  ToolSpec tool;
  tool.name = kCalcName;
  tool.description = "Evaluates integer arithmetic: + - * / and parentheses";
  tool.parameters_json = kCalcParameters;
  return tool;
}

// The final answer of both built-ins: the turn's content (calls removed),
// trimmed, against the problem's answer, as the "exact" reward grades.
Observation GradeFinalAnswer(const Problem& problem,
                             const AssistantTurn& turn) {
  Observation obs;
  obs.done = true;
  const bool correct = Trimmed(turn.content) == Trimmed(problem.answer);
  obs.reward = correct ? 1.0 : 0.0;
  obs.correct = correct;
  return obs;
}

// Both built-ins' verdict on an episode a limit cut: no final answer was
// given, so reward 0 and not correct (their reward for a wrong answer);
// the cut turn is not graded (an answer cut before its end of turn is
// not one the policy gave).
Observation CutVerdict() {
  Observation obs;
  obs.reward = 0.0;
  obs.correct = false;
  return obs;
}

// A turn that called tools (or tried to) is answered; one without calls is
// the final answer. Call errors are answered by the rollout itself.
bool IsToolTurn(const AssistantTurn& turn) {
  return !turn.tool_calls.empty() || !turn.call_errors.empty();
}

// The calc tool's reply to one call: the value, or "error: ...".
std::string AnswerCalc(const ToolCall& call) {
  if (call.name != kCalcName) {
    return absl::StrCat("error: unknown tool '", absl::CHexEscape(call.name),
                        "' (offered: ", kCalcName, ")");
  }
  const nlohmann::json args =
      nlohmann::json::parse(call.arguments_json, nullptr, false);
  const auto it = args.is_object() ? args.find("expression") : args.end();
  if (!args.is_object() || it == args.end() || !it->is_string()) {
    return R"(error: calc takes {"expression": "<arithmetic>"})";
  }
  absl::StatusOr<std::string> value =
      tasks::EvaluateArithmetic(it->get_ref<const std::string&>());
  if (!value.ok()) return absl::StrCat("error: ", value.status().message());
  return *std::move(value);
}

class CalculatorEpisode final : public Episode {
 public:
  explicit CalculatorEpisode(Problem problem) : problem_(std::move(problem)) {}

  absl::StatusOr<Observation> Truncate(const Cut& cut,
                                       absl::Time deadline) override {
    return CutVerdict();
  }

  absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                   absl::Time deadline) override {
    if (!IsToolTurn(turn)) return GradeFinalAnswer(problem_, turn);
    Observation obs;
    for (const ToolCall& call : turn.tool_calls) {
      obs.messages.push_back({"tool", AnswerCalc(call)});
    }
    obs.metrics["calc_calls"] = static_cast<double>(turn.tool_calls.size());
    return obs;
  }

 private:
  const Problem problem_;
};

class CalculatorEnvironment final : public Environment {
 public:
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem& problem,
                                                uint64_t seed,
                                                absl::Time deadline,
                                                EpisodeStart* start) override {
    if (start != nullptr) {
      start->messages.clear();  // the task's own conversation
      start->tools = {CalcTool()};
    }
    return std::unique_ptr<Episode>(new CalculatorEpisode(problem));
  }

  // The expert's two turns: "[calc A*B]" for the prompt "A*B=", then the
  // tool's result as the answer. A failed calculation ends the
  // demonstration (nothing correct to show).
  std::optional<std::string> Demonstrate(
      const Problem& problem,
      const std::vector<ChatMessage>& conversation) const override {
    const ChatMessage* last_tool = nullptr;
    for (const ChatMessage& m : conversation) {
      if (m.role == "tool") last_tool = &m;
    }
    if (last_tool == nullptr) {
      absl::string_view expression =
          absl::StripTrailingAsciiWhitespace(problem.prompt);
      if (!expression.empty() && expression.back() == '=') {
        expression.remove_suffix(1);
        expression = absl::StripTrailingAsciiWhitespace(expression);
      }
      return absl::StrCat("[", kCalcName, " ", expression, "]");
    }
    if (absl::StartsWith(last_tool->content, "error:")) return std::nullopt;
    return last_tool->content;
  }
};

class NoToolsEpisode final : public Episode {
 public:
  explicit NoToolsEpisode(Problem problem) : problem_(std::move(problem)) {}

  absl::StatusOr<Observation> Truncate(const Cut& cut,
                                       absl::Time deadline) override {
    return CutVerdict();
  }

  absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                   absl::Time deadline) override {
    if (!IsToolTurn(turn)) return GradeFinalAnswer(problem_, turn);
    Observation obs;
    for (size_t i = 0; i < turn.tool_calls.size(); ++i) {
      obs.messages.push_back({"tool", "error: no tools are available"});
    }
    return obs;
  }

 private:
  const Problem problem_;
};

// The calculator's ablation: the same problems and grading, no tool (the
// parser rejects every call as naming an unknown tool), no demonstration.
class NoToolsEnvironment final : public Environment {
 public:
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem& problem,
                                                uint64_t seed,
                                                absl::Time deadline,
                                                EpisodeStart* start) override {
    if (start != nullptr) {
      start->messages.clear();
      start->tools.clear();
    }
    return std::unique_ptr<Episode>(new NoToolsEpisode(problem));
  }
};

}  // namespace

// A locked name -> factory map, as TaskRegistry's (registry.cc).
struct EnvironmentRegistry::Rep {
  mutable absl::Mutex mu;
  std::map<std::string, EnvironmentFactory> factories ABSL_GUARDED_BY(mu);
};

EnvironmentRegistry::EnvironmentRegistry() : rep_(std::make_unique<Rep>()) {}
EnvironmentRegistry::~EnvironmentRegistry() = default;

EnvironmentRegistry& EnvironmentRegistry::Global() {
  // Built-ins are registered here rather than by static initializers, which
  // the linker drops from static libraries. "remote" registers itself from
  // the binaries that link the gRPC client. Never destroyed.
  static EnvironmentRegistry* const registry = [] {
    auto* r = new EnvironmentRegistry;
    const std::pair<const char*, EnvironmentFactory> builtins[] = {
        {"calculator",
         [](const EnvConfig&) -> absl::StatusOr<std::unique_ptr<Environment>> {
           return std::make_unique<CalculatorEnvironment>();
         }},
        {"no_tools",
         [](const EnvConfig&) -> absl::StatusOr<std::unique_ptr<Environment>> {
           return std::make_unique<NoToolsEnvironment>();
         }},
    };
    for (const auto& [name, factory] : builtins) {
      const absl::Status status = r->Register(name, factory);
      (void)status;  // cannot fail: distinct names, fresh registry
    }
    return r;
  }();
  return *registry;
}

absl::Status EnvironmentRegistry::Register(const std::string& name,
                                           EnvironmentFactory factory) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "cannot register an environment with an empty name");
  }
  if (!factory) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot register environment '", name, "' with an empty factory"));
  }
  absl::MutexLock lock(&rep_->mu);
  if (!rep_->factories.emplace(name, std::move(factory)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("environment '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Environment>> EnvironmentRegistry::Create(
    const EnvConfig& config) const {
  EnvironmentFactory factory;
  {
    absl::MutexLock lock(&rep_->mu);
    const auto it = rep_->factories.find(config.name);
    if (it != rep_->factories.end()) factory = it->second;
  }
  if (!factory) {
    if (config.name == "remote") {
      return absl::NotFoundError(
          "env.name: remote needs the gRPC environment client, which "
          "registers itself when a job starts in the fusionrl binary or "
          "fusionrl_worker (RegisterRemoteEnvironment())");
    }
    return absl::NotFoundError(
        absl::StrCat("env.name: unknown environment '", config.name,
                     "' (known: ", absl::StrJoin(Names(), ", "), ")"));
  }
  // Run without the lock: a factory may take its time (a remote one
  // connects) or look at the registry itself.
  absl::StatusOr<std::unique_ptr<Environment>> env = factory(config);
  if (env.ok() && *env == nullptr) {
    return absl::InternalError(
        absl::StrCat("environment factory '", config.name, "' returned null"));
  }
  return env;
}

std::vector<std::string> EnvironmentRegistry::Names() const {
  absl::MutexLock lock(&rep_->mu);
  std::vector<std::string> names;
  names.reserve(rep_->factories.size());
  for (const auto& [name, factory] : rep_->factories) names.push_back(name);
  return names;  // sorted: std::map
}

}  // namespace fusionrl
