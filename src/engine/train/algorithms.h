// Policy-gradient math: advantage estimators, the clipped surrogate loss, KL
// estimators, entropy and loss aggregation.
//
// Pure functions on tensors; no state, no I/O, safe to call from any thread.
// Shapes: B = responses in the batch, T = response tokens (right-padded).
// `mask` is a float tensor [B, T] with 1 on response tokens (eos included)
// and 0 on padding. Formulas follow verl's core_algos where it has one, so
// results can be compared; each function's comment states its formula.
#ifndef FUSIONRL_ENGINE_TRAIN_ALGORITHMS_H_
#define FUSIONRL_ENGINE_TRAIN_ALGORITHMS_H_

#include <ATen/core/Tensor.h>

#include "fusionrl/config.h"

namespace fusionrl::algo {

// The loss aggregation mode, KL estimator and behaviour-weight level are
// the config's enums (fusionrl/config.h), parsed once by the config reader.
//   AggMode::kTokenMean:            sum(loss * mask) / num_tokens
//   AggMode::kSeqMeanTokenMean:     mean over seqs of (per-seq token mean)
//   AggMode::kSeqMeanTokenSum:      mean over seqs of (per-seq token sum)
//   AggMode::kSeqMeanTokenSumNorm:  sum(loss * mask) / (num_seqs * max_len)
//                                   (Dr.GRPO)
using AggMode = ::fusionrl::LossAggMode;
using KlEstimator = ::fusionrl::KlEstimator;
using WeightLevel = ::fusionrl::BehaviourWeightLevel;

// Denominators for AggLoss. When a batch is split into micro-batches, pass the
// whole batch's values so that the micro-batch losses add up to exactly the
// full-batch loss (and so do their gradients). A value <= 0 means "take it
// from this call's mask": num_tokens = mask.sum(), num_seqs = B,
// max_len = T.
struct AggNorm {
  double num_tokens = 0;
  double num_seqs = 0;
  double max_len = 0;
};

// Reduces a per-token loss matrix [B, T] to a scalar, per `mode`.
// Sequences with no valid token contribute 0 to the seq-mean modes (their
// per-seq mean is taken as 0) but still count in num_seqs.
at::Tensor AggLoss(const at::Tensor& loss_mat, const at::Tensor& mask,
                   AggMode mode, const AggNorm& norm = {});

// GRPO: scores [B] laid out group-major (response i of group g at
// g * group_size + i). adv = (s - mean_g) / (std_g + eps) with the unbiased
// std, or s - mean_g when !norm_by_std (Dr.GRPO). A group of size 1 gets
// mean 0 and std 1 (as verl). Returns [B].
at::Tensor GrpoAdvantages(const at::Tensor& scores, int group_size,
                          bool norm_by_std, double eps = 1e-6);

// RLOO: adv_i = s_i - mean_{j != i} s_j within each group (group_size >= 2;
// a group of 1 gets advantage 0). Returns [B].
at::Tensor RlooAdvantages(const at::Tensor& scores, int group_size);

// Masked whitening: (x - mean) / sqrt(var + eps) over mask == 1 entries, with
// the unbiased variance (verl's masked_whiten); masked-out entries become 0.
// With fewer than 2 valid entries (where verl raises) the result is all 0.
at::Tensor MaskedWhiten(const at::Tensor& values, const at::Tensor& mask,
                        double eps = 1e-8);

// REINFORCE++: token_rewards [B, T] (the outcome score on each sequence's
// last response token, minus any per-token KL penalty). Discounted returns
// over the policy's tokens (token_mask): G_t = r_t + gamma * G_next, where
// G_next is the return of the next policy token of the episode. An
// environment token inside the episode (episode_mask 1, token_mask 0: a
// multi-turn episode's tool answer) passes the return on unchanged, its own
// reward included, without a discount; the padding after the episode
// (episode_mask 0) resets it. (verl's loop resets on every mask hole, which
// gives the turns before an environment answer no outcome credit.) Then
// whitened over token_mask. Returns [B, T], 0 off token_mask.
at::Tensor ReinforcePlusPlusAdvantages(const at::Tensor& token_rewards,
                                       const at::Tensor& token_mask,
                                       const at::Tensor& episode_mask,
                                       double gamma);

// Per-token KL estimate between the policy (logp) and the reference (ref_logp),
// both [B, T] log-probs of the sampled tokens:
//   k1 = logp - ref_logp
//   k2 = 0.5 * (logp - ref_logp)^2
//   k3 = exp(ref - logp) - (ref - logp) - 1, with ref - logp clamped to
//        [-20, 20] and the result clamped to [-10, 10]
at::Tensor KlPenalty(const at::Tensor& logp, const at::Tensor& ref_logp,
                     KlEstimator estimator);

// Entropy of softmax(logits) along the last dim:
// logsumexp(l) - sum(softmax(l) * l). logits [..., V] -> [...].
at::Tensor EntropyFromLogits(const at::Tensor& logits);

struct PolicyLossResult {
  at::Tensor loss;            // scalar, aggregated per mode
  at::Tensor clip_frac;       // fraction of tokens where clipping bound
  at::Tensor dual_clip_frac;  // fraction of tokens where the dual clip bound
  at::Tensor approx_kl;       // token-mean of (old_logp - logp), the
                              // difference clamped to [-20, 20] as in ratio
  at::Tensor per_token;       // [B, T] each token's loss (weight applied),
                              // before aggregation; 0 off the mask
};

// PPO clipped surrogate with asymmetric clip and dual clip:
//   ratio = exp(clamp(logp - old_logp, -20, 20))
//   l1 = -A * ratio;  l2 = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)
//   l_clip = max(l1, l2)
//   l_dual = min(-A * clip_c, l_clip)        (used where A < 0)
//   loss = agg(A < 0 ? l_dual : l_clip)
// clip_c <= 1 disables the dual clip. advantages are [B, T].
//
// `token_weight` (optional, [B, T], treated as a constant) multiplies each
// token's loss before aggregation: the behaviour importance weight of the
// decoupled loss (BehaviourWeights below).
PolicyLossResult PpoClipLoss(const at::Tensor& logp, const at::Tensor& old_logp,
                             const at::Tensor& advantages,
                             const at::Tensor& mask, double clip_low,
                             double clip_high, double clip_c, AggMode mode,
                             const AggNorm& norm = {},
                             const at::Tensor& token_weight = {});

// Decoupled PPO's behaviour importance weights for samples generated by a
// behaviour policy older than the proximal policy (the trainer's weights at
// the start of the step): with d = prox_logp - behaviour_logp (clamped to
// [-20, 20]), the raw weight is
//   token level:    r_t = exp(d_t)
//   sequence level: r_t = exp(sum_t' d_t' * mask_t') for every t of the
//                   sequence
// and a raw weight over `cap` (r > cap) is, per `mode`,
//   kTruncate: w_t = min(r_t, cap)  (the token trains with weight cap);
//   kMask:     w_t = 0              (the token, or with sequence level the
//              whole sequence, is dropped from the policy loss, as AReaL's
//              behav_imp_weight_cap: its behav_mask = (r <= cap) & loss_mask
//              zeroes the weight, while the loss is still divided by the
//              count of the unmasked loss_mask; PpoClipLoss with this weight
//              and the sample mask does the same).
// With `floor` > 0 in kMask (MIS), a raw weight below the floor is masked
// too: both tails of pi_prox / pi_behaviour leave the loss.
// w is 0 on padding; no gradient flows through the weights. `capped`
// (optional) receives the fraction of valid tokens whose raw weight is
// outside [floor, cap] (truncated or masked, by mode; a NaN weight counts as
// outside and is masked in kMask). With behaviour == proximal (staleness 0)
// every weight is 1.
struct BehaviourWeightRule {
  WeightLevel level = WeightLevel::kToken;
  double cap = 5.0;
  double floor = 0.0;  // kMask only; 0 = no lower bound
  BehaviourWeightMode mode = BehaviourWeightMode::kTruncate;
};
at::Tensor BehaviourWeights(const at::Tensor& prox_logp,
                            const at::Tensor& behaviour_logp,
                            const at::Tensor& mask,
                            const BehaviourWeightRule& rule,
                            double* capped = nullptr);

// The rule of the job: algorithm.rollout_correction tis: {token, cap, 0,
// truncate} (verl's TIS); mis: {token, cap, 1 / cap, mask} (masked IS on
// both sides, IcePop-style); none: the decoupled loss's
// behaviour_weight_level / _cap / _mode.
BehaviourWeightRule BehaviourWeightRuleOf(const AlgorithmConfig& algorithm);

// |a - b| over the valid tokens of `mask` (float [B, T]): its sum, maximum
// and the token count (all 0 without a valid token).
struct LogProbDiff {
  double sum = 0;
  double max = 0;
  double tokens = 0;
};
LogProbDiff MaskedLogProbDiff(const at::Tensor& a, const at::Tensor& b,
                              const at::Tensor& mask);

// DAPO's soft overlong punishment (rollout.overlong: penalize): the reward
// a response of `length` tokens loses, with L = max_new_tokens and the
// ramp's `buffer` B (> 0):
//   0                                    for length <= L - B,
//   penalty * (length - (L - B)) / B     for L - B < length <= L,
//   penalty                              beyond (a response never is).
double OverlongPenalty(int64_t length, int max_new_tokens, int buffer,
                       double penalty);

// rollout.overlong_buffer resolved: `configured`, or when 0 a fifth of
// max_new_tokens (DAPO: 4096 of 20480), at least 1.
int OverlongBuffer(int max_new_tokens, int configured);

}  // namespace fusionrl::algo

#endif  // FUSIONRL_ENGINE_TRAIN_ALGORITHMS_H_
