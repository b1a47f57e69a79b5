#include "engine/train/algorithms.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "engine/kernels/invariant_ops.h"

namespace fusionrl::algo {
namespace {

// `values` where mask != 0 (times the mask), exactly 0 elsewhere, so that
// non-finite garbage on padding (inf log-probs, NaN) cannot leak into sums
// or gradients; `loss * mask` alone would turn inf * 0 into NaN.
at::Tensor MaskedValues(const at::Tensor& values, const at::Tensor& mask) {
  return at::where(mask != 0, values * mask, at::zeros_like(values));
}

// `n` where n > 0, else 1: a denominator that never divides by zero (its
// numerator is then 0, so the quotient is 0 and its gradient finite).
at::Tensor SafeDenominator(const at::Tensor& n) {
  return at::where(n > 0, n, at::ones_like(n));
}

// Mean of `values` over mask != 0 entries; 0 when the mask is empty.
at::Tensor MaskedMean(const at::Tensor& values, const at::Tensor& mask) {
  return InvariantSum(MaskedValues(values, mask)) / SafeDenominator(mask.sum());
}

// The mask in the dtype of `like` (the mask may come as bool or float32).
at::Tensor MaskAs(const at::Tensor& mask, const at::Tensor& like) {
  return mask.to(like.scalar_type());
}

at::Tensor AsFloating(const at::Tensor& t) {
  return t.is_floating_point() ? t : t.to(at::kFloat);
}

// Scores [B] -> [B / group_size, group_size] (group-major layout).
at::Tensor GroupView(const at::Tensor& scores, int group_size) {
  TORCH_CHECK(scores.dim() == 1, "scores must be 1-D [B], got ",
              scores.sizes());
  TORCH_CHECK(group_size >= 1, "group_size must be >= 1, got ", group_size);
  TORCH_CHECK(scores.size(0) % group_size == 0, "batch of ", scores.size(0),
              " scores is not a whole number of groups of ", group_size);
  return scores.reshape({-1, group_size});
}

void CheckSameShape2d(const at::Tensor& a, const char* a_name,
                      const at::Tensor& b, const char* b_name) {
  TORCH_CHECK(a.dim() == 2, a_name, " must be 2-D [B, T], got ", a.sizes());
  TORCH_CHECK(a.sizes() == b.sizes(), a_name, " ", a.sizes(), " and ", b_name,
              " ", b.sizes(), " must have the same shape");
}

}  // namespace

at::Tensor AggLoss(const at::Tensor& loss_mat, const at::Tensor& mask,
                   AggMode mode, const AggNorm& norm) {
  CheckSameShape2d(loss_mat, "loss_mat", mask, "mask");
  const at::Tensor m = MaskAs(mask, loss_mat);
  const at::Tensor masked = MaskedValues(loss_mat, m);
  // Host-side denominators (never 0: the numerators are 0 in that case).
  const double num_seqs =
      std::max(1.0, norm.num_seqs > 0 ? norm.num_seqs
                                      : static_cast<double>(loss_mat.size(0)));
  const double max_len =
      std::max(1.0, norm.max_len > 0 ? norm.max_len
                                     : static_cast<double>(loss_mat.size(1)));
  switch (mode) {
    case AggMode::kTokenMean: {
      const at::Tensor total = InvariantSum(masked);
      if (norm.num_tokens > 0) return total / norm.num_tokens;
      return total / SafeDenominator(m.sum());
    }
    case AggMode::kSeqMeanTokenMean: {
      const at::Tensor seq_mean = masked.sum(1) / m.sum(1).clamp_min(1.0);
      return InvariantSum(seq_mean) / num_seqs;
    }
    case AggMode::kSeqMeanTokenSum:
      return InvariantSum(masked) / num_seqs;
    case AggMode::kSeqMeanTokenSumNorm:
      return InvariantSum(masked) / (num_seqs * max_len);
  }
  TORCH_CHECK(false, "unknown AggMode ", static_cast<int>(mode));
}

at::Tensor GrpoAdvantages(const at::Tensor& scores, int group_size,
                          bool norm_by_std, double eps) {
  const at::Tensor s = AsFloating(scores);
  const at::Tensor groups = GroupView(s, group_size);
  if (group_size == 1) {
    // verl: a lone response has mean 0 and std 1.
    return norm_by_std ? s / (1.0 + eps) : s.clone();
  }
  const at::Tensor centered = groups - groups.mean(1, /*keepdim=*/true);
  if (!norm_by_std) return centered.reshape({-1});
  const at::Tensor std =
      (centered.square().sum(1, /*keepdim=*/true) / (group_size - 1)).sqrt();
  return (centered / (std + eps)).reshape({-1});
}

at::Tensor RlooAdvantages(const at::Tensor& scores, int group_size) {
  const at::Tensor s = AsFloating(scores);
  const at::Tensor groups = GroupView(s, group_size);
  if (group_size == 1) return at::zeros_like(s);
  const at::Tensor others_mean =
      (groups.sum(1, /*keepdim=*/true) - groups) / (group_size - 1);
  return (groups - others_mean).reshape({-1});
}

at::Tensor MaskedWhiten(const at::Tensor& values, const at::Tensor& mask,
                        double eps) {
  TORCH_CHECK(values.sizes() == mask.sizes(), "values ", values.sizes(),
              " and mask ", mask.sizes(), " must have the same shape");
  const at::Tensor m = MaskAs(mask, values);
  const at::Tensor n = m.sum();
  const at::Tensor mean =
      InvariantSum(MaskedValues(values, m)) / SafeDenominator(n);
  const at::Tensor centered = values - mean;
  const at::Tensor biased_var =
      InvariantSum(MaskedValues(centered.square(), m)) / SafeDenominator(n);
  // Bessel's correction n / (n - 1). With fewer than 2 valid entries verl
  // raises; here the biased variance (0) is kept, so the result is 0.
  const at::Tensor var = biased_var * n / SafeDenominator(n - 1);
  const at::Tensor whitened = centered * at::rsqrt(var + eps);
  return at::where(m != 0, whitened, at::zeros_like(whitened));
}

at::Tensor ReinforcePlusPlusAdvantages(const at::Tensor& token_rewards,
                                       const at::Tensor& token_mask,
                                       const at::Tensor& episode_mask,
                                       double gamma) {
  CheckSameShape2d(token_rewards, "token_rewards", token_mask, "token_mask");
  CheckSameShape2d(token_rewards, "token_rewards", episode_mask,
                   "episode_mask");
  const at::Tensor m = MaskAs(token_mask, token_rewards);
  const at::Tensor e = MaskAs(episode_mask, token_rewards);
  const at::Tensor rewards = MaskedValues(token_rewards, e);
  const int64_t num_steps = rewards.size(1);
  if (num_steps == 0) return at::zeros_like(rewards);
  std::vector<at::Tensor> returns(static_cast<size_t>(num_steps));
  at::Tensor running = at::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = num_steps - 1; t >= 0; --t) {
    // A policy token discounts what follows; an environment token passes it
    // on; padding (past the episode) starts from 0.
    const at::Tensor model = m.select(1, t);
    const at::Tensor inside = e.select(1, t);
    const at::Tensor discount = model * gamma + (1.0 - model);
    running = (rewards.select(1, t) + discount * running) * inside;
    returns[static_cast<size_t>(t)] = running;
  }
  return MaskedWhiten(at::stack(returns, 1), m);
}

