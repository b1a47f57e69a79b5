// Reads configs/simulate.yaml: the job section through the job-config
// parser, the cost model through its strict reader.
#include "sim/sim_config.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "core/yaml_load.h"

namespace fusionrl::sim {

absl::StatusOr<SimConfig> ParseSimConfig(
    const std::string& text, const std::string& source,
    const std::vector<std::string>& job_overrides) {
  YAML::Node root;
  try {
    root = LoadYaml(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": must be a map with the keys job and cost_model"));
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key != "job" && key != "cost_model") {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", key, ": unknown key (known keys: job, cost_model)"));
    }
  }
  const YAML::Node job = root["job"];
  if (!job.IsDefined() || !job.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": job: missing, or not a map (the job config "
                     "of one super node)"));
  }
  SimConfig c;
  c.path = source;
  YAML::Emitter out;
  out << job;
  c.job_yaml = out.c_str();
  c.job_overrides = job_overrides;
  absl::StatusOr<JobConfig> parsed =
      ParseJobConfig(c.job_yaml, absl::StrCat(source, " (job)"), job_overrides);
  if (!parsed.ok()) {
    // "<source> (job): <key>: why" -> "<source>: job.<key>: why".
    std::string m(parsed.status().message());
    const std::string prefix = absl::StrCat(source, " (job): ");
    if (absl::StartsWith(m, prefix)) {
      m = absl::StrCat(source, ": job.", m.substr(prefix.size()));
    }
    return absl::Status(parsed.status().code(), m);
  }
  c.job = *std::move(parsed);
  FUSIONRL_ASSIGN_OR_RETURN(c.cost, ParseCostModel(root["cost_model"], source));
  return c;
}

absl::StatusOr<CostModel> ApplyCostOverrides(
    const CostModel& base, const std::vector<std::string>& overrides) {
  if (overrides.empty()) return base;
  YAML::Node root(YAML::NodeType::Map);
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cost: '", o, "': expected key.path=value"));
    }
    std::vector<std::string> path = absl::StrSplit(o.substr(0, eq), '.');
    YAML::Node value;
    try {
      value = LoadYaml(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cost: '", o, "': ", e.what()));
    }
    // Walk (and create) the maps of the path; YAML::Node assignment
    // rebinds, so the nodes are kept in a chain.
    std::vector<YAML::Node> chain = {root};
    for (size_t i = 0; i + 1 < path.size(); ++i) {
      YAML::Node next = chain.back()[path[i]];
      if (!next.IsMap()) {
        chain.back()[path[i]] = YAML::Node(YAML::NodeType::Map);
        next = chain.back()[path[i]];
      }
      chain.push_back(next);
    }
    chain.back()[path.back()] = value;
  }
  return ParseCostModel(root, "--cost", base);
}

absl::StatusOr<SimConfig> LoadSimConfig(
    const std::string& path, const std::vector<std::string>& job_overrides) {
  FUSIONRL_ASSIGN_OR_RETURN(std::string text,
                            ReadTextFile(path, "simulate config"));
  return ParseSimConfig(text, path, job_overrides);
}

}  // namespace fusionrl::sim
