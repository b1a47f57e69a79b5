// A section of the job configuration: the RL objective and its optimizer
// (algorithm.*, optim.*).
// Include fusionrl/config.h, which holds every section and the functions
// that load and validate a job.
#ifndef FUSIONRL_CONFIG_ALGORITHM_H_
#define FUSIONRL_CONFIG_ALGORITHM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

// How advantages are estimated (algorithm.adv_estimator).
//   grpo:         group-relative: (r - mean of the group) / std (or without
//                 the std, algorithm.norm_adv_by_std: false = Dr.GRPO).
//   rloo:         leave-one-out: r - mean of the group's other responses.
//   reinforce_pp: REINFORCE++: discounted token returns, whitened over the
//                 batch.
enum class AdvEstimator { kGrpo, kRloo, kReinforcePp };
absl::StatusOr<AdvEstimator> ParseAdvEstimator(absl::string_view name);
const char* AdvEstimatorName(AdvEstimator estimator);

// How per-token losses become one number (algorithm.loss_agg_mode).
//   token-mean:              sum(loss * mask) / tokens.
//   seq-mean-token-mean:     mean over sequences of the per-sequence mean.
//   seq-mean-token-sum:      mean over sequences of the per-sequence sum.
//   seq-mean-token-sum-norm: sum(loss * mask) / (sequences * max length)
//                            (Dr.GRPO).
enum class LossAggMode {
  kTokenMean,
  kSeqMeanTokenMean,
  kSeqMeanTokenSum,
  kSeqMeanTokenSumNorm,
};
absl::StatusOr<LossAggMode> ParseLossAggMode(absl::string_view name);
const char* LossAggModeName(LossAggMode mode);

// Estimator of the KL to the reference policy (algorithm.kl_estimator):
// k1, k2, k3 (Schulman's approximations).
enum class KlEstimator { kK1, kK2, kK3 };
absl::StatusOr<KlEstimator> ParseKlEstimator(absl::string_view name);
const char* KlEstimatorName(KlEstimator estimator);

// Where the KL to the reference policy goes (algorithm.kl_mode): loss = a
// term of the loss; reward = a per-token penalty on the rewards.
enum class KlMode { kLoss, kReward };
absl::StatusOr<KlMode> ParseKlMode(absl::string_view name);
const char* KlModeName(KlMode mode);

// The level of the behaviour importance weight of decoupled PPO
// (algorithm.behaviour_weight_level): token = per token; sequence = the
// product over the sequence's tokens.
enum class BehaviourWeightLevel { kToken, kSequence };
absl::StatusOr<BehaviourWeightLevel> ParseBehaviourWeightLevel(
    absl::string_view name);
const char* BehaviourWeightLevelName(BehaviourWeightLevel level);

// What decoupled PPO does with a token whose behaviour importance weight
// pi_prox / pi_behaviour exceeds algorithm.behaviour_weight_cap
// (docs/stalesync.md "Truncate or mask").
//   truncate: the weight becomes the cap (min(w, cap); the token still
//             trains, with weight cap).
//   mask:     the token is dropped from the policy loss (weight 0), as
//             AReaL's behav_imp_weight_cap does; it still counts in the
//             loss's token and sequence denominators, as in AReaL.
enum class BehaviourWeightMode { kTruncate, kMask };

// "truncate" -> kTruncate, "mask" -> kMask; anything else is an
// InvalidArgument "must be one of truncate, mask; got '<name>'".
absl::StatusOr<BehaviourWeightMode> ParseBehaviourWeightMode(
    absl::string_view name);

// "truncate", "mask" (the YAML spelling; "?" for a value out of range).
const char* BehaviourWeightModeName(BehaviourWeightMode mode);

// Rollout/trainer mismatch correction (algorithm.rollout_correction): the
// rollout engine's log-probs differ from the trainer's for the same weights
// (fused decode kernels, bf16, top-k/top-p, MoE capacity drops), so the
// trainer recomputes the proximal log-probs and weights each token by
// w = pi_trainer / pi_rollout:
//   none: no correction (the PPO ratio is taken against the rollout's
//         log-probs);
//   tis:  truncated importance sampling, min(w, cap);
//   mis:  masked importance sampling (IcePop-style, both sides): the token
//         leaves the policy loss where w > cap or w < 1 / cap.
// It is decoupled PPO's behaviour weight with its own rule, so it also
// corrects a StaleSync policy lag; validation refuses it together with
// algorithm.decoupled_loss (one weight, one rule).
enum class RolloutCorrection { kNone, kTis, kMis };
absl::StatusOr<RolloutCorrection> ParseRolloutCorrection(
    absl::string_view name);
