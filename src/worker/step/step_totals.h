// StepTotals: what one card's step adds to the step's record, by name.
//
// Every card of the job counts what it trained; the cards' counts are summed
// (SumAcrossRanks, one flat vector of doubles) and the lead card writes the
// sums into the step's record (worker/step/step_record.h). The flat layout
// exists only between Pack() and Unpack(), so no caller indexes it by position.
//
// Thread safety: a plain value.
#ifndef FUSIONRL_WORKER_STEP_STEP_TOTALS_H_
#define FUSIONRL_WORKER_STEP_STEP_TOTALS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace fusionrl {

struct RolloutBatch;

struct StepTotals {
  // Over the trained batch (after the staleness filter).
  double reward_sum = 0;
  double correct = 0;
  double finished = 0;
  double tokens = 0;   // response tokens
  double samples = 0;  // samples in the batch (dropped ones included)
  // Prompt groups with a trained sample, as count, sum and sum of squares
  // of their ids: over a run, a test can check every group was trained
  // exactly once from the cards' own counts (the ledger says what was
  // planned, these what was trained).
  double trained_groups = 0;
  double trained_group_id_sum = 0;
  double trained_group_id_sq_sum = 0;
  // Samples the card's rollout thread sampled (fused, disaggregated; 0 for
  // colocated-sync and for regenerated over-stale groups).
  double thread_samples = 0;
  // Trained samples by staleness 0..s ([s + 1]).
  std::vector<double> staleness;
  // Partial rollout: trained samples whose response spans several versions,
  // and their tokens sampled by a newer version than the sample's oldest.
  double partial_samples = 0;
  double partial_newer_tokens = 0;
  // Samples over the policy lag before the filter (regenerated or dropped).
  double over_stale = 0;
  // Multi-turn episodes (env.name set), over every sample of the batch:
  // assistant turns, tool calls, malformed or unknown calls, seconds in
  // environment calls, environment tokens (masked out of the loss) and
  // episodes the environment failed.
  double env_turns = 0;
  double env_tool_calls = 0;
  double env_tool_errors = 0;
  double env_seconds = 0;
  double env_tokens = 0;
  double env_failed = 0;

  // The totals of `batch`, trained at `trainer_version` (the version the
  // step starts from) in a job with policy lag `max_lag`. Staleness of a
  // sample: trainer_version - behaviour_version (0..max_lag; the batch has
  // passed the staleness filter). InvalidArgument for one outside.
  static absl::StatusOr<StepTotals> Of(const RolloutBatch& batch,
                                       int64_t trainer_version, int max_lag,
                                       int64_t thread_samples,
                                       int64_t over_stale);

  // The flat form that SumAcrossRanks sums, and back (InvalidArgument when
  // the size is not that of `max_lag`'s layout).
  std::vector<double> Pack() const;
  static absl::StatusOr<StepTotals> Unpack(const std::vector<double>& flat,
                                           int max_lag);

  StepTotals& operator+=(const StepTotals& other);
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_STEP_TOTALS_H_
