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
#include "engine/kernels/invariant_ops.h"
#include "engine/kernels/vocab_kernels.h"
#include "engine/model/expert_parallel.h"
#include "engine/model/moe.h"
#include "engine/train/activation_planner.h"
#include "engine/train/algorithms.h"
#include "engine/train/master_weights.h"
#include "engine/train/step_math.h"
#include "engine/train/trainer_batch.h"

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

// A step's batch as trained (steps 1 and 2): the collated tensors and each
// token's inputs to the loss, rows in the order the micro-batches take them
// (length bucketing may reorder the rows within a mini-batch).
struct Trainer::StepBatch {
  CollatedBatch work;   // response_mask is the loss mask (rollout.overlong)
  int64_t size = 0;     // samples on this rank
  int64_t mini = 0;     // samples per mini-batch (one optimizer step)
  int64_t micro = 0;    // samples per micro-batch (gradient accumulation)
  bool replay = false;  // router replay in the policy's forwards
  bool use_kl = false;  // kl_coef > 0 with a reference policy
  // Proximal log-probs taken (detached) from the training forward itself.
  bool prox_in_forward = false;
  algo::BehaviourWeightRule rule;
  at::Tensor advantages;        // [B, R]
  at::Tensor old_logp;          // proximal log-probs [B, R]
  at::Tensor behaviour_weight;  // [B, R]; defined when recomputed up front
  at::Tensor ref_logp;          // [B, R]; defined when use_kl
  std::vector<int64_t> p_lens, r_lens;  // each row's prompt, response length
};

// One mini-batch of one epoch (step 3): its rows, its global loss
// normalisers, and its loss summed over the micro-batches.
struct Trainer::MiniBatch {
  int epoch = 0;
  int64_t start = 0;  // first row
  int64_t rows = 0;
  algo::AggNorm norm;
  double loss = 0;
};

// Running sums over a step's micro-batches and optimizer steps, turned into
// TrainStats' means by FinishStats.
struct Trainer::StepTally {
  explicit StepTally(int64_t experts) : moe_load_sum(experts, 0.0) {}
  double loss_sum = 0, pg_sum = 0;  // per optimizer step
  // Token-weighted (by each micro-batch's trained tokens).
  double kl_sum = 0, ent_sum = 0, clip_sum = 0, token_weight = 0;
  double weight_sum = 0, capped_sum = 0;  // prox_in_forward only
  // The rollout/trainer mismatch of the first mini-batch.
  double diff_sum = 0, diff_tokens = 0;
  double route_tokens = 0, route_differing = 0;
  // MoE router statistics, weighted by micro-batch sequences.
  double moe_seqs = 0, moe_aux_sum = 0, moe_z_sum = 0, moe_drop_sum = 0;
  std::vector<double> moe_load_sum;
};

absl::StatusOr<TrainStats> Trainer::Step(const std::vector<Sample>& samples) {
  FUSIONRL_RETURN_IF_ERROR(CheckBatch(samples));
  TrainStats stats;
  // Steps 1 and 2: collate, rewards, advantages (and the proximal and
  // reference log-probs they need).
  FUSIONRL_ASSIGN_OR_RETURN(StepBatch batch, PrepareBatch(samples, stats));
  BucketByLength(batch);
  // Steps 3 and 4: epochs of mini-batches, one optimizer step each.
  StepTally tally(policy_.config().moe_experts);
  policy_.set_training(true);
  for (int epoch = 0; epoch < algo_.ppo_epochs; ++epoch) {
    for (int64_t m0 = 0; m0 < batch.size; m0 += batch.mini) {
      FUSIONRL_RETURN_IF_ERROR(TrainMiniBatch(batch, epoch, m0, tally, stats));
    }
  }
  FinishStats(batch, tally, stats);
  ++version_;
  return stats;
}

absl::Status Trainer::CheckBatch(const std::vector<Sample>& samples) {
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
  if (sync_ == nullptr) return absl::OkStatus();
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
  return absl::OkStatus();
}

ResponseTokenStats Trainer::PolicyLogProbs(const CollatedBatch& b,
                                           bool with_entropy, bool replay) {
  if (replay) policy_.SetRouteReplay(b.routes);
  absl::Cleanup clear = [&] {
    if (replay) policy_.SetRouteReplay(at::Tensor());
  };
  return ResponseTokenLogProbs(policy_, b, temperature_, logits_chunk_tokens_,
                               with_entropy);
}