at::Tensor KlPenalty(const at::Tensor& logp, const at::Tensor& ref_logp,
                     KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kK1:
      return logp - ref_logp;
    case KlEstimator::kK2:
      return 0.5 * (logp - ref_logp).square();
    case KlEstimator::kK3: {
      // verl's "low_var_kl": clamps keep exp() finite and the value bounded.
      const at::Tensor log_ratio = at::clamp(ref_logp - logp, -20.0, 20.0);
      return at::clamp(at::exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0);
    }
  }
  TORCH_CHECK(false, "unknown KlEstimator ", static_cast<int>(estimator));
}

at::Tensor EntropyFromLogits(const at::Tensor& logits) {
  const at::Tensor probs = at::softmax(logits, -1);
  return at::logsumexp(logits, {-1}) - (probs * logits).sum(-1);
}

PolicyLossResult PpoClipLoss(const at::Tensor& logp, const at::Tensor& old_logp,
                             const at::Tensor& advantages,
                             const at::Tensor& mask, double clip_low,
                             double clip_high, double clip_c, AggMode mode,
                             const AggNorm& norm,
                             const at::Tensor& token_weight) {
  CheckSameShape2d(logp, "logp", old_logp, "old_logp");
  CheckSameShape2d(logp, "logp", advantages, "advantages");
  CheckSameShape2d(logp, "logp", mask, "mask");
  const at::Tensor m = MaskAs(mask, logp);
  const at::Tensor log_ratio = at::clamp(logp - old_logp, -20.0, 20.0);
  const at::Tensor ratio = at::exp(log_ratio);
  const at::Tensor l1 = -advantages * ratio;
  const at::Tensor l2 =
      -advantages * at::clamp(ratio, 1.0 - clip_low, 1.0 + clip_high);
  const at::Tensor l_clip = at::maximum(l1, l2);
  const bool dual_clip = clip_c > 1.0;
  const at::Tensor negative_adv = advantages < 0;
  at::Tensor per_token = l_clip;
  at::Tensor l3;
  if (dual_clip) {
    l3 = -advantages * clip_c;
    per_token = at::where(negative_adv, at::minimum(l3, l_clip), l_clip);
  }

  if (token_weight.defined()) {
    CheckSameShape2d(logp, "logp", token_weight, "token_weight");
    per_token = per_token * token_weight.detach();
  }

  PolicyLossResult result;
  result.loss = AggLoss(per_token, m, mode, norm);
  result.per_token = MaskedValues(per_token, m);
  // Metrics: per-call token means over the mask, outside the graph.
  const at::Tensor md = m.detach();
  const at::Tensor clipped = (l2.detach() > l1.detach()).to(md.scalar_type());
  result.clip_frac = MaskedMean(clipped, md);
  if (dual_clip) {
    const at::Tensor dual =
        at::logical_and(negative_adv, l_clip.detach() > l3.detach())
            .to(md.scalar_type());
    result.dual_clip_frac = MaskedMean(dual, md);
  } else {
    result.dual_clip_frac = at::zeros({}, md.options());
  }
  result.approx_kl = MaskedMean(-log_ratio.detach(), md);
  return result;
}

