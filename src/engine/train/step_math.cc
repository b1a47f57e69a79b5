#include "engine/train/step_math.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace fusionrl::algo {

StepRewards PrepareStepRewards(const std::vector<Sample>& samples,
                               const RolloutConfig& rollout,
                               const at::TensorOptions& options) {
  const int64_t batch = static_cast<int64_t>(samples.size());
  int64_t t_len = 1;
  for (const Sample& s : samples) {
    t_len = std::max<int64_t>(t_len, s.response_ids.size());
  }
  const int buffer =
      OverlongBuffer(rollout.max_new_tokens, rollout.overlong_buffer);
  const auto host = at::TensorOptions().dtype(at::kDouble);
  at::Tensor rewards = at::zeros({batch}, host);
  at::Tensor episode = at::zeros({batch, t_len}, host);
  at::Tensor tokens = at::zeros({batch, t_len}, host);
  at::Tensor loss = at::zeros({batch, t_len}, host);
  at::Tensor last = at::zeros({batch}, host.dtype(at::kLong));
  auto r = rewards.accessor<double, 1>();
  auto ep = episode.accessor<double, 2>();
  auto tok = tokens.accessor<double, 2>();
  auto lm = loss.accessor<double, 2>();
  auto la = last.accessor<int64_t, 1>();
  StepRewards out;
  for (int64_t b = 0; b < batch; ++b) {
    const Sample& s = samples[b];
    const int64_t n = static_cast<int64_t>(s.response_ids.size());
    la[b] = std::max<int64_t>(0, n - 1);
    r[b] = s.reward;
    bool in_loss = !s.excluded;
    if (!s.excluded) {
      ++out.trained;
      if (!s.finished) ++out.cut;
      if (rollout.overlong == OverlongMode::kPenalize) {
        const double p = OverlongPenalty(n, rollout.max_new_tokens, buffer,
                                         rollout.overlong_penalty);
        r[b] -= p;
        out.penalty_sum += p;
      } else if (rollout.overlong == OverlongMode::kMask && !s.finished) {
        in_loss = false;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      ep[b][j] = 1.0;
      const bool model_token =
          j >= static_cast<int64_t>(s.loss_mask.size()) || s.loss_mask[j];
      const double t = (model_token && !s.excluded) ? 1.0 : 0.0;
      tok[b][j] = t;
      lm[b][j] = in_loss ? t : 0.0;
    }
  }
  out.rewards = rewards.to(options);
  out.episode_mask = episode.to(options);
  out.token_mask = tokens.to(options);
  out.loss_mask = loss.to(options);
  out.last = last.to(options.device());
  return out;
}

at::Tensor StepAdvantages(const AlgorithmConfig& algorithm, int group_size,
                          const StepRewards& step,
                          const at::Tensor& kl_tokens) {
  const at::Tensor& m = step.token_mask;
  at::Tensor penalty;  // [B, T] kl_coef * kl on the policy's tokens
  if (kl_tokens.defined()) {
    penalty = at::where(m != 0, algorithm.kl_coef * kl_tokens.to(m.dtype()),
                        at::zeros_like(m));
  }
  if (algorithm.adv_estimator == AdvEstimator::kReinforcePp) {
    at::Tensor token_rewards = at::zeros_like(m).scatter(
        1, step.last.unsqueeze(1), step.rewards.unsqueeze(1));
    if (penalty.defined()) token_rewards = token_rewards - penalty;
    return ReinforcePlusPlusAdvantages(token_rewards, m, step.episode_mask,
                                       algorithm.gamma);
  }
  at::Tensor returns = step.rewards;
  if (penalty.defined()) returns = returns - penalty.sum(1);
  const at::Tensor seq_adv =
      algorithm.adv_estimator == AdvEstimator::kRloo
          ? RlooAdvantages(returns, group_size)
          : GrpoAdvantages(returns, group_size, algorithm.norm_adv_by_std);
  return seq_adv.unsqueeze(1) * m;
}

AggNorm LocalAggNorm(const at::Tensor& loss_mask, int max_new_tokens) {
  AggNorm norm;
  norm.num_tokens = loss_mask.sum().item<double>();
  norm.num_seqs = (loss_mask.sum(1) > 0).sum().item<double>();
  norm.max_len =
      static_cast<double>(std::max<int64_t>(loss_mask.size(1), max_new_tokens));
  return norm;
}

MicroBatchLoss MicroBatchLossOf(
    const AlgorithmConfig& algorithm, const at::Tensor& logp,
    const at::Tensor& old_logp, const at::Tensor& advantages,
    const at::Tensor& loss_mask, const AggNorm& norm, const at::Tensor& weight,
    const at::Tensor& ref_logp, const at::Tensor& entropy) {
  MicroBatchLoss out;
  out.pg = PpoClipLoss(logp, old_logp, advantages, loss_mask,
                       algorithm.clip_ratio_low, algorithm.clip_ratio_high,
                       algorithm.clip_ratio_c, algorithm.loss_agg_mode, norm,
                       weight);
  out.loss = out.pg.loss;
  if (ref_logp.defined()) {
    out.kl_tokens = KlPenalty(logp, ref_logp, algorithm.kl_estimator);
    if (algorithm.kl_mode == KlMode::kLoss) {
      out.loss =
          out.loss + algorithm.kl_coef * AggLoss(out.kl_tokens, loss_mask,
                                                 algorithm.loss_agg_mode, norm);
    }
  }
  if (algorithm.entropy_coef > 0 && entropy.defined()) {
    out.loss = out.loss -
               algorithm.entropy_coef *
                   AggLoss(entropy, loss_mask, algorithm.loss_agg_mode, norm);
  }
  return out;
}

}  // namespace fusionrl::algo
