// Helpers shared by the task tests (tasks_test.cc, jsonl_task_test.cc,
// task_registry_test.cc): configs, tasks and rewards from the global
// registries, and a status check by code and message.
#ifndef FUSIONRL_TASKS_TASKS_TEST_UTIL_H_
#define FUSIONRL_TASKS_TASKS_TEST_UTIL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace tasks_testing {

inline TaskConfig Config(const std::string& name) {
  TaskConfig c;
  c.name = name;
  return c;
}

inline std::unique_ptr<Task> MustCreate(const TaskConfig& config) {
  absl::StatusOr<std::unique_ptr<Task>> task =
      TaskRegistry::Global().Create(config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? *std::move(task) : nullptr;
}

inline Verdict Score(const std::string& reward, const Problem& problem,
                     const std::string& response) {
  absl::StatusOr<std::unique_ptr<RewardFn>> fn =
      RewardRegistry::Global().Create(reward);
  EXPECT_TRUE(fn.ok()) << fn.status();
  return fn.ok() ? (*fn)->Score(problem, response) : Verdict{};
}

inline bool Correct(const std::string& reward, const Problem& problem,
                    const std::string& response) {
  const Verdict v = Score(reward, problem, response);
  EXPECT_EQ(v.correct, v.reward == 1.0);
  EXPECT_TRUE(v.reward == 0.0 || v.reward == 1.0);
  return v.correct;
}

inline testing::AssertionResult HasMessage(const absl::Status& status,
                                           absl::StatusCode code,
                                           const std::string& substring) {
  if (status.code() != code ||
      std::string(status.message()).find(substring) == std::string::npos) {
    return testing::AssertionFailure()
           << "got " << status << ", want code "
           << absl::StatusCodeToString(code) << " and message containing \""
           << substring << "\"";
  }
  return testing::AssertionSuccess();
}

}  // namespace tasks_testing
}  // namespace fusionrl

#endif  // FUSIONRL_TASKS_TASKS_TEST_UTIL_H_