BehaviourWeightRule BehaviourWeightRuleOf(const AlgorithmConfig& a) {
  const double cap = a.rollout_correction_cap;
  switch (a.rollout_correction) {
    case RolloutCorrection::kTis:
      return {WeightLevel::kToken, cap, 0.0, BehaviourWeightMode::kTruncate};
    case RolloutCorrection::kMis:
      return {WeightLevel::kToken, cap, 1.0 / cap, BehaviourWeightMode::kMask};
    case RolloutCorrection::kNone:
      break;
  }
  return {a.behaviour_weight_level, a.behaviour_weight_cap, 0.0,
          a.behaviour_weight_mode};
}

LogProbDiff MaskedLogProbDiff(const at::Tensor& a, const at::Tensor& b,
                              const at::Tensor& mask) {
  CheckSameShape2d(a, "a", b, "b");
  CheckSameShape2d(a, "a", mask, "mask");
  const at::Tensor m = MaskAs(mask, a).detach();
  const at::Tensor d = ((a - b).detach().abs() * m);
  LogProbDiff out;
  out.tokens = m.sum().item<double>();
  if (out.tokens > 0) {
    out.sum = d.sum().item<double>();
    out.max = d.max().item<double>();
  }
  return out;
}

double OverlongPenalty(int64_t length, int max_new_tokens, int buffer,
                       double penalty) {
  const int64_t start = static_cast<int64_t>(max_new_tokens) - buffer;
  if (buffer <= 0 || length <= start) return 0.0;
  if (length >= max_new_tokens) return penalty;
  return penalty * static_cast<double>(length - start) /
         static_cast<double>(buffer);
}

int OverlongBuffer(int max_new_tokens, int configured) {
  return configured > 0 ? configured : std::max(1, max_new_tokens / 5);
}

at::Tensor BehaviourWeights(const at::Tensor& prox_logp,
                            const at::Tensor& behaviour_logp,
                            const at::Tensor& mask,
                            const BehaviourWeightRule& rule, double* capped) {
  const WeightLevel level = rule.level;
  const double cap = rule.cap;
  const BehaviourWeightMode mode = rule.mode;
  CheckSameShape2d(prox_logp, "prox_logp", behaviour_logp, "behaviour_logp");
  CheckSameShape2d(prox_logp, "prox_logp", mask, "mask");
  const at::Tensor m = MaskAs(mask, prox_logp).detach();
  at::Tensor d =
      at::clamp((prox_logp - behaviour_logp).detach() * m, -20.0, 20.0);
  at::Tensor raw;
  if (level == WeightLevel::kToken) {
    raw = at::exp(d);
  } else {
    raw = at::exp(at::clamp(d.sum(1, /*keepdim=*/true), -20.0, 20.0))
              .expand_as(d);
  }
  // Written as !(raw <= cap) so that a NaN weight counts as over the cap.
  at::Tensor over = at::logical_not(raw <= cap);
  if (rule.floor > 0 && mode == BehaviourWeightMode::kMask) {
    over = at::logical_or(over, raw < rule.floor);
  }
  at::Tensor w;
  switch (mode) {
    case BehaviourWeightMode::kTruncate:
      w = at::clamp_max(raw, cap);
      break;
    case BehaviourWeightMode::kMask:
      w = at::where(over, at::zeros_like(raw), raw);
      break;
  }
  TORCH_CHECK(w.defined(), "unknown BehaviourWeightMode ",
              static_cast<int>(mode));
  w = MaskedValues(w, m);
  if (capped != nullptr) {
    *capped = MaskedMean(over.to(m.scalar_type()), m).item<double>();
  }
  return w;
}

}  // namespace fusionrl::algo
