// Environments: multi-turn, tool-using rollouts (docs/agents.md).
//
// With `env.name` set, a rollout sample is an episode rather than one
// response. The environment opens the episode for a task problem and may
// replace its opening conversation and offer tools; every assistant turn
// the policy writes goes to the episode, which answers with the next
// messages (tool results, a user reply), `done`, an optional final reward
// and metrics. The rollout appends each answer's tokens to the episode's
// token sequence (token-in/token-out: nothing is re-tokenized), masks them
// out of the loss and continues decoding from the KV cache it has.
//
// The rollout, not the environment, parses tool calls (in the model's own
// format: Hermes/Qwen <tool_call>, Llama-3 JSON, or the plain `[name args]`
// of the character models) and renders the answers in the chat template's
// tool role; an environment sees parsed calls and returns plain messages.
//
// Adding your own (embedding users):
//   fusionrl::EnvironmentRegistry::Global().Register("myenv",
//       [](const fusionrl::EnvConfig& c) ->
//       absl::StatusOr<std::unique_ptr<fusionrl::Environment>> {...});
// before the job is built; then `env.name: myenv` in YAML. `env.name:
// remote` talks to environment servers over gRPC instead
// (proto/fusionrl/v1/environment.proto), written in any language.
//
// Thread safety: Environment::Open and Demonstrate are called concurrently
// from the rollout's environment threads; one Episode is called by one
// thread at a time, never concurrently. Every call gets a deadline and
// should return by it: the rollout stops waiting there and fails the
// episode, but cannot interrupt an in-process call.
#ifndef FUSIONRL_ENVIRONMENT_H_
#define FUSIONRL_ENVIRONMENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"

namespace fusionrl {

// A tool the episode offers; rendered into the chat template's `tools`
// (OpenAI function format) for models whose template lists tools.
struct ToolSpec {
  std::string name;
  std::string description;
  // JSON Schema of the arguments object, e.g. {"type": "object",
  // "properties": {"expression": {"type": "string"}}, "required":
  // ["expression"]}. The plain format `[name text]` passes `text` as the
  // first required property (else the first property).
  std::string parameters_json = "{}";
};

// One tool call the policy wrote, parsed.
struct ToolCall {
  std::string name;
  std::string arguments_json = "{}";  // a JSON object
};

// One assistant turn as the policy wrote it.
struct AssistantTurn {
  int index = 0;     // 0 for the first turn of the episode
  std::string text;  // decoded, the end-of-turn token excluded
  // The text without the tool-call markup, after any thinking block
  // ("</think>"; "" for a turn that ends inside one): what is graded.
  std::string content;
  std::vector<ToolCall> tool_calls;
  // Calls that could not be parsed or name no offered tool, one message
  // each ("tool call 1: ..."). The rollout also sends each as a tool-role
  // error message, so the environment need not answer them.
  std::vector<std::string> call_errors;
  bool truncated = false;  // stopped by the per-turn token budget
};

// What the environment answers to a turn (or to Open: its first messages).
struct Observation {
  // Appended to the conversation: role "tool" (in call order) or "user".
  std::vector<ChatMessage> messages;
  bool done = false;
  // The episode's reward, read when done (and from Episode::Truncate).
  // Absent: the task's reward of the last assistant turn's content.
  std::optional<double> reward;
  std::optional<bool> correct;  // absent: reward > 0
  // Summed over the episode; the step's record has their mean per episode
  // (over the lead card's episodes) as env_<name>.
  std::map<std::string, double> metrics;
};

// The start of an episode.
struct EpisodeStart {
  // The conversation up to the first assistant turn; empty = the task
  // problem's own (system prompt and user turn).
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
};

// Why the rollout cut an episode the environment had not ended.
enum class CutReason {
  // env.max_turns: the last turn was answered (Step) without `done`.
  kMaxTurns,
  // env.max_episode_tokens (or, when 0, the model's max_seq_len): a turn
  // was cut inside (Cut::turn holds it) or an answer did not fit.
  kMaxEpisodeTokens,
};

// The end of an episode that a limit cut before the environment said done.
struct Cut {
  CutReason reason = CutReason::kMaxTurns;
  // The turn the limit cut inside (truncated: never sent as a Step);
  // absent when the cut came between turns (every turn was stepped).
  std::optional<AssistantTurn> turn;
};

class Episode {
 public:
  virtual ~Episode() = default;  // closes the episode
  // The environment's answer to `turn`, by `deadline`.
  virtual absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                           absl::Time deadline) = 0;
  // The environment's last word on an episode a limit cut: called once,
  // after the last Step's answer (never concurrently with a Step), and no
  // Step follows. Its `reward`, `correct` and `metrics` are read as a done
  // observation's (messages and done are ignored). An unset reward takes
  // the default of every episode: the task's reward of the last turn's
  // content (the cut turn's, if any). An error fails the episode as a
  // failed Step does. Default: no verdict (the task's reward).
  virtual absl::StatusOr<Observation> Truncate(const Cut& cut,
                                               absl::Time deadline) {
    (void)cut;
    (void)deadline;
    return Observation{};
  }
};

class Environment {
 public:
  virtual ~Environment() = default;
  // Opens an episode for `problem`. `seed` is fixed per sample (the
  // episode's randomness must come from it for a job to be reproducible).
  virtual absl::StatusOr<std::unique_ptr<Episode>> Open(
      const Problem& problem, uint64_t seed, absl::Time deadline,
      EpisodeStart* start) = 0;

  // A demonstration for a supervised warm start: the next assistant turn
  // (its content, tool calls in the plain `[name text]` form) for the
  // conversation so far, or nullopt to end. Default: none (SFT then uses
  // the task's single-turn solutions).
  virtual std::optional<std::string> Demonstrate(
      const Problem& problem,
      const std::vector<ChatMessage>& conversation) const {
    (void)problem;
    (void)conversation;
    return std::nullopt;
  }
};

using EnvironmentFactory =
    std::function<absl::StatusOr<std::unique_ptr<Environment>>(
        const EnvConfig&)>;

// name -> factory. Global() comes with the built-ins: "calculator" (a
// calculator tool; answers are graded against the problem's answer),
// "no_tools" (the same grading, every tool call answered with an error:
// the ablation of the calculator) and "remote" (gRPC, env.address).
class EnvironmentRegistry {
 public:
  static EnvironmentRegistry& Global();
  absl::Status Register(const std::string& name, EnvironmentFactory factory);
  // NotFound (listing the names) for an unknown env.name.
  absl::StatusOr<std::unique_ptr<Environment>> Create(
      const EnvConfig& config) const;
  std::vector<std::string> Names() const;

  EnvironmentRegistry();
  ~EnvironmentRegistry();

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENVIRONMENT_H_
