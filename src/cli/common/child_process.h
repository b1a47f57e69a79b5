// Runs a benchmark's measurements in fresh processes: a child's stdout is
// captured and parsed as one JSON object, under a deadline.
#ifndef FUSIONRL_CLI_COMMON_CHILD_PROCESS_H_
#define FUSIONRL_CLI_COMMON_CHILD_PROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {

// In a child: sends the default logger to stderr, so that stdout carries
// only the JSON line its parent reads.
void LogToStderr();

// The path of the running executable (/proc/self/exe).
absl::StatusOr<std::string> SelfExecutable();

// Runs argv (argv[0] a path) with stdin closed and stderr inherited, kills
// it after `timeout_seconds` (coreutils' timeout), and parses the last line
// of its stdout that is a JSON object. DeadlineExceeded on the timeout,
// Internal when it fails or prints no JSON (with the tail of its output).
absl::StatusOr<nlohmann::ordered_json> RunJsonChild(
    const std::vector<std::string>& argv, int timeout_seconds);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_COMMON_CHILD_PROCESS_H_
