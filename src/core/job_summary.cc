#include "core/job_summary.h"

#include "core/metrics.h"
#include "nlohmann/json.hpp"

namespace fusionrl {

absl::Status WriteSummary(const JobSummary& s) {
  nlohmann::ordered_json j = {
      {"kind", s.kind},
      {"initial_eval_accuracy", s.initial_eval_accuracy},
      {"final_eval_accuracy", s.final_eval_accuracy},
      {"steps", s.steps},
      {"rollout_tokens", s.rollout_tokens},
      {"wall_seconds", s.wall_seconds},
      {"tokens_per_second", s.tokens_per_second},
      {"final_train_reward", s.final_train_reward},
      {"policy_version", s.policy_version},
      {"checkpoint_dir", s.checkpoint_dir},
      {"interrupted", s.interrupted},
      {"resumed_from_step", s.resumed_from_step}};
  return WriteFileAtomic(s.summary_path, j.dump(2) + "\n");
}

}  // namespace fusionrl
