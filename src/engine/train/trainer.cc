#include "engine/train/trainer.h"

#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/train/activation_planner.h"
#include "engine/train/algorithms.h"
#include "engine/model/expert_parallel.h"
#include "engine/kernels/invariant_ops.h"
#include "engine/train/master_weights.h"
#include "engine/model/moe.h"
#include "engine/train/step_math.h"
#include "engine/train/trainer_batch.h"
#include "engine/kernels/vocab_kernels.h"

namespace fusionrl {

AdamWSettings AdamWSettingsOf(const OptimConfig& optim, double lr) {
  AdamWSettings s;
  s.lr = lr;
  s.beta1 = optim.beta1;
  s.beta2 = optim.beta2;
  s.eps = optim.eps;
  s.weight_decay = optim.weight_decay;
  return s;
}

double LearningRateAt(const OptimConfig& optim, int64_t step) {
  if (optim.warmup_steps > 0 && step < optim.warmup_steps) {
    return optim.lr * static_cast<double>(step + 1) / optim.warmup_steps;
  }
  return optim.lr;
}

struct Trainer::Optim {
  std::unique_ptr<MasterWeightAdamW> adamw;
};

Trainer::Trainer(PolicyModel& policy, PolicyModel* reference,
                 const JobConfig& config, int pad_id, GradientSync* sync)
    : policy_(policy),
      reference_(reference),
      algo_(config.algorithm),
      optim_(config.optim),
      group_size_(config.rollout.group_size),
      temperature_(config.rollout.temperature > 0 ? config.rollout.temperature
                                                  : 1.0),
      pad_id_(pad_id),
      rollout_(config.rollout),
      logits_chunk_tokens_(config.optim.logits_chunk_tokens),
      sync_(sync) {}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    PolicyModel& policy, PolicyModel* reference, const JobConfig& config,
    int pad_id, GradientSync* sync) {
  if (config.algorithm.kl_coef > 0 && reference == nullptr) {
    return absl::InvalidArgumentError(
        "algorithm.kl_coef > 0 needs a reference policy");
  }
  auto optim = std::make_unique<Optim>();
  const auto& o = config.optim;
  // With LoRA the optimizer holds the adapters only (float32: no masters).
  optim->adamw = std::make_unique<MasterWeightAdamW>(
      policy.trainable_parameters(), AdamWSettingsOf(o, o.lr));
  // model.activations.policy auto: plan for the largest micro-batch.
  FUSIONRL_RETURN_IF_ERROR(
      PlanActivationsForJob(policy,
                            std::max<int64_t>(1, config.optim.micro_batch_size))
          .status());
  FUSIONRL_RETURN_IF_ERROR(ShareActivationPlan(policy));
  std::unique_ptr<Trainer> trainer(
      new Trainer(policy, reference, config, pad_id, sync));
  trainer->optim_state_ = std::move(optim);
  return trainer;
}

torch::optim::AdamW& Trainer::optimizer() {
  return optim_state_->adamw->adamw();
}
const torch::optim::AdamW& Trainer::optimizer() const {
  return optim_state_->adamw->adamw();
}
MasterWeightAdamW& Trainer::master_weights() { return *optim_state_->adamw; }
const MasterWeightAdamW& Trainer::master_weights() const {
  return *optim_state_->adamw;
}

