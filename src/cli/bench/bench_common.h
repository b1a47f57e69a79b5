// What `fusionrl bench` and `fusionrl bench-memory` share: the config as a
// benchmark loads it, medians, and the JSON result's destination.
#ifndef FUSIONRL_CLI_BENCH_BENCH_COMMON_H_
#define FUSIONRL_CLI_BENCH_BENCH_COMMON_H_

#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/common/exit_codes.h"
#include "core/metrics.h"
#include "fusionrl/config.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {

// The job at `path` with `overrides`, without its init_checkpoint (every
// benchmark run chooses its own start).
inline absl::StatusOr<JobConfig> LoadBenchConfig(
    const std::string& path, std::vector<std::string> overrides) {
  overrides.push_back("init_checkpoint=\"\"");
  return LoadJobConfig(path, overrides);
}

// Writes `result` to stdout (`out` empty) or to `out`, then prints that
// path. Returns the exit code.
inline int WriteBenchResult(const nlohmann::ordered_json& result,
                            const std::string& out) {
  const std::string text = result.dump(1) + "\n";
  if (out.empty()) {
    std::cout << text;
    return kExitOk;
  }
  std::ofstream f(out);
  f << text;
  if (!f) {
    return Fail(absl::UnavailableError(
        absl::StrCat("--out: cannot write '", out, "'")));
  }
  std::cout << out << "\n";
  return kExitOk;
}

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_BENCH_COMMON_H_