absl::StatusOr<Trainer::StepBatch> Trainer::PrepareBatch(
    const std::vector<Sample>& samples, TrainStats& stats) {
  StepBatch b;
  b.size = static_cast<int64_t>(samples.size());
  const auto device = policy_.device();
  b.work = Collate(samples, pad_id_, device);
  FUSIONRL_ASSIGN_OR_RETURN(b.work.routes,
                            CollateRoutes(samples, b.work, policy_.config()));
  // Router replay: the policy's forwards of a batch route its tokens as the
  // rollout did (the reference's do not: it is another policy).
  b.replay = algo_.router_replay && b.work.routes.defined();
  policy_.set_record_routes(b.work.routes.defined());
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
  b.work.response_mask = step.loss_mask;
  b.use_kl = algo_.kl_coef > 0 && reference_ != nullptr;
  if (b.use_kl) b.ref_logp = ReferenceLogProbs(b.work);

  // Decoupled PPO: the proximal policy is this step's starting weights,
  // recomputed here (the samples may come from an older behaviour policy);
  // the ratio is taken against it and each token is weighted by the
  // behaviour importance weight (truncated or masked at the cap). Otherwise
  // the behaviour log-probs are the proximal ones (synchronous on-policy RL:
  // a policy lag > 0 requires the decoupled loss, config validation).
  b.old_logp = b.work.behaviour_logp;
  b.rule = algo::BehaviourWeightRuleOf(algo_);
  const bool recompute = algo_.RecomputesProximal();
  b.mini = optim_.mini_batch_size > 0
               ? std::min<int64_t>(optim_.mini_batch_size, b.size)
               : b.size;
  b.micro = std::max<int64_t>(1, optim_.micro_batch_size);
  const bool kl_in_reward = b.use_kl && algo_.kl_mode == KlMode::kReward;
  // With one optimizer update per step (one epoch, one mini-batch) the
  // proximal policy is exactly the weights the training forward pass runs
  // with: its log-probs (detached) are the proximal ones, and the separate
  // no-grad recomputation is skipped. Not with the KL as a reward penalty:
  // the rewards (and advantages) need the proximal log-probs before the
  // first training forward.
  b.prox_in_forward =
      recompute && algo_.ppo_epochs == 1 && b.mini == b.size && !kl_in_reward;
  if (recompute && !b.prox_in_forward) RecomputeProximal(b, stats);

  // Advantages (no grad). The KL as a reward penalty is the proximal
  // policy's (the trainer's weights at the step's start, as the loss-mode
  // KL measures the trainer's policy), not the behaviour policy's: with a
  // policy lag the samples' log-probs are those of a stale policy. Without
  // the decoupled loss old_logp is the behaviour log-probs, which are the
  // proximal ones there (no lag).
  {
    at::NoGradGuard no_grad;
    b.advantages = algo::StepAdvantages(
        algo_, group_size_, step,
        kl_in_reward
            ? algo::KlPenalty(b.old_logp, b.ref_logp, algo_.kl_estimator)
            : at::Tensor());
  }
  const at::Tensor& mask = b.work.response_mask;
  stats.advantage_abs_mean = MaskedMean(b.advantages.abs(), mask);
  stats.tokens = static_cast<int64_t>(mask.sum().item<double>());
  b.p_lens.resize(b.size);
  b.r_lens.resize(b.size);
  for (int64_t i = 0; i < b.size; ++i) {
    b.p_lens[i] = static_cast<int64_t>(samples[i].prompt_ids.size());
    b.r_lens[i] = static_cast<int64_t>(samples[i].response_ids.size());
  }
  return b;
}

at::Tensor Trainer::ReferenceLogProbs(const CollatedBatch& batch) {
  at::NoGradGuard no_grad;
  if (compute_hook_) compute_hook_();
  reference_->set_training(false);
  return ResponseTokenLogProbs(*reference_, batch, temperature_,
                               logits_chunk_tokens_, false)
      .logp;
}

void Trainer::RecomputeProximal(StepBatch& b, TrainStats& stats) {
  at::NoGradGuard no_grad;
  if (compute_hook_) compute_hook_();
  policy_.set_training(false);
  b.old_logp = PolicyLogProbs(b.work, false, b.replay).logp;
  double capped = 0;
  b.behaviour_weight = algo::BehaviourWeights(
      b.old_logp, b.work.behaviour_logp, b.work.response_mask, b.rule, &capped);
  stats.behaviour_weight_mean =
      MaskedMean(b.behaviour_weight, b.work.response_mask);
  stats.behaviour_weight_truncated = capped;
}

