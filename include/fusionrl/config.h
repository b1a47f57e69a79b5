// FusionRL job configuration.
//
// A job is fully described by one YAML file. Configuration flows one way:
//   YAML text -> LoadJobConfig() -> JobConfig (plain structs, validated once)
//   -> passed by const reference to every component.
// Every field has its default inline and a comment. Tests build configs in
// code by starting from `JobConfig{}` and changing fields.
//
// Errors: LoadJobConfig() never throws. A bad file yields an
// InvalidArgument (bad key, type or value) or NotFound (missing file) status
// whose message is one line: "<file>: <key.path>: <reason>".
//
// The sections' structs are in config_<section>.h (model, rollout,
// algorithm, run, placement, stalesync); this header includes them all and
// is the one to include.
#ifndef FUSIONRL_CONFIG_H_
#define FUSIONRL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fusionrl/activation_config.h"
#include "fusionrl/config_algorithm.h"
#include "fusionrl/config_model.h"
#include "fusionrl/config_placement.h"
#include "fusionrl/config_rollout.h"
#include "fusionrl/config_run.h"
#include "fusionrl/config_stalesync.h"

namespace fusionrl {

struct JobConfig {
  std::string name = "job";    // shown in logs and summaries
  std::string source_path;     // the YAML file this came from (not a key)
  int64_t seed = 1;            // seeds init, sampling and data order
  std::string device = "cpu";  // torch device string: cpu, cuda, cuda:1
  int num_threads = 2;         // LibTorch intra-op threads
  std::string output_dir = "runs/job";  // metrics, checkpoints, summary
  std::string init_checkpoint;  // policy to start from ("" = random init)
  ModelConfig model;
  TaskConfig task;
  RolloutConfig rollout;
  AlgorithmConfig algorithm;
  OptimConfig optim;
  RunConfig run;
  SftConfig sft;
  PlacementConfig placement;
  StaleSyncConfig stalesync;
  MemoryConfig memory;
  ClusterConfig cluster;
  EnvConfig env;
};

// Reads `path`, applies `overrides` ("key.path=value", YAML scalar syntax
// for the value) in order, and validates. A file with no keys (zero bytes,
// or only comments and whitespace) is an InvalidArgument, "<path>: the file
// is empty (no keys); ...": an empty file is a mistake, not a request for a
// default job (write `{}` for that). Relative file paths inside the config
// (init_checkpoint, task.train_path, task.eval_path) are taken as given, i.e.
// relative to the working directory, as with any command-line tool; a path
// that does not exist is a NotFound error naming the key.
absl::StatusOr<JobConfig> LoadJobConfig(
    const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text (which must hold at least one key, or be `{}`);
// `source_name` is used in error messages.
absl::StatusOr<JobConfig> ParseJobConfig(
    const std::string& yaml_text, const std::string& source_name,
    const std::vector<std::string>& overrides = {});

// Range and consistency checks on an already built config (LoadJobConfig
// runs them). Messages name the key path.
absl::Status ValidateJobConfig(const JobConfig& config);

// What LoadJobConfig does once the keys are read, for a config built in
// code: takes the architecture from model.hf_path's config.json (when the
// path is set and exists; a conflicting explicit value is an error) and
// validates, as ValidateJobConfig. A program's struct goes through this once,
// as a file's keys do; the result is what the job runs.
absl::Status ResolveJobConfig(JobConfig& config);

// The config as YAML, with every key (for logging and for reproducing runs).
std::string JobConfigToYaml(const JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_H_
