// GroupSampler: the engine-level half of a step's rollout. Prompt groups in,
// scored completions out: each group's problem is encoded (chat format
// included), sampled group_size times by a RolloutEngine, and every
// completion is decoded and scored by the task's reward.
//
// The KV cache of the round is booked on the card's memory manager first;
// when the books grant it only after moving the optimizer state to host
// memory, `on_offload` carries that move out (CardRunner decides how, by
// thread and device).
//
// Thread safety: Sample() is const and may run on the rollout thread while
// the trainer runs; the engine, memory books and callback must be safe for
// that use.
#ifndef FUSIONRL_WORKER_STEP_GROUP_SAMPLER_H_
#define FUSIONRL_WORKER_STEP_GROUP_SAMPLER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/memory_manager.h"
#include "engine/rollout/sample.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"

namespace fusionrl {

struct JobContext;
class RolloutEngine;

// One step's sampled and scored prompt groups of one card.
struct RolloutBatch {
  std::vector<uint64_t> groups;
  std::vector<Sample> samples;  // group_size per group, in group order
  std::vector<Problem> problems;
  int64_t tokens = 0, correct = 0, finished = 0;
  double reward_sum = 0;
  // Sampling time of the batch (with a partial rollout, over every round
  // it was sampled in); round_seconds: this hand-over's share of its round.
  double seconds = 0;
  double round_seconds = 0;
  // Partial rollout: samples (indices) whose response stopped at a segment
  // end and continues in a later round; not scored yet. Empty once done.
  std::vector<int32_t> unfinished;
  // Fused: how long the rollout thread waited for the policy version that
  // StaleSync admission needed before sampling this batch.
  double gate_wait_seconds = 0;
  // Fused: the policy lag the step was admitted with (s; just in time the
  // predicted d; -1 where no rollout thread sampled it).
  int64_t admission_lag = -1;

  // Recounts tokens, correct, finished and reward_sum over the samples.
  void Recount();
};

// The prompt groups of one step; or, with `partial`, the step's batch
// whose unfinished responses continue (its groups are the batch's).
struct StepGroups {
  int64_t step = 0;
  std::vector<uint64_t> groups;
  std::optional<RolloutBatch> partial;
};

class GroupSampler {
 public:
  using OffloadFn = std::function<absl::Status(const MemoryDecision&)>;
  using DeliverFn = std::function<void(int64_t step, RolloutBatch batch)>;
  // Partial rollout: where this call must stop a response of `step` that
  // holds `tokens` tokens (a later call continues it from newer weights);
  // max_new_tokens or more = run it to the end.
  using SegmentEndFn = std::function<int64_t(int64_t step, int64_t tokens)>;

  // Both borrowed; they must outlive the sampler.
  GroupSampler(const JobConfig& config, const JobContext& ctx)
      : config_(config), ctx_(ctx) {}

  // Samples `groups` for `step` (card `rank`) with `engine`, whose weights
  // are policy version `version`. The sampling seed depends only on the
  // job's seed, the step and the rank, so a replanned attempt draws the
  // same completions from the same weights.
  absl::StatusOr<RolloutBatch> Sample(RolloutEngine& engine,
                                      const std::vector<uint64_t>& groups,
                                      int64_t step, int rank, int64_t version,
                                      CardMemoryManager& memory,
                                      const OffloadFn& on_offload) const;

  // Samples the groups of several steps from `version` in one engine call:
  // each sequence keeps the sampling key Sample() would give it, so every
  // step's batch equals Sample()'s for that step, while on the fused path
  // a slot whose sequence finished takes the next waiting one, of the same
  // or a later step (continuous batching across steps; the engine decodes
  // at most one step's sequences at once, or rollout.decode_slots). Calls
  // deliver(step, batch) as soon as all of a step's sequences are done
  // (on the fused path possibly before earlier steps'; batch.seconds is
  // the time since the previous delivery, so the seconds sum to the
  // call's). On an error nothing more is delivered.
  //
  // Partial rollout: with `segment_end`, each response stops where it says
  // (unless it ends first) and its step is delivered with those samples in
  // `unfinished`; a step given back with `partial` continues them (prompt +
  // response so far, the same sampling keys from the next token on), takes
  // the new tokens' versions into token_versions, and is delivered again.
  //
  // Multi-turn (env.name set): each sample is an episode of the job's
  // environment (engine/rollout/agent_loop.h), sampled with the key above; the
  // steps are delivered in order once all their episodes have ended. With
  // env.on_failure drop, a group with an episode the environment failed is
  // excluded from the loss.
  absl::Status SampleSteps(RolloutEngine& engine,
                           const std::vector<StepGroups>& steps, int rank,
                           int64_t version, CardMemoryManager& memory,
                           const OffloadFn& on_offload,
                           const DeliverFn& deliver,
                           const SegmentEndFn& segment_end = nullptr) const;

 private:
  absl::Status SampleEpisodes(RolloutEngine& engine,
                              const std::vector<StepGroups>& steps, int rank,
                              int64_t version, CardMemoryManager& memory,
                              const OffloadFn& on_offload,
                              const DeliverFn& deliver) const;

  const JobConfig& config_;
  const JobContext& ctx_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_GROUP_SAMPLER_H_
