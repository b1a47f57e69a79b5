// A section of the job configuration: bounded staleness between rollout and
// training (stalesync.*).
// Include fusionrl/config.h, which holds every section and the functions
// that load and validate a job.
#ifndef FUSIONRL_CONFIG_STALESYNC_H_
#define FUSIONRL_CONFIG_STALESYNC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

// What happens to a prompt group over the policy lag that reaches the
// trainer (stalesync.over_stale): regenerate = sampled again from the
// current weights; drop = masked out of the step.
enum class OverStalePolicy { kRegenerate, kDrop };
absl::StatusOr<OverStalePolicy> ParseOverStalePolicy(absl::string_view name);
const char* OverStalePolicyName(OverStalePolicy policy);

// Which policy version a fused or disaggregated rollout samples a step
// from (stalesync.rollout_version; docs/stalesync.md#which-version-samples):
// lagged = exactly the oldest the lag allows, so the versions, and with
// them the whole run, depend on the config alone; newest = the newest
// version published when the step's rollout starts (fresher samples, but
// timing decides which version samples what); jit = newest, started just
// in time: as late as the measured rollout and training times say still
// hides it, never beyond the lag (timing decides, as with newest).
enum class RolloutVersion { kLagged, kNewest, kJustInTime };
absl::StatusOr<RolloutVersion> ParseRolloutVersion(absl::string_view name);
const char* RolloutVersionName(RolloutVersion rule);

// StaleSync: bounded staleness (placement.mode fused).
struct StaleSyncConfig {
  // s: a sample may be trained on only if trainer version - behaviour
  // version <= s. Rollout of step u starts only once the policy it samples
  // from is at least version u - 1 - s, so no sample can exceed it; 0 is
  // exactly synchronous on-policy RL. s > 0 requires
  // algorithm.decoupled_loss: true (the plain PPO ratio against a stale
  // behaviour policy gives a biased update; validation refuses it).
  int max_policy_lag = 0;
  // A sample over the lag cannot be admitted, but if one ever reaches the
  // trainer it is never used silently: regenerate = its prompt group is
  // sampled again from the current weights; drop = the group is masked out
  // of the step. Counted per step (over_stale_samples in metrics.jsonl).
  OverStalePolicy over_stale = OverStalePolicy::kRegenerate;
  // lagged: the rollout of the i-th step after the start (or a reset at
  // version v0) samples from version max(v0, v0 + i - s): every sample is
  // exactly s versions old once the pipeline is full, two runs of a config
  // are the same run, and a checkpoint carries the batches sampled ahead so
  // a resume continues exactly. newest: from the newest version published
  // when the step's rollout starts (staleness <= s, often less; which
  // version samples what depends on timing, so neither runs nor resumes
  // repeat bit for bit; no prompt group is lost or trained twice). jit:
  // newest, but the i-th step's rollout waits for version v0 + i - d, d in
  // 1..s the fewest training steps predicted to cover one step's rollout
  // (the card's measured seconds, with a 20% margin; s until both are
  // measured): staleness only where it buys overlap
  // (docs/stalesync.md#just-in-time-admission).
  RolloutVersion rollout_version = RolloutVersion::kLagged;
  // Partial rollout (N > 0): a response of step t samples its tokens
  // [jN, (j+1)N) from the version that samples step t + j (lagged), j at
  // most s - 1 (the last segment runs to the end). Where that version is
  // newer than the step's own, the response is interrupted after jN tokens
  // and its tail continues in the next round, re-prefilled under the newer
  // weights and decoded beside the next step's responses, instead of
  // decoding alone at the end of its own round. Staleness counts from the
  // oldest token (<= s); every token's version is recorded. Needs fused or
  // disaggregated placement, max_policy_lag >= 2 and rollout_version
  // lagged; N < rollout.max_new_tokens. 0 = off (docs/stalesync.md).
  int partial_rollout_tokens = 0;
  // Lagged: m consecutive steps sample from one policy version (1..s + 1).
  // 1 = each step its own version, exactly s old once the pipeline is
  // full. m > 1: the steps of each block of m (counted from the frame's
  // start) sample from the version their last step is admitted at, so they
  // are s - m + 1 .. s old and their rollouts decode in one round, a long
  // tail beside the next step's responses (continuous batching across
  // steps); the block starts once that version is published, which hides
  // less of it behind training. For rollout-bound runs with long-tailed
  // response lengths (docs/stalesync.md#steps-sharing-a-version). Not with
  // partial rollout.
  int steps_per_version = 1;
  // k: across super nodes, a super node that finished step c starts step
  // c + 1 only while c - min(clocks of the other super nodes) <= k, and
  // applies the other super nodes' gradient updates as they arrive (those
  // of steps <= c + 1 - k at the latest); 0 is one synchronous data-parallel
  // step (a global barrier). Ignored with one super node.
  int max_clock_skew = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_STALESYNC_H_
