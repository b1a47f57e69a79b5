// Tasks whose problems are read from JSON Lines files: the loading, eval
// split and shuffled training order shared by the `jsonl` task and the
// `math` task, which differ only in how one record becomes a Problem.
// Private to fusionrl_tasks.
#ifndef FUSIONRL_TASKS_JSONL_TASK_H_
#define FUSIONRL_TASKS_JSONL_TASK_H_

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"

namespace fusionrl::tasks {

// One record (already parsed, always a JSON object) -> Problem. On error the
// message is the bare reason ("missing \"answer\""); the loader prefixes the
// file and line. Must not throw.
using JsonlRecordParser =
    std::function<absl::StatusOr<Problem>(const nlohmann::json& record)>;

// What distinguishes one JSONL task from another.
struct JsonlTaskSpec {
  std::string name;            // Task::name(), used in error messages
  std::string default_reward;  // Task::default_reward()
  JsonlRecordParser parse_record;
};

// All records of a JSONL file; blank lines are skipped. NotFound if the file
// cannot be read; InvalidArgument "<path>:<line>: <reason>" (1-based line)
// for the first bad record, including lines that are not a JSON object.
absl::StatusOr<std::vector<Problem>> LoadJsonl(
    const std::string& path, const JsonlRecordParser& parse_record);

// A task over task.train_path / task.eval_path (eval = the last
// task.eval_size records of train_path when eval_path is ""), training
// records in a fresh seeded shuffle each epoch. Solution() is
// Problem::solution when set, else Problem::answer. InvalidArgument naming
// the key or file on bad config or data.
absl::StatusOr<std::unique_ptr<Task>> MakeJsonlTaskFromSpec(
    const TaskConfig& c, const JsonlTaskSpec& spec);

// The `math` task (math_task.cc): GSM8K-style records, reward "math".
// Each line is one of
//   {"question": str, "answer": str|number, "system": str (optional)}
//   {"messages": [{"role": "system"|"user"|"assistant", "content": str},
//                 ...], "answer": str|number}
// A string answer holding "####" is a worked solution: the reference answer
// is the text after the last "####" (trimmed) and the whole string becomes
// Problem::solution; otherwise the answer is taken as it is (trimmed).
// In chat form, a system message may only come first and the last message
// must be a user one (its content is Problem::prompt).
absl::StatusOr<std::unique_ptr<Task>> MakeMathTask(const TaskConfig& c);

// The record parser of the math task (exposed for tests).
absl::StatusOr<Problem> ParseMathRecord(const nlohmann::json& record);

}  // namespace fusionrl::tasks

#endif  // FUSIONRL_TASKS_JSONL_TASK_H_
