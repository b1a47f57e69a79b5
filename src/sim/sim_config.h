// `fusionrl simulate`'s config file (configs/simulate.yaml): a `job:`
// section (an ordinary job config, read by the job-config parser) and a
// `cost_model:` section (sim/cost_model.h), both read strictly.
#ifndef FUSIONRL_SIM_SIM_CONFIG_H_
#define FUSIONRL_SIM_SIM_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"
#include "sim/cost_model.h"

namespace fusionrl::sim {

struct SimConfig {
  std::string path;                        // the file it came from
  std::string job_yaml;                    // the job section, as YAML text
  std::vector<std::string> job_overrides;  // applied after job_yaml
  JobConfig job;  // the job section with its overrides, validated
  CostModel cost;
};

// Reads `path`. NotFound for a missing file; InvalidArgument
// "<path>: <key.path>: <reason>" for an unknown top-level key, a missing or
// bad job section (the job parser's message, its keys under "job.") or a
// bad cost_model key.
// `job_overrides` ("key.path=value", as `fusionrl run --set`) apply to the
// job section.
absl::StatusOr<SimConfig> LoadSimConfig(
    const std::string& path,
    const std::vector<std::string>& job_overrides = {});

// The same from text; `source` names it in messages.
absl::StatusOr<SimConfig> ParseSimConfig(
    const std::string& text, const std::string& source,
    const std::vector<std::string>& job_overrides = {});

// `base` with "key.path=value" overrides of cost-model keys (the value in
// YAML scalar syntax), read as strictly as the file: InvalidArgument
// "--cost: cost_model.<key>: <reason>".
absl::StatusOr<CostModel> ApplyCostOverrides(
    const CostModel& base, const std::vector<std::string>& overrides);

}  // namespace fusionrl::sim

#endif  // FUSIONRL_SIM_SIM_CONFIG_H_
