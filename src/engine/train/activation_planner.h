// The automatic activation policy (model.activations.policy auto): given a
// budget for the bytes a training step holds for backward, choose keep,
// recompute or swap per (layer, sub-block) by measured memory saved per unit
// of extra time.
//
// How it decides (PlanActivations):
//  1. Profile on the given batch with every sub-block kept: the bytes held
//     for backward at the end of the forward (allocator-level count, exact),
//     the step time (forward + backward, median of `repeats`), and each
//     sub-block's own forward time (SubBlockTimer, median).
//  2. Candidates: for every (layer, sub-block), recompute costs one more
//     forward of the sub-block (backward runs it again) and frees what the
//     plan "only this sub-block recomputed" measures as no longer held. The
//     sub-blocks are attention, mlp, norm and two finer units, recompute
//     only: attention_core (the scores-to-weighted-sum part of attention,
//     timed inside the attention sub-block's forward) and mlp_act (the
//     SwiGLUs' SiLU and product, and a MoE expert's gather and gating:
//     their forward is what backward runs again).
//     Swap is a candidate only where it frees device memory
//     (SwapFreesDeviceMemory: never on a CPU, where the host pool is the
//     same memory); its cost is measured as the extra forward time of the
//     copies, doubled for the copies back in backward.
//  3. Greedy: candidates in order of bytes freed per second (free ones
//     first), each added to the plan and the plan's held bytes measured
//     again (savings are not exactly additive: a recomputed sub-block keeps
//     its inputs), until the plan fits the budget. Then a pruning pass drops
//     chosen sub-blocks, least efficient first, while the plan still fits.
//  4. If even every candidate together does not fit, FailedPrecondition
//     names the budget and the least reachable figure.
// The plan is the model's on return (PolicyModel::SetActivationPlan); the
// model's gradients are untouched (the profile differentiates with
// autograd::grad, not backward()).
//
// Thread safety: as the model (one thread at a time).
#ifndef FUSIONRL_ENGINE_TRAIN_ACTIVATION_PLANNER_H_
#define FUSIONRL_ENGINE_TRAIN_ACTIVATION_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"

namespace fusionrl {

class PolicyModel;
struct CollatedBatch;

// One (layer, sub-block) as the planner measured it.
struct SubBlockProfile {
  int layer = 0;
  std::string sub_block;  // attention | mlp | norm | attention_core | mlp_act
  double forward_seconds = 0;  // its forward with every sub-block kept
  // Recompute: bytes no longer held when only this sub-block recomputes,
  // and the extra time (one more forward of it).
  int64_t recompute_freed_bytes = 0;
  double recompute_extra_seconds = 0;
  // Swap (only where it frees device memory; else 0 and not a candidate).
  bool swap_candidate = false;
  int64_t swap_freed_bytes = 0;
  double swap_extra_seconds = 0;
  ActivationAction chosen = ActivationAction::kKeep;
};

struct ActivationPlanReport {
  int64_t budget_bytes = 0;
  int64_t keep_held_bytes = 0;     // every sub-block kept
  int64_t planned_held_bytes = 0;  // the chosen plan, measured
  double keep_step_seconds = 0;    // forward + backward, median
  // Sum of the chosen sub-blocks' extra seconds, and (keep + that) / keep.
  double estimated_extra_seconds = 0;
  double estimated_step_time_ratio = 1;
  int measurements = 0;                     // forwards run to measure plans
  std::vector<SubBlockProfile> sub_blocks;  // layer-major
  std::vector<LayerActivationPlan> plan;
};

struct PlannerOptions {
  int64_t budget_bytes = 0;  // > 0
  int repeats = 3;           // timed steps of the profile (median)
};

// Plans `model`'s activations for `batch` (a training micro-batch of the
// largest shape the plan must fit) and installs the plan. InvalidArgument
// for a budget <= 0; FailedPrecondition when no plan fits (message: the
// budget, what every sub-block kept holds and the least reachable);
// Internal when LibTorch fails.
absl::StatusOr<ActivationPlanReport> PlanActivations(
    PolicyModel& model, const CollatedBatch& batch,
    const PlannerOptions& options);

// model.activations.policy auto: plans `model` for its largest training
// micro-batch, `rows` sequences of model.max_seq_len tokens, every token
// valid (random tokens: the plan depends on shapes, not values), against
// model.activations.budget_mib, and logs the plan. Returns nullopt without
// doing anything for any other policy, or for an expert shard (plan the
// whole model before ExpertShardOf, which keeps its plan). Errors as
// PlanActivations.
absl::StatusOr<std::optional<ActivationPlanReport>> PlanActivationsForJob(
    PolicyModel& model, int64_t rows);

// Expert parallelism: sets every card of `model`'s expert group to the plan
// of the group's rank 0 (a broadcast over the group). The cards of a group
// must recompute the same sub-blocks (a recomputed MoE block exchanges
// tokens again in backward), and policy auto plans from each card's own
// timings. A no-op without shards. A collective of the group.
absl::Status ShareActivationPlan(PolicyModel& model);

// The plan in one line: "attention=recompute,mlp=recompute,norm=keep" per
// layer, layers separated by "; " and prefixed "<layer>: ". Parses back with
// model.activations.layers.
std::string FormatActivationPlan(const std::vector<LayerActivationPlan>& plan);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_ACTIVATION_PLANNER_H_
