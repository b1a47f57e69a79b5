// The RL step's math between scored samples and the loss: the rewards a
// step trains with, its masks, its advantages and one micro-batch's loss.
//
// Trainer::Step calls exactly these functions, and so does the differential
// reference test (tests/rl_reference/), which compares their results in
// float64 with an independent PyTorch implementation of the published
// formulas. Pure functions on tensors: no model, no state, any thread.
//
// The masks of a step ([B, T], response-aligned, in the step's dtype):
//   episode_mask  1 on every response token, the policy's or the
//                 environment's (a multi-turn episode's tool answers), 0 on
//                 the padding after the episode;
//   token_mask    1 on the policy's tokens of the samples not excluded (an
//                 excluded sample, always a whole group: over-stale or an
//                 environment failure, leaves every statistic);
//   loss_mask     token_mask without the rows rollout.overlong: mask drops
//                 (DAPO's overlong filtering masks the loss only: a cut
//                 sample keeps its reward in its group's baseline and its
//                 tokens in REINFORCE++'s whitening).
#ifndef FUSIONRL_ENGINE_TRAIN_STEP_MATH_H_
#define FUSIONRL_ENGINE_TRAIN_STEP_MATH_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/rollout/sample.h"
#include "engine/train/algorithms.h"
#include "fusionrl/config.h"

namespace fusionrl::algo {

struct StepRewards {
  at::Tensor rewards;       // [B] the outcome each sample trains with
  at::Tensor episode_mask;  // [B, T]
  at::Tensor token_mask;    // [B, T]
  at::Tensor loss_mask;     // [B, T]
  at::Tensor last;          // [B] int64: index of the last response token
  // Statistics over the samples not excluded: how many, how many were cut
  // at max_new_tokens, and the reward the overlong ramp took in all.
  int64_t trained = 0;
  int64_t cut = 0;
  double penalty_sum = 0;
};

// The rewards and masks of `samples` (T = the longest response), with
// rollout.overlong applied: penalize lowers each reward on DAPO's length
// ramp (OverlongPenalty), mask leaves cut rows out of loss_mask.
StepRewards PrepareStepRewards(const std::vector<Sample>& samples,
                               const RolloutConfig& rollout,
                               const at::TensorOptions& options);

// The advantages [B, T] of a step (0 off token_mask). `kl_tokens` (defined
// only with algorithm.kl_mode reward and kl_coef > 0) is the per-token KL of
// the proximal policy to the reference; the penalty kl_coef * kl_t is taken
// from every policy token's reward.
//   grpo / rloo: one return per sample, reward - kl_coef * sum_t kl_t over
//     token_mask, then GrpoAdvantages / RlooAdvantages within each group,
//     broadcast over the sample's policy tokens;
//   reinforce_pp: the outcome on the last response token, discounted
//     returns over the policy's tokens (an environment token passes the
//     return on unchanged; padding after the episode resets it), whitened
//     over token_mask.
at::Tensor StepAdvantages(const AlgorithmConfig& algorithm, int group_size,
                          const StepRewards& step,
                          const at::Tensor& kl_tokens = {});

// AggLoss's denominators for one (mini-)batch's loss_mask on this rank:
// its tokens, its sequences with at least one token (a sequence without any
// is not counted by the seq-mean modes) and max_len = max(T,
// max_new_tokens), the same on every rank. Data-parallel ranks add up
// num_tokens and num_seqs.
AggNorm LocalAggNorm(const at::Tensor& loss_mask, int max_new_tokens);

// One micro-batch's loss: the clipped surrogate against `old_logp` with the
// behaviour `weight` (may be undefined), + kl_coef * agg(KL(logp || ref))
// with kl_mode loss, - entropy_coef * agg(entropy). `ref_logp` is defined
// when the job has a KL term (either mode; its value is returned for the
// metrics), `entropy` when entropy_coef > 0 (no gradient taken through it
// here beyond what it carries).
struct MicroBatchLoss {
  at::Tensor loss;
  PolicyLossResult pg;
  at::Tensor kl_tokens;  // undefined without a reference
};
MicroBatchLoss MicroBatchLossOf(
    const AlgorithmConfig& algorithm, const at::Tensor& logp,
    const at::Tensor& old_logp, const at::Tensor& advantages,
    const at::Tensor& loss_mask, const AggNorm& norm, const at::Tensor& weight,
    const at::Tensor& ref_logp, const at::Tensor& entropy);

}  // namespace fusionrl::algo

#endif  // FUSIONRL_ENGINE_TRAIN_STEP_MATH_H_