// Length-bucketed micro-batches: within each mini-batch the sequences are
// ordered longest first, and each micro-batch is trimmed to its own
// longest prompt and response, so short sequences stop paying for the
// padding of a long tail. Every loss term is a sum over tokens normalised
// by the mini-batch's totals, so the order of sequences within a
// mini-batch changes nothing but float rounding; the mini-batches (the
// optimizer steps) keep their samples. Not for a MoE policy: capacity drops
// depend on which tokens share a forward, so its micro-batches keep their
// samples (trimmed only).
void Trainer::BucketByLength(StepBatch& b) const {
  if (!optim_.length_bucketing || b.micro >= b.mini ||
      policy_.config().moe_experts != 0) {
    return;
  }
  std::vector<int64_t> order(b.size);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t m0 = 0; m0 < b.size; m0 += b.mini) {
    std::stable_sort(
        order.begin() + m0, order.begin() + std::min(b.size, m0 + b.mini),
        [&](int64_t x, int64_t y) {
          return b.p_lens[x] + b.r_lens[x] > b.p_lens[y] + b.r_lens[y];
        });
  }
  if (std::is_sorted(order.begin(), order.end())) return;
  const at::Tensor index =
      at::tensor(order, at::TensorOptions().dtype(at::kLong))
          .to(policy_.device());
  b.work = Rows(b.work, index);
  b.advantages = b.advantages.index_select(0, index);
  b.old_logp = b.old_logp.index_select(0, index);
  if (b.behaviour_weight.defined()) {
    b.behaviour_weight = b.behaviour_weight.index_select(0, index);
  }
  if (b.ref_logp.defined()) b.ref_logp = b.ref_logp.index_select(0, index);
  std::vector<int64_t> p(b.size), r(b.size);
  for (int64_t i = 0; i < b.size; ++i) {
    p[i] = b.p_lens[order[i]];
    r[i] = b.r_lens[order[i]];
  }
  b.p_lens.swap(p);
  b.r_lens.swap(r);
}

absl::Status Trainer::TrainMiniBatch(const StepBatch& b, int epoch, int64_t m0,
                                     StepTally& tally, TrainStats& stats) {
  MiniBatch mini;
  mini.epoch = epoch;
  mini.start = m0;
  mini.rows = std::min(b.mini, b.size - m0);
  // Loss normalisers of the whole (global) mini-batch: its tokens and
  // sequences summed over the data-parallel ranks (algo::LocalAggNorm).
  mini.norm = algo::LocalAggNorm(b.work.response_mask.narrow(0, m0, mini.rows),
                                 rollout_.max_new_tokens);
  std::vector<double> totals = {mini.norm.num_tokens, mini.norm.num_seqs};
  FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_, totals));
  mini.norm.num_tokens = totals[0];
  mini.norm.num_seqs = totals[1];
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
  if (!trained && !exchanges) return absl::OkStatus();
  optim_state_->adamw->ZeroGrad();
  for (int64_t u0 = m0; trained && u0 < m0 + mini.rows; u0 += b.micro) {
    const int64_t u_n = std::min(b.micro, m0 + mini.rows - u0);
    AccumulateMicroBatch(b, u0, u_n, mini, tally, stats);
  }
  FUSIONRL_ASSIGN_OR_RETURN(const bool any_update, ReduceGradients(trained));
  if (!any_update) return absl::OkStatus();
  return ApplyUpdate(mini, tally, stats);
}

