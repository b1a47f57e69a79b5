// Exit codes of every `fusionrl` command, and the one-line error report.
//   0 success; 1 the job or command failed while running; 2 bad input
//   (config file, key, value, a missing or mismatching file, command-line
//   usage, a refused token); 130 stopped by SIGINT/SIGTERM after
//   checkpointing, or a followed job that ended cancelled.
// ExitCodeFor maps a status onto these: OK -> 0; InvalidArgument, NotFound,
// FailedPrecondition, OutOfRange (bad input) and Unauthenticated,
// PermissionDenied (a refused token) -> 2; every other code -> 1. 130 is
// never derived from a status: the commands return it themselves.
#ifndef FUSIONRL_CLI_COMMON_EXIT_CODES_H_
#define FUSIONRL_CLI_COMMON_EXIT_CODES_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"

namespace fusionrl::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitCancelled = 130;

inline int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

// Prints "fusionrl: error: <message>" to stderr; returns the exit code.
inline int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fusionrl: error: %s\n",
               std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_COMMON_EXIT_CODES_H_
