// The built-in tasks (addition, multiply, reverse, sort, repeat, countdown,
// jsonl), their shared base and the seeding helpers. Private to
// fusionrl_tasks; users reach the tasks through TaskRegistry::Global().
//
// Determinism: every random draw comes from a std::mt19937_64 seeded with
// ProblemSeed(task seed, stream, index, attempt), and integers are drawn with
// UniformInt (not std::uniform_int_distribution, whose output differs
// between standard libraries), so problems depend only on the config.
#ifndef FUSIONRL_TASKS_BUILTIN_TASKS_H_
#define FUSIONRL_TASKS_BUILTIN_TASKS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"

namespace fusionrl::tasks {

// Stream tags for ProblemSeed: independent random streams of one task.
inline constexpr uint64_t kTrainStream = 1;
inline constexpr uint64_t kEvalStream = 2;
inline constexpr uint64_t kShuffleStream = 3;

// Seed of one draw: core's splitmix64 MixSeed chained over the four values.
uint64_t ProblemSeed(uint64_t seed, uint64_t stream, uint64_t index,
                     uint64_t attempt);

// Uniform integer in [lo, hi] by rejection sampling (portable).
// REQUIRES: lo <= hi.
int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi);

// Base of the generated tasks. Owns the eval split and the attempt loop that
// keeps training problems out of it; a subclass only implements Generate().
//
// Eval split: problems drawn from the eval stream (index 0, 1, ...) until
// eval_size distinct prompts are collected. Training problem `index`: the
// first draw, over attempt = 0, 1, ..., of the train stream at `index` whose
// prompt is not an eval prompt.
//
// Lifecycle: construct, then Init() exactly once (the factories in
// builtin_tasks.cc do both); only then call the Task methods.
// Thread safety: immutable after Init(); all const methods are safe to call
// concurrently.
class SyntheticTask : public Task {
 public:
  std::string name() const final { return name_; }
  Problem TrainProblem(uint64_t index) const final;
  const std::vector<Problem>& eval_set() const final { return eval_; }
  std::string default_reward() const final { return default_reward_; }

  // Draws the eval split and checks that training problems can still be
  // drawn. InvalidArgument (naming task.eval_size) if the problem space is
  // too small for eval_size distinct prompts, or if the eval split covers
  // (nearly) all of it. REQUIRES: eval_size >= 0; called once.
  absl::Status Init(int eval_size);

 protected:
  SyntheticTask(std::string name, std::string default_reward, int64_t seed);

  // One problem drawn from `rng`. Must depend on nothing but `rng` and the
  // task's immutable config. Called concurrently; must be thread-safe.
  virtual Problem Generate(std::mt19937_64& rng) const = 0;

 private:
  Problem Draw(uint64_t stream, uint64_t index, uint64_t attempt) const;

  const std::string name_;
  const std::string default_reward_;
  const uint64_t seed_;
  std::vector<Problem> eval_;
  absl::flat_hash_set<std::string> eval_prompts_;
};

// Factories registered in TaskRegistry::Global(). Each validates the config
// fields it uses (InvalidArgument naming the key) and returns a ready task.
absl::StatusOr<std::unique_ptr<Task>> MakeAdditionTask(const TaskConfig& c);
absl::StatusOr<std::unique_ptr<Task>> MakeMultiplyTask(const TaskConfig& c);
absl::StatusOr<std::unique_ptr<Task>> MakeReverseTask(const TaskConfig& c);
absl::StatusOr<std::unique_ptr<Task>> MakeSortTask(const TaskConfig& c);
absl::StatusOr<std::unique_ptr<Task>> MakeRepeatTask(const TaskConfig& c);
absl::StatusOr<std::unique_ptr<Task>> MakeCountdownTask(const TaskConfig& c);
// Defined in jsonl_task.cc.
absl::StatusOr<std::unique_ptr<Task>> MakeJsonlTask(const TaskConfig& c);

}  // namespace fusionrl::tasks

#endif  // FUSIONRL_TASKS_BUILTIN_TASKS_H_