void Trainer::AccumulateMicroBatch(const StepBatch& b, int64_t u0, int64_t u_n,
                                   MiniBatch& mini, StepTally& tally,
                                   TrainStats& stats) {
  if (compute_hook_) compute_hook_();
  int64_t mb_p = b.work.prompt_len, mb_r = b.work.response_mask.size(1);
  if (optim_.length_bucketing) {
    mb_p = mb_r = 1;
    for (int64_t i = u0; i < u0 + u_n; ++i) {
      mb_p = std::max(mb_p, b.p_lens[i]);
      mb_r = std::max(mb_r, b.r_lens[i]);
    }
  }
  const CollatedBatch mb = Trim(Slice(b.work, u0, u_n), mb_p, mb_r);
  if (mini.epoch == 0) stats.computed_tokens += u_n * (mb_p + mb_r);
  auto rows = [&](const at::Tensor& t) {
    return t.narrow(0, u0, u_n).narrow(1, 0, mb_r);
  };
  // LoRA dropout: masks a function of the step and the micro-batch
  // (reproducible, and equal in a recomputed forward).
  policy_.set_lora_dropout_seed((static_cast<uint64_t>(version_) << 32) ^
                                (static_cast<uint64_t>(mini.epoch) << 24) ^
                                static_cast<uint64_t>(u0));
  const ResponseTokenStats tok = PolicyLogProbs(mb, true, b.replay);
  at::Tensor old_mb = rows(b.old_logp);
  at::Tensor weight_mb =
      b.behaviour_weight.defined() ? rows(b.behaviour_weight) : at::Tensor();
  if (b.prox_in_forward) {
    at::NoGradGuard no_grad;
    old_mb = tok.logp.detach();
    double capped = 0;
    weight_mb = algo::BehaviourWeights(old_mb, mb.behaviour_logp,
                                       mb.response_mask, b.rule, &capped);
    const double n = mb.response_mask.sum().item<double>();
    tally.weight_sum += MaskedMean(weight_mb, mb.response_mask) * n;
    tally.capped_sum += capped * n;
  }
  if (mini.epoch == 0 && mini.start == 0) {
    TallyRolloutMismatch(mb, tok.logp, tally, stats);
  }
  const algo::MicroBatchLoss parts = algo::MicroBatchLossOf(
      algo_, tok.logp, old_mb, rows(b.advantages), mb.response_mask, mini.norm,
      weight_mb, b.use_kl ? rows(b.ref_logp) : at::Tensor(),
      algo_.entropy_coef > 0 ? tok.entropy : at::Tensor());
  at::Tensor loss = parts.loss;
  const double mb_tokens = mb.response_mask.sum().item<double>();
  if (b.use_kl) {
    tally.kl_sum +=
        MaskedMean(parts.kl_tokens.detach(), mb.response_mask) * mb_tokens;
  }
  {
    at::NoGradGuard no_grad;
    tally.ent_sum +=
        MaskedMean(tok.entropy.detach(), mb.response_mask) * mb_tokens;
  }
  if (policy_.config().moe_experts > 0) {
    loss = AddRouterLoss(mb, u_n, mini, loss, tally);
  }
  loss.backward();
  mini.loss += loss.item<double>();
  tally.pg_sum += parts.pg.loss.item<double>();  // micro parts add up
  tally.clip_sum += parts.pg.clip_frac.item<double>() * mb_tokens;
  tally.token_weight += mb_tokens;
}

// The trainer's log-probs of the weights that (in a synchronous step)
// sampled these tokens, against the rollout engine's; and the experts the
// trainer ran each recorded token on, against the rollout's.
void Trainer::TallyRolloutMismatch(const CollatedBatch& mb,
                                   const at::Tensor& logp, StepTally& tally,
                                   TrainStats& stats) {
  at::NoGradGuard no_grad;
  const algo::LogProbDiff d = algo::MaskedLogProbDiff(
      logp.detach(), mb.behaviour_logp, mb.response_mask);
  tally.diff_sum += d.sum;
  tally.diff_tokens += d.tokens;
  stats.logp_diff_max = std::max(stats.logp_diff_max, d.max);
  if (mb.routes.defined()) {
    const RouteAgreement a = CompareRoutes(policy_.last_routes(), mb.routes);
    tally.route_tokens += a.tokens;
    tally.route_differing += a.differing;
  }
}

// A MoE policy's router auxiliary loss, once per micro-batch, weighted by its
// share of the (global) mini-batch's trained sequences, so accumulation gives
// the mean; and the router statistics, weighted by the micro-batch's rows.
at::Tensor Trainer::AddRouterLoss(const CollatedBatch& mb, int64_t u_n,
                                  const MiniBatch& mini, at::Tensor loss,
                                  StepTally& tally) {
  const double mb_seqs = (mb.response_mask.sum(1) > 0).sum().item<double>();
  if (mb_seqs > 0) {
    loss = loss + policy_.AuxLoss() * (mb_seqs / mini.norm.num_seqs);
  }
  const MoeStats ms = policy_.moe_stats();
  const double w = static_cast<double>(u_n);
  tally.moe_seqs += w;
  tally.moe_aux_sum += ms.aux_loss * w;
  tally.moe_z_sum += ms.z_loss * w;
  tally.moe_drop_sum += ms.dropped_frac * w;
  for (size_t e = 0; e < ms.expert_load.size(); ++e) {
    tally.moe_load_sum[e] += ms.expert_load[e] * w;
  }
  return loss;
}

