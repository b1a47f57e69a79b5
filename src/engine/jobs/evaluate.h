// Greedy evaluation of a policy on the task's held-out split.
#ifndef FUSIONRL_ENGINE_JOBS_EVALUATE_H_
#define FUSIONRL_ENGINE_JOBS_EVALUATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/rollout/job_context.h"

namespace fusionrl {

struct EvalResult {
  double accuracy = 0;  // fraction of eval problems answered correctly
  double reward_mean = 0;
  int64_t problems = 0;
  double seconds = 0;
};

// Greedy decoding of every eval problem with `model`, in batches.
//
// An expert shard (placement.expert_sampling: shard) decodes in lockstep
// with its group (RolloutEngine::set_expert_lockstep): every rank of the
// group calls this at once, one of them to evaluate and the others with
// `joins_only`, who join its forwards with no prompts and return an empty
// result (problems 0). The evaluating rank decodes the batches a whole
// model would, so its result is the whole model's.
absl::StatusOr<EvalResult> EvaluateGreedy(PolicyModel& model,
                                          const JobContext& ctx,
                                          int max_new_tokens,
                                          bool joins_only = false);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_JOBS_EVALUATE_H_
