// Tasks with verifiable rewards, and the registries users extend.
//
// A Task produces problems: a deterministic, seeded stream of training
// problems and a fixed held-out eval split that never overlaps training.
// A RewardFn scores one response to one problem. Each task names a default
// reward; `task.reward` in the job config selects another registered one.
//
// Adding your own (embedding users):
//   fusionrl::TaskRegistry::Global().Register("mytask",
//       [](const fusionrl::TaskConfig& c) ->
//       absl::StatusOr<std::unique_ptr<fusionrl::Task>> {...});
//   fusionrl::RewardRegistry::Global().Register("myreward", [] { return ...;
//   });
// before the job is built; then `task.name: mytask` in YAML.
//
// Thread safety: Task::TrainProblem, Task::eval_set and RewardFn::Score are
// const and safe to call concurrently. The registries are internally locked.
#ifndef FUSIONRL_TASK_H_
#define FUSIONRL_TASK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"

namespace fusionrl {

// One turn of a chat conversation, before any chat template is applied.
// `role` is "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

struct Problem {
  std::string prompt;  // the user text given to the policy
  std::string answer;  // reference answer the verifier checks against
  // The fields below have `{}` initializers so that the existing
  // `Problem{prompt, answer}` stays free of -Wmissing-field-initializers.
  // System message of this problem; "" = none (then task.system_prompt,
  // if set, is used). Not part of `prompt`.
  std::string system{};
  // The whole conversation, for problems given in chat form (system first,
  // if any; the last message is the user turn whose text is `prompt`).
  // Empty = the conversation is [system (if any), user: prompt].
  std::vector<ChatMessage> messages{};
  // Worked solution (e.g. GSM8K reasoning ending in "#### 72") used as the
  // supervised warm-start target by tasks that have one; "" = none.
  std::string solution{};
};

struct Verdict {
  double reward = 0.0;   // scalar reward of the response
  bool correct = false;  // counted in accuracy
};

class RewardFn {
 public:
  virtual ~RewardFn() = default;
  // `response` is the decoded response text, stop token excluded.
  virtual Verdict Score(const Problem& problem,
                        std::string_view response) const = 0;
};

class Task {
 public:
  virtual ~Task() = default;

  virtual std::string name() const = 0;

  // Training problem number `index` (0, 1, 2, ...): a pure function of the
  // task's seed and `index`, so a data cursor is a single integer. Never
  // returns a problem whose prompt is in eval_set().
  virtual Problem TrainProblem(uint64_t index) const = 0;

  // The held-out split, fixed at construction.
  virtual const std::vector<Problem>& eval_set() const = 0;

  // The target response for supervised warm start (usually the answer).
  virtual std::string Solution(const Problem& problem) const {
    return problem.answer;
  }

  // Name of the RewardFn used when the config names none.
  virtual std::string default_reward() const = 0;
};

using TaskFactory =
    std::function<absl::StatusOr<std::unique_ptr<Task>>(const TaskConfig&)>;
using RewardFactory = std::function<std::unique_ptr<RewardFn>()>;

// name -> factory. Global() comes with the built-in tasks (addition,
// countdown, multiply, repeat, reverse, sort, jsonl, math) and rewards (exact,
// char_match, numeric, countdown, math) registered.
class TaskRegistry {
 public:
  static TaskRegistry& Global();
  // AlreadyExists if `name` is taken.
  absl::Status Register(const std::string& name, TaskFactory factory);
  // NotFound (listing the known names) if `config.name` is not registered;
  // otherwise whatever the factory returns.
  absl::StatusOr<std::unique_ptr<Task>> Create(const TaskConfig& config) const;
  std::vector<std::string> Names() const;

  TaskRegistry();
  ~TaskRegistry();

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

class RewardRegistry {
 public:
  static RewardRegistry& Global();
  absl::Status Register(const std::string& name, RewardFactory factory);
  absl::StatusOr<std::unique_ptr<RewardFn>> Create(
      const std::string& name) const;
  std::vector<std::string> Names() const;

  RewardRegistry();
  ~RewardRegistry();

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_TASK_H_