const char* RolloutCorrectionName(RolloutCorrection correction);

// Policy-gradient algorithm: advantage estimator + clipped surrogate loss.
struct AlgorithmConfig {
  // grpo | rloo | reinforce_pp
  AdvEstimator adv_estimator = AdvEstimator::kGrpo;
  bool norm_adv_by_std = true;   // grpo: false gives Dr.GRPO's r - mean(r)
  double gamma = 1.0;            // reinforce_pp: token discount
  double clip_ratio_low = 0.2;   // ratio clipped to [1 - low, 1 + high]
  double clip_ratio_high = 0.2;  // DAPO clip-higher: high > low
  double clip_ratio_c = 3.0;     // dual clip bound for negative advantages
  // token-mean | seq-mean-token-mean | seq-mean-token-sum |
  // seq-mean-token-sum-norm (Dr.GRPO)
  LossAggMode loss_agg_mode = LossAggMode::kTokenMean;
  // KL to the frozen reference policy (the initial weights).
  double kl_coef = 0.0;  // 0 = no KL, no reference forward pass
  KlEstimator kl_estimator = KlEstimator::kK3;  // k1 | k2 | k3
  KlMode kl_mode = KlMode::kLoss;  // loss (a loss term) | reward (a penalty)
  double entropy_coef = 0.0;       // entropy bonus weight
  int ppo_epochs = 1;              // passes over each rollout batch
  // Off-policy correction (decoupled PPO, for samples generated by an older
  // policy than the trainer's): the PPO ratio is taken against the proximal
  // policy (the trainer's weights at the start of the step, recomputed), and
  // each token's loss is weighted by the behaviour importance weight
  // pi_prox / pi_behaviour, per token or per sequence (the product over the
  // sequence's tokens); a weight above behaviour_weight_cap is truncated to
  // the cap or masked out, per behaviour_weight_mode. Required whenever
  // stalesync.max_policy_lag > 0 (validation refuses a lag without it).
  bool decoupled_loss = false;
  // MoE policies: the trainer's forwards route each token to the experts
  // the rollout routed it to (recorded per token and layer), recomputing
  // only the gates, so trainer log-probs and the PPO ratio see the routing
  // the samples were drawn with (verl/slime "R3"). Replayed routing is
  // dropless, as the rollout's was.
  bool router_replay = false;
  double behaviour_weight_cap = 5.0;             // >= 1
  BehaviourWeightLevel behaviour_weight_level =  // token | sequence
      BehaviourWeightLevel::kToken;
  BehaviourWeightMode behaviour_weight_mode =  // truncate | mask
      BehaviourWeightMode::kTruncate;
  // none | tis | mis (see RolloutCorrection), with its cap (> 1; verl's
  // default threshold 2).
  RolloutCorrection rollout_correction = RolloutCorrection::kNone;
  double rollout_correction_cap = 2.0;
  // The trainer recomputes the proximal log-probs and weights tokens by
  // pi_prox / pi_behaviour: decoupled PPO or a rollout correction.
  bool RecomputesProximal() const {
    return decoupled_loss || rollout_correction != RolloutCorrection::kNone;
  }
};

// Optimizer and batching.
struct OptimConfig {
  double lr = 1e-4;           // peak learning rate
  double weight_decay = 0.0;  // AdamW decoupled weight decay
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;     // max global grad norm; 0 = off
  int warmup_steps = 0;       // linear warm-up of the lr from 0
  int mini_batch_size = 0;    // sequences per optimizer step; 0 = whole batch
  int micro_batch_size = 64;  // sequences per forward/backward (accumulated)
  // Response positions per chunk of the LM head in the trainer: the logits
  // of only this many tokens exist at a time (forward and backward), never
  // batch x sequence x vocabulary; 0 = the whole micro-batch at once.
  int logits_chunk_tokens = 512;
  // Dense policies: a mini-batch's micro-batches take its sequences longest
  // first, each trimmed to its own longest prompt and response (less
  // padding computed; the same update up to float rounding).
  bool length_bucketing = true;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_ALGORITHM_H_