absl::StatusOr<bool> Trainer::ReduceGradients(bool trained) {
  if (sync_ == nullptr || !sync_->ExchangesGradients()) return true;
  // Expert parallelism: an expert's gradient already sums the tokens of
  // every rank of its group (the exchange's backward); the data-parallel sum
  // adds the other groups' (zeros for the experts a rank does not hold), and
  // leaves experts out when one group spans every rank and no other super
  // node's update is added.
  const ExpertShard& shard = policy_.expert_shard();
  std::vector<at::Tensor> grads = DataParallelGradients(
      policy_, shard.size > 1 && (sync_->world_size() > shard.size ||
                                  sync_->AddsOtherNodesUpdates()));
  FUSIONRL_RETURN_IF_ERROR(sync_->ReduceGradients(grads));
  if (trained) return true;
  at::NoGradGuard no_grad;
  bool any_update = false;
  for (const at::Tensor& g : grads) {
    any_update = any_update || g.ne(0).any().item<bool>();
  }
  return any_update;
}

absl::Status Trainer::ApplyUpdate(const MiniBatch& mini, StepTally& tally,
                                  TrainStats& stats) {
  // Clipped and stepped in float32 (the masters of a bf16 policy). The
  // norm is a thread-count-invariant sum (engine/kernels/invariant_ops.h).
  MasterWeightAdamW& adamw = *optim_state_->adamw;
  adamw.GradientsToMasters();
  double grad_norm = 0;
  if (policy_.expert_shard().size > 1) {
    // The whole model's norm: every shard's experts count.
    FUSIONRL_ASSIGN_OR_RETURN(grad_norm,
                              ShardedGradNorm(policy_, adamw.stepped()));
    ClipGradsToNorm(adamw.stepped(), grad_norm, optim_.grad_clip);
  } else {
    grad_norm = InvariantClipGradNorm(adamw.stepped(), optim_.grad_clip);
  }
  if (!std::isfinite(grad_norm)) {
    return absl::InternalError(absl::StrCat(
        "trainer: non-finite gradient norm at policy version ", version_,
        " (loss ", mini.loss, "); lower optim.lr or enable optim.grad_clip"));
  }
  const double lr = LearningRateAt(optim_, optimizer_steps_);
  adamw.SetLearningRate(lr);
  adamw.Step();
  ++optimizer_steps_;
  ++stats.optimizer_steps;
  tally.loss_sum += mini.loss;
  stats.grad_norm = grad_norm;
  stats.lr = lr;
  return absl::OkStatus();
}

void Trainer::FinishStats(const StepBatch& b, StepTally& tally,
                          TrainStats& stats) const {
  const double tw = std::max(1.0, tally.token_weight);
  stats.loss = tally.loss_sum / std::max(1, stats.optimizer_steps);
  stats.pg_loss = tally.pg_sum / std::max(1, stats.optimizer_steps);
  stats.kl = tally.kl_sum / tw;
  stats.entropy = tally.ent_sum / tw;
  stats.clip_frac = tally.clip_sum / tw;
  stats.logp_diff_mean =
      tally.diff_tokens > 0 ? tally.diff_sum / tally.diff_tokens : 0.0;
  if (b.prox_in_forward) {
    stats.behaviour_weight_mean = tally.weight_sum / tw;
    stats.behaviour_weight_truncated = tally.capped_sum / tw;
  }
  if (policy_.config().moe_experts > 0 && tally.moe_seqs > 0) {
    stats.moe_aux_loss = tally.moe_aux_sum / tally.moe_seqs;
    stats.moe_z_loss = tally.moe_z_sum / tally.moe_seqs;
    stats.moe_dropped_frac = tally.moe_drop_sum / tally.moe_seqs;
    for (double& l : tally.moe_load_sum) l /= tally.moe_seqs;
    stats.moe_expert_load = std::move(tally.moe_load_sum);
    stats.moe_group_load =
        moe::GroupLoads(stats.moe_expert_load, policy_.config().moe_groups);
  }
  if (tally.route_tokens > 0) {
    stats.moe_route_disagreement = tally.route_differing / tally.route_tokens;
  }
}

}  // namespace fusionrl
