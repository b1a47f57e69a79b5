// The rollout batches a fused or disaggregated card sampled ahead of its
// trainer, saved with a checkpoint so that a resume trains on exactly what
// the uninterrupted run would have (docs/stalesync.md#checkpoints-and-resume).
//
// With stalesync.rollout_version = lagged, the step after a checkpoint at
// version V that samples from a version below V cannot be sampled again
// after a resume (the checkpoint holds version V only): every card writes
// those batches, and the frame its predictions follow, next to the
// checkpoint:
//
//   <checkpoints>/rollout/step_<k>/card_<rank>.pb   (RolloutPrefetch,
//                                                     proto/fusionrl/v1/
//                                                     checkpoint.proto)
//
// A card that resumes from checkpoint step k reads its file and continues
// the pipeline; without a usable file (none, another run's, another rank
// layout) it samples the coming steps again from the checkpoint's weights:
// every prompt group is still trained once, but not from the same versions.
#ifndef FUSIONRL_WORKER_STEP_ROLLOUT_PREFETCH_H_
#define FUSIONRL_WORKER_STEP_ROLLOUT_PREFETCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/step/group_sampler.h"

namespace fusionrl {

struct RolloutPrefetch {
  int64_t checkpoint_step = 0;
  // CRC-32C of the card's weights at the checkpoint (WeightsCrc32c).
  uint32_t weights_crc32c = 0;
  int rank = 0;
  int64_t max_policy_lag = 0;
  int prompts_per_step = 0;
  int partial_rollout_tokens = 0;
  int steps_per_version = 1;
  // The frame (FusedRollout): base_groups at base_step, advancing by
  // prompts_per_step per step; versions counted from frame_version.
  int64_t base_step = 0;
  std::vector<uint64_t> base_groups;
  int64_t frame_version = 0;
  // Steps after checkpoint_step, consecutive from checkpoint_step + 1.
  std::map<int64_t, RolloutBatch> batches;
};

// Where card `rank` keeps what it sampled ahead of checkpoint step `step`;
// `checkpoints_dir` holds the checkpoints (<output_dir>/checkpoints).
std::string RolloutPrefetchPath(const std::string& checkpoints_dir,
                                int64_t step, int rank);

// Atomic (a reader sees the old file or the new one).
absl::Status WriteRolloutPrefetch(const std::string& path,
                                  const RolloutPrefetch& prefetch);

// NotFound when there is no file; DataLoss naming the path when it does not
// parse or its batches are not consecutive after checkpoint_step.
absl::StatusOr<RolloutPrefetch> ReadRolloutPrefetch(const std::string& path);

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_ROLLOUT_PREFETCH_H_