absl::StatusOr<TrainStats> Trainer::Step(const std::vector<Sample>& samples) {
  const int64_t batch = static_cast<int64_t>(samples.size());
  if (batch == 0 || batch % group_size_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: batch of ", batch,
                     " samples is not a positive multiple of "
                     "rollout.group_size (",
                     group_size_, ")"));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].response_ids.empty() || samples[i].prompt_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer: sample ", i, " has an empty prompt or response"));
    }
  }
  if (sync_ != nullptr) {
    // Every rank must take the same number of optimizer steps: equal shards.
    // The sum is global, so all ranks reach the same verdict.
    std::vector<double> sizes = {static_cast<double>(batch)};
    FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_, sizes));
    if (sizes[0] != static_cast<double>(batch) * sync_->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer: data-parallel ranks hold shards of different sizes (",
          sizes[0], " samples over ", sync_->world_size(), " ranks; this rank ",
          batch, ")"));
    }
  }
  const auto device = policy_.device();
  CollatedBatch full = Collate(samples, pad_id_, device);
  FUSIONRL_ASSIGN_OR_RETURN(full.routes,
                            CollateRoutes(samples, full, policy_.config()));
  // Router replay: the policy's forwards of a batch route its tokens as the
  // rollout did (the reference's do not: it is another policy).
  const bool replay = algo_.router_replay && full.routes.defined();
  policy_.set_record_routes(full.routes.defined());
  auto policy_log_probs = [&](const CollatedBatch& b, bool with_entropy) {
    if (replay) policy_.SetRouteReplay(b.routes);
    absl::Cleanup clear = [&] {
      if (replay) policy_.SetRouteReplay(at::Tensor());
    };
    return ResponseTokenLogProbs(policy_, b, temperature_, logits_chunk_tokens_,
                                 with_entropy);
  };
  TrainStats stats;
  // Rewards and masks as trained (rollout.overlong applied): a response cut
  // at max_new_tokens keeps its reward in its group's statistics and leaves
  // only the loss (mask), or loses reward on the length ramp (penalize).
  const algo::StepRewards step = algo::PrepareStepRewards(
      samples, rollout_, at::TensorOptions().dtype(at::kFloat).device(device));
  stats.overlong_frac = step.trained > 0 ? static_cast<double>(step.cut) /
                                               static_cast<double>(step.trained)
                                         : 0.0;
  stats.overlong_penalty_mean =
      step.trained > 0 ? step.penalty_sum / static_cast<double>(step.trained)
                       : 0.0;
  full.response_mask = step.loss_mask;
  const auto& mask = full.response_mask;
  const int64_t r_len = mask.size(1);
  const bool use_kl = algo_.kl_coef > 0 && reference_ != nullptr;

  // Reference log-probs (no grad), needed for either KL mode.
  at::Tensor ref_logp;
  if (use_kl) {
    at::NoGradGuard no_grad;
    if (compute_hook_) compute_hook_();
    reference_->set_training(false);
    ref_logp = ResponseTokenLogProbs(*reference_, full, temperature_,
                                     logits_chunk_tokens_, false)
                   .logp;
  }

  // Decoupled PPO: the proximal policy is this step's starting weights,
  // recomputed here (the samples may come from an older behaviour policy);
  // the ratio is taken against it and each token is weighted by the
  // behaviour importance weight (truncated or masked at the cap). Otherwise
  // the behaviour log-probs are the proximal ones (synchronous on-policy RL:
  // a policy lag > 0 requires the decoupled loss, config validation).
  at::Tensor old_logp = full.behaviour_logp;
  at::Tensor behaviour_weight;
  const algo::BehaviourWeightRule rule = algo::BehaviourWeightRuleOf(algo_);
  const bool recompute = algo_.RecomputesProximal();
  const int64_t mini = optim_.mini_batch_size > 0
                           ? std::min<int64_t>(optim_.mini_batch_size, batch)
                           : batch;
  const bool kl_in_reward = use_kl && algo_.kl_mode == KlMode::kReward;
  // With one optimizer update per step (one epoch, one mini-batch) the
  // proximal policy is exactly the weights the training forward pass runs
  // with: its log-probs (detached) are the proximal ones, and the separate
  // no-grad recomputation is skipped. Not with the KL as a reward penalty:
  // the rewards (and advantages) need the proximal log-probs before the
  // first training forward.
  const bool prox_in_forward =
      recompute && algo_.ppo_epochs == 1 && mini == batch && !kl_in_reward;
  double weight_sum = 0, capped_sum = 0;
  if (recompute && !prox_in_forward) {
    at::NoGradGuard no_grad;
    if (compute_hook_) compute_hook_();
    policy_.set_training(false);
    old_logp = policy_log_probs(full, false).logp;
    double capped = 0;
    behaviour_weight = algo::BehaviourWeights(old_logp, full.behaviour_logp,
                                              mask, rule, &capped);
    stats.behaviour_weight_mean = MaskedMean(behaviour_weight, mask);
    stats.behaviour_weight_truncated = capped;
  }

  // Advantages (no grad). The KL as a reward penalty is the proximal
  // policy's (the trainer's weights at the step's start, as the loss-mode
  // KL measures the trainer's policy), not the behaviour policy's: with a
  // policy lag the samples' log-probs are those of a stale policy. Without
  // the decoupled loss old_logp is the behaviour log-probs, which are the
  // proximal ones there (no lag).
  at::Tensor advantages;
  {
    at::NoGradGuard no_grad;
    advantages = algo::StepAdvantages(
        algo_, group_size_, step,
        kl_in_reward ? algo::KlPenalty(old_logp, ref_logp, algo_.kl_estimator)
                     : at::Tensor());
  }

  stats.advantage_abs_mean = MaskedMean(advantages.abs(), mask);
  stats.tokens = static_cast<int64_t>(mask.sum().item<double>());
  const int64_t micro = std::max<int64_t>(1, optim_.micro_batch_size);

  // Length-bucketed micro-batches: within each mini-batch the sequences are
  // ordered longest first, and each micro-batch is trimmed to its own
  // longest prompt and response, so short sequences stop paying for the
  // padding of a long tail. Every loss term is a sum over tokens normalised
  // by the mini-batch's totals, so the order of sequences within a
  // mini-batch changes nothing but float rounding; the mini-batches (the
  // optimizer steps) keep their samples.
  std::vector<int64_t> p_lens(batch), r_lens(batch);
  for (int64_t b = 0; b < batch; ++b) {
    p_lens[b] = static_cast<int64_t>(samples[b].prompt_ids.size());
    r_lens[b] = static_cast<int64_t>(samples[b].response_ids.size());
  }
  CollatedBatch work = full;
  // Not for a MoE policy: capacity drops depend on which tokens share a
  // forward, so its micro-batches keep their samples (trimmed only).
  if (optim_.length_bucketing && micro < mini &&
      policy_.config().moe_experts == 0) {
    std::vector<int64_t> order(batch);
    std::iota(order.begin(), order.end(), 0);
    for (int64_t m0 = 0; m0 < batch; m0 += mini) {
      std::stable_sort(order.begin() + m0,
                       order.begin() + std::min(batch, m0 + mini),
                       [&](int64_t a, int64_t b) {
                         return p_lens[a] + r_lens[a] > p_lens[b] + r_lens[b];
                       });
    }
    if (!std::is_sorted(order.begin(), order.end())) {
      const at::Tensor index =
          at::tensor(order, at::TensorOptions().dtype(at::kLong)).to(device);
      work = Rows(full, index);
      advantages = advantages.index_select(0, index);
      old_logp = old_logp.index_select(0, index);
      if (behaviour_weight.defined()) {
        behaviour_weight = behaviour_weight.index_select(0, index);
      }
      if (ref_logp.defined()) ref_logp = ref_logp.index_select(0, index);
      std::vector<int64_t> p(batch), r(batch);
      for (int64_t i = 0; i < batch; ++i) {
        p[i] = p_lens[order[i]];
        r[i] = r_lens[order[i]];
      }
      p_lens.swap(p);
      r_lens.swap(r);
    }
  }
  auto& adamw = *optim_state_->adamw;
  policy_.set_training(true);
  double loss_sum = 0, pg_sum = 0, kl_sum = 0, ent_sum = 0, clip_sum = 0;
  double token_weight = 0;
  double diff_sum = 0, diff_tokens = 0;
  double route_tokens = 0, route_differing = 0;
  // MoE router statistics, summed weighted by micro-batch sequences.
  const bool moe = policy_.config().moe_experts > 0;
  double moe_seqs = 0, moe_aux_sum = 0, moe_z_sum = 0, moe_drop_sum = 0;
  std::vector<double> moe_load_sum(policy_.config().moe_experts, 0.0);
  for (int epoch = 0; epoch < algo_.ppo_epochs; ++epoch) {
    for (int64_t m0 = 0; m0 < batch; m0 += mini) {
      const int64_t m_n = std::min(mini, batch - m0);
      // Loss normalisers of the whole (global) mini-batch: its tokens and
      // sequences summed over the data-parallel ranks (algo::LocalAggNorm).
      algo::AggNorm norm = algo::LocalAggNorm(
          work.response_mask.narrow(0, m0, m_n), rollout_.max_new_tokens);
      std::vector<double> totals = {norm.num_tokens, norm.num_seqs};
      FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_, totals));
      norm.num_tokens = totals[0];
      norm.num_seqs = totals[1];
      // A mini-batch without a trained token (every sample excluded, e.g.
      // over-stale groups dropped) has nothing to learn from and takes no
      // optimizer step: an AdamW step on zero gradients would still move the
      // weights (decoupled weight decay, the moments of earlier steps) and
      // advance AdamW's step count and the warm-up schedule
      // (optimizer_steps_, LearningRateAt). Skipped, the parameters and the
      // optimizer state stay bit-identical, the next real step gets the
      // learning rate this one would have had, and the policy version still
      // advances once per Step(). `totals` are summed over the ranks, so
      // every rank of a data-parallel group skips alike. With gradients
      // exchanged the collective is still joined (with zero gradients; with
      // StaleSync clock skew `totals` cover only this super node while the
      // exchange spans the super nodes), and the step is skipped only if
      // the combined gradient is zero too (peers' updates are applied).
      const bool trained = totals[0] > 0;
      const bool exchanges = sync_ != nullptr && sync_->ExchangesGradients();
      if (!trained && !exchanges) continue;
      adamw.ZeroGrad();
      double mini_loss = 0;
      for (int64_t u0 = m0; trained && u0 < m0 + m_n; u0 += micro) {
        const int64_t u_n = std::min(micro, m0 + m_n - u0);
        if (compute_hook_) compute_hook_();
        int64_t mb_p = work.prompt_len, mb_r = r_len;
        if (optim_.length_bucketing) {
          mb_p = mb_r = 1;
          for (int64_t i = u0; i < u0 + u_n; ++i) {
            mb_p = std::max(mb_p, p_lens[i]);
            mb_r = std::max(mb_r, r_lens[i]);
          }
        }
        const CollatedBatch mb = Trim(Slice(work, u0, u_n), mb_p, mb_r);
        if (epoch == 0) stats.computed_tokens += u_n * (mb_p + mb_r);
        auto rows = [&](const at::Tensor& t) {
          return t.narrow(0, u0, u_n).narrow(1, 0, mb_r);
        };
        const auto adv = rows(advantages);
        const bool entropy_grad = algo_.entropy_coef > 0;
        // LoRA dropout: masks a function of the step and the micro-batch
        // (reproducible, and equal in a recomputed forward).
        policy_.set_lora_dropout_seed((static_cast<uint64_t>(version_) << 32) ^
                                      (static_cast<uint64_t>(epoch) << 24) ^
                                      static_cast<uint64_t>(u0));
        ResponseTokenStats tok = policy_log_probs(mb, true);
        const at::Tensor& logp = tok.logp;
        at::Tensor old_mb = rows(old_logp);
        at::Tensor weight_mb =
            behaviour_weight.defined() ? rows(behaviour_weight) : at::Tensor();
        if (prox_in_forward) {
          at::NoGradGuard no_grad;
          old_mb = logp.detach();
          double capped = 0;
          weight_mb = algo::BehaviourWeights(old_mb, mb.behaviour_logp,
                                             mb.response_mask, rule, &capped);
          const double n = mb.response_mask.sum().item<double>();
          weight_sum += MaskedMean(weight_mb, mb.response_mask) * n;
          capped_sum += capped * n;
        }
        if (epoch == 0 && m0 == 0) {
          // The trainer's log-probs of the weights that (in a synchronous
          // step) sampled these tokens, against the rollout engine's.
          at::NoGradGuard no_grad;
          const algo::LogProbDiff d = algo::MaskedLogProbDiff(
              logp.detach(), mb.behaviour_logp, mb.response_mask);
          diff_sum += d.sum;
          diff_tokens += d.tokens;
          stats.logp_diff_max = std::max(stats.logp_diff_max, d.max);
          // The experts the trainer ran each recorded token on, against the
          // rollout's.
          if (mb.routes.defined()) {
            const RouteAgreement a =
                CompareRoutes(policy_.last_routes(), mb.routes);
            route_tokens += a.tokens;
            route_differing += a.differing;
          }
        }
        const algo::MicroBatchLoss parts = algo::MicroBatchLossOf(
            algo_, logp, old_mb, adv, mb.response_mask, norm, weight_mb,
            use_kl ? rows(ref_logp) : at::Tensor(),
            entropy_grad ? tok.entropy : at::Tensor());
        const algo::PolicyLossResult& pg = parts.pg;
        at::Tensor loss = parts.loss;
        const double mb_tokens = mb.response_mask.sum().item<double>();
        if (use_kl) {
          kl_sum += MaskedMean(parts.kl_tokens.detach(), mb.response_mask) *
                    mb_tokens;
        }
        {
          at::NoGradGuard no_grad;
          ent_sum +=
              MaskedMean(tok.entropy.detach(), mb.response_mask) * mb_tokens;
        }
        if (moe) {
          // Once per micro-batch, weighted by its share of the (global)
          // mini-batch's trained sequences, so accumulation gives the mean.
          const double mb_seqs =
              (mb.response_mask.sum(1) > 0).sum().item<double>();
          if (mb_seqs > 0) {
            loss = loss + policy_.AuxLoss() * (mb_seqs / norm.num_seqs);
          }
          const MoeStats ms = policy_.moe_stats();
          const double w = static_cast<double>(u_n);
          moe_seqs += w;
          moe_aux_sum += ms.aux_loss * w;
          moe_z_sum += ms.z_loss * w;
          moe_drop_sum += ms.dropped_frac * w;
          for (size_t e = 0; e < ms.expert_load.size(); ++e) {
            moe_load_sum[e] += ms.expert_load[e] * w;
          }
        }
        loss.backward();
        mini_loss += loss.item<double>();
        pg_sum +=
            pg.loss.item<double>();  // micro parts add up to the mini loss
        clip_sum += pg.clip_frac.item<double>() * mb_tokens;
        token_weight += mb_tokens;
      }
      const ExpertShard& shard = policy_.expert_shard();
      if (sync_ != nullptr && sync_->ExchangesGradients()) {
        // Expert parallelism: an expert's gradient already sums the tokens
        // of every rank of its group (the exchange's backward); the
        // data-parallel sum adds the other groups' (zeros for the experts a
        // rank does not hold), and leaves experts out when one group spans
        // every rank and no other super node's update is added.
        std::vector<at::Tensor> grads = DataParallelGradients(
            policy_, shard.size > 1 && (sync_->world_size() > shard.size ||
                                        sync_->AddsOtherNodesUpdates()));
        FUSIONRL_RETURN_IF_ERROR(sync_->ReduceGradients(grads));
        if (!trained) {
          at::NoGradGuard no_grad;
          bool any_update = false;
          for (const at::Tensor& g : grads) {
            any_update = any_update || g.ne(0).any().item<bool>();
          }
          if (!any_update) continue;
        }
      }
      // Clipped and stepped in float32 (the masters of a bf16 policy). The
      // norm is a thread-count-invariant sum (engine/kernels/invariant_ops.h).
      adamw.GradientsToMasters();
      double grad_norm = 0;
      if (shard.size > 1) {
        // The whole model's norm: every shard's experts count.
        FUSIONRL_ASSIGN_OR_RETURN(grad_norm,
                                  ShardedGradNorm(policy_, adamw.stepped()));
        ClipGradsToNorm(adamw.stepped(), grad_norm, optim_.grad_clip);
      } else {
        grad_norm = InvariantClipGradNorm(adamw.stepped(), optim_.grad_clip);
      }
      if (!std::isfinite(grad_norm)) {
        return absl::InternalError(
            absl::StrCat("trainer: non-finite gradient norm at policy version ",
                         version_, " (loss ", mini_loss,
                         "); lower optim.lr or enable optim.grad_clip"));
      }
      const double lr = LearningRateAt(optim_, optimizer_steps_);
      adamw.SetLearningRate(lr);
      adamw.Step();
      ++optimizer_steps_;
      ++stats.optimizer_steps;
      loss_sum += mini_loss;
      stats.grad_norm = grad_norm;
      stats.lr = lr;
    }
  }
  const double tw = std::max(1.0, token_weight);
  stats.loss = loss_sum / std::max(1, stats.optimizer_steps);
  stats.pg_loss = pg_sum / std::max(1, stats.optimizer_steps);
  stats.kl = kl_sum / tw;
  stats.entropy = ent_sum / tw;
  stats.clip_frac = clip_sum / tw;
  stats.logp_diff_mean = diff_tokens > 0 ? diff_sum / diff_tokens : 0.0;
  if (prox_in_forward) {
    stats.behaviour_weight_mean = weight_sum / tw;
    stats.behaviour_weight_truncated = capped_sum / tw;
  }
  if (moe && moe_seqs > 0) {
    stats.moe_aux_loss = moe_aux_sum / moe_seqs;
    stats.moe_z_loss = moe_z_sum / moe_seqs;
    stats.moe_dropped_frac = moe_drop_sum / moe_seqs;
    for (double& l : moe_load_sum) l /= moe_seqs;
    stats.moe_expert_load = std::move(moe_load_sum);
    stats.moe_group_load =
        moe::GroupLoads(stats.moe_expert_load, policy_.config().moe_groups);
  }
  if (route_tokens > 0) {
    stats.moe_route_disagreement = route_differing / route_tokens;
  }
  ++version_;
  return stats;
}

absl::Status Trainer::SaveOptimizer(const std::string& path) const {
  try {
    torch::serialize::OutputArchive archive;
    optim_state_->adamw->Save(archive);
    archive.write("optimizer_steps", at::tensor(optimizer_steps_));
    archive.save_to(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot write optimizer state to '",
                                            path,
                                            "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::LoadOptimizer(const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    optim_state_->adamw->Load(archive);
    at::Tensor steps;
    archive.read("optimizer_steps", steps);
    optimizer_steps_ = steps.item<int64_t>();
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("cannot read optimizer state from '", path,
                     "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Trainer::OptimizerState() const {
  try {
    torch::serialize::OutputArchive archive;
    optim_state_->adamw->Save(archive);
    archive.write("optimizer_steps", at::tensor(optimizer_steps_));
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot snapshot optimizer: ",
                                            e.what_without_backtrace()));
  }
}

absl::Status Trainer::RestoreOptimizerState(const std::string& bytes) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(bytes);
    archive.load_from(in);
    optim_state_->adamw->Load(archive);
    at::Tensor steps;
    archive.read("optimizer_steps", steps);
    optimizer_steps_ = steps.item<int64_t>();
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("cannot restore optimizer: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace fusionrl
