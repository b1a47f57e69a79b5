// Trainer: turns scored rollout samples into policy updates.
//
// One Step() consumes one rollout batch (groups of group_size samples, laid
// out group-major) and:
//   1. collates samples into padded tensors (prompt left-padded, response
//      right-padded, as the rollout engine lays them out);
//   2. builds token-level rewards (the outcome reward on the last response
//      token, minus beta * KL(proximal || reference) on every token when
//      algorithm.kl_mode is reward) and
//      advantages (GRPO / Dr.GRPO / RLOO from the per-sequence return,
//      REINFORCE++ per token);
//   3. for ppo_epochs passes, splits the batch into mini-batches (one
//      optimizer step each) and micro-batches (gradient accumulation; losses
//      are normalised by the mini-batch's totals so accumulation is exact);
//      a dense policy's micro-batches take a mini-batch's sequences longest
//      first, and every micro-batch is trimmed to its own longest prompt and
//      response (length bucketing: less padding computed);
//      loss = clipped surrogate (+ kl_coef * KL when kl_mode is loss)
//      - entropy_coef * entropy (+ a MoE policy's router auxiliary loss,
//      PolicyModel::AuxLoss(), weighted by the micro-batch's share of the
//      mini-batch's trained sequences);
//   4. clips the global gradient norm, applies the warm-up schedule and takes
//      an AdamW step; the policy version is incremented once per Step(). A
//      mini-batch with no trained token (all its samples excluded) takes no
//      step: weights, optimizer state and schedule are left as they were.
// The proximal ("old") log-probs of the surrogate are the behaviour log-probs
// stored on the samples: in synchronous on-policy RL the sampler and the
// trainer hold the same weights, so they coincide. With
// algorithm.decoupled_loss (samples from an older policy) they are
// recomputed with the weights at the start of Step(), and each token's loss
// is weighted by the behaviour importance weight, truncated at the cap or
// masked above it (algorithm.behaviour_weight_mode; decoupled PPO,
// algo::BehaviourWeights).
//
// Ownership: borrows the policy (and the optional frozen reference), which
// must outlive the trainer; owns the optimizer. Not thread-safe.
#ifndef FUSIONRL_ENGINE_TRAIN_TRAINER_H_
#define FUSIONRL_ENGINE_TRAIN_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/collectives/grad_sync.h"
#include "engine/model/model.h"
#include "engine/rollout/sample.h"
#include "fusionrl/config.h"

namespace torch::optim {
class AdamW;
}  // namespace torch::optim

namespace fusionrl {

class MasterWeightAdamW;
struct AdamWSettings;

struct TrainStats {
  double loss = 0;                // total loss (mean over optimizer steps)
  double pg_loss = 0;             // clipped surrogate part
  double kl = 0;                  // token-mean KL to the reference (0 if none)
  double entropy = 0;             // token-mean policy entropy
  double clip_frac = 0;           // fraction of tokens clipped
  double grad_norm = 0;           // pre-clip global norm (last optimizer step)
  double lr = 0;                  // learning rate used (last optimizer step)
  double advantage_abs_mean = 0;  // mean |A| over valid tokens
  int64_t tokens = 0;             // response tokens trained on (per epoch)
  // Token positions the training forwards computed in one epoch, padding
  // included (length-bucketed micro-batches leave less of it).
  int64_t computed_tokens = 0;
  // Decoupled loss only: token-mean behaviour importance weight as applied
  // (masked tokens count 0) and the fraction of tokens whose raw weight
  // exceeded the cap, i.e. truncated (truncate) or dropped (mask); 1 and 0
  // otherwise.
  double behaviour_weight_mean = 1;
  double behaviour_weight_truncated = 0;
  // Rollout/trainer mismatch, |log pi_trainer - log pi_rollout| over the
  // response tokens of the step's first mini-batch before its first update
  // (the trainer's log-probs of the weights that sampled them, in a
  // synchronous step): mean and max. Measured in every mode; with a policy
  // lag it includes the lag's drift.
  double logp_diff_mean = 0;
  double logp_diff_max = 0;
  // rollout.overlong: the fraction of trained responses cut at
  // max_new_tokens, and the mean reward they lost (penalize).
  double overlong_frac = 0;
  double overlong_penalty_mean = 0;
  int optimizer_steps = 0;
  // MoE policies only (model.moe_experts > 0): router statistics of the
  // step's training forward passes, averaged over layers and over the
  // micro-batches (weighted by their sequences).
  double moe_aux_loss = 0;      // load-balancing loss, unscaled (1 = balanced)
  double moe_z_loss = 0;        // router z-loss, unscaled
  double moe_dropped_frac = 0;  // share of expert assignments dropped by
                                //   capacity (training forward only)
  std::vector<double> moe_expert_load;  // [N] share of assignments per expert
  std::vector<double> moe_group_load;   // [G] share per MoGE group
  // Router replay's measure: the fraction of the tokens the rollout routed
  // (prompt and response, the step's first mini-batch before its first
  // update, as logp_diff) whose set of experts in the trainer's forward
  // differs from the rollout's at some layer (a capacity drop counts). 0
  // with algorithm.router_replay; -1 when the samples carry no routes
  // (a dense policy).
  double moe_route_disagreement = -1;
};

// Tensors for a batch of samples. Shapes: [B, P + R] for the sequence,
// [B, R] for response-aligned tensors. Exposed for tests and SFT.
struct CollatedBatch {
  at::Tensor input_ids;      // int64: left-padded prompt, right-padded response
  at::Tensor valid;          // bool: real tokens
  at::Tensor positions;      // int64
  at::Tensor response_ids;   // int64 [B, R]
  at::Tensor response_mask;  // float [B, R]
  at::Tensor behaviour_logp;  // float [B, R]
  // MoE: the rollout's experts of each token, int64 [B, P + R, n_layers,
  // top_k] (-1: none recorded); undefined when no sample carries routes.
  // Set by CollateRoutes.
  at::Tensor routes;
  int64_t prompt_len = 0;  // P
};
CollatedBatch Collate(const std::vector<Sample>& samples, int pad_id,
                      c10::Device device);
// The samples' recorded routes (Sample::routes) laid out as batch.routes
// for a MoE `config`: undefined when none has any. InvalidArgument naming
// the sample when one's record is not whole tokens of n_layers * top_k
// experts, covers more positions than its tokens, or names an expert
// outside [0, moe_experts).
absl::StatusOr<at::Tensor> CollateRoutes(const std::vector<Sample>& samples,
                                         const CollatedBatch& batch,
                                         const ModelConfig& config);

// Per-token log-probs [B, R] of batch.response_ids under `model` (with
// autograd unless the caller disables it); optionally the logits of the
// response positions [B, R, V]. Materialises B x R x V logits: the
// reference for ResponseTokenStats below.
at::Tensor ResponseLogProbs(PolicyModel& model, const CollatedBatch& batch,
                            double temperature, at::Tensor* logits_out);

// Log-probs and entropies of the response tokens, [B, R] each (0 at padded
// response slots), with the LM head applied only at real response
// positions and `chunk_tokens` positions at a time (optim.
// logits_chunk_tokens). Each chunk is one fused autograd node
// (engine/kernels/vocab_kernels.h HeadLogProbs) that keeps two floats a row and
// recomputes its logits in backward, so neither forward nor backward ever
// holds more than one chunk's logits: what keeps a 152k-token vocabulary
// from materialising batch x sequence x vocabulary. chunk_tokens 0 = the
// composite path over all positions at once (ResponseLogProbs; the
// reference the fused path is tested against). Entropy is returned only
// when `with_entropy` (otherwise undefined).
struct ResponseTokenStats {
  at::Tensor logp;     // float [B, R]
  at::Tensor entropy;  // float [B, R]
};
ResponseTokenStats ResponseTokenLogProbs(PolicyModel& model,
                                         const CollatedBatch& batch,
                                         double temperature,
                                         int64_t chunk_tokens,
                                         bool with_entropy);

class Trainer {
 public:
  // `reference` may be null when algorithm.kl_coef == 0. With `sync`
  // (borrowed, must outlive the trainer) the trainer is one data-parallel
  // rank: every rank calls Step() with its own shard of whole groups, all
  // shards of equal size; loss normalisers are summed over ranks and
  // gradients all-reduced, so the ranks take the step one trainer would take
  // on the union of the shards and keep identical weights. (REINFORCE++
  // whitens advantages per shard.)
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      PolicyModel& policy, PolicyModel* reference, const JobConfig& config,
      int pad_id, GradientSync* sync = nullptr);
  ~Trainer();

  // One update from one rollout batch. InvalidArgument if the batch size is
  // not a multiple of group_size or a sample has an empty response.
  absl::StatusOr<TrainStats> Step(const std::vector<Sample>& samples);

  int64_t version() const { return version_; }
  void set_version(int64_t v) { version_ = v; }
  // Called before each forward pass of a step (each micro-batch, and the
  // proximal/reference recomputations), on the training thread: RL Fusion
  // uses it to resize the thread's intra-op pool to what the card has free.
  void set_compute_hook(std::function<void()> hook) {
    compute_hook_ = std::move(hook);
  }

  // Optimizer state (torch archive), for checkpoints.
  absl::Status SaveOptimizer(const std::string& path) const;
  absl::Status LoadOptimizer(const std::string& path);
  // The same state as bytes, for in-memory snapshots (a step that must be
  // rolled back when a data-parallel peer is lost mid-step).
  absl::StatusOr<std::string> OptimizerState() const;
  absl::Status RestoreOptimizerState(const std::string& bytes);

  // The AdamW optimizer itself, for memory accounting and for moving its
  // state between devices (engine/train/memory_accounting.h). Owned by the
  // trainer; not to be stepped or re-created by the caller.
  torch::optim::AdamW& optimizer();
  const torch::optim::AdamW& optimizer() const;
  // The optimizer with its float32 master weights (a bf16 policy's;
  // engine/train/master_weights.h).
  MasterWeightAdamW& master_weights();
  const MasterWeightAdamW& master_weights() const;

 private:
  Trainer(PolicyModel& policy, PolicyModel* reference, const JobConfig& config,
          int pad_id, GradientSync* sync);
  struct Optim;
  // Step()'s state (trainer.cc): the batch as trained, one mini-batch, and
  // the running sums behind TrainStats.
  struct StepBatch;
  struct MiniBatch;
  struct StepTally;

  // Step() in the order of the header's steps. InvalidArgument for a batch
  // Step() refuses (also when data-parallel shards differ in size).
  absl::Status CheckBatch(const std::vector<Sample>& samples);
  // Steps 1 and 2: collation, rewards, reference and proximal log-probs,
  // advantages; sets the stats measured before training.
  absl::StatusOr<StepBatch> PrepareBatch(const std::vector<Sample>& samples,
                                         TrainStats& stats);
  at::Tensor ReferenceLogProbs(const CollatedBatch& batch);
  void RecomputeProximal(StepBatch& b, TrainStats& stats);
  void BucketByLength(StepBatch& b) const;
  // Steps 3 and 4 for the mini-batch at row m0 of one epoch.
  absl::Status TrainMiniBatch(const StepBatch& b, int epoch, int64_t m0,
                              StepTally& tally, TrainStats& stats);
  // Forward and backward of rows [u0, u0 + u_n): gradients accumulate.
  void AccumulateMicroBatch(const StepBatch& b, int64_t u0, int64_t u_n,
                            MiniBatch& mini, StepTally& tally,
                            TrainStats& stats);
  ResponseTokenStats PolicyLogProbs(const CollatedBatch& b, bool with_entropy,
                                    bool replay);
  void TallyRolloutMismatch(const CollatedBatch& mb, const at::Tensor& logp,
                            StepTally& tally, TrainStats& stats);
  at::Tensor AddRouterLoss(const CollatedBatch& mb, int64_t u_n,
                           const MiniBatch& mini, at::Tensor loss,
                           StepTally& tally);
  // Sums gradients over the data-parallel ranks when the sync exchanges
  // them. False when this rank trained no token and the sum is zero too
  // (no optimizer step).
  absl::StatusOr<bool> ReduceGradients(bool trained);
  // Step 4: clip, warm-up schedule, AdamW step.
  absl::Status ApplyUpdate(const MiniBatch& mini, StepTally& tally,
                           TrainStats& stats);
  void FinishStats(const StepBatch& b, StepTally& tally,
                   TrainStats& stats) const;

  PolicyModel& policy_;
  PolicyModel* reference_;
  AlgorithmConfig algo_;
  OptimConfig optim_;
  int group_size_;
  double temperature_;
  int pad_id_;
  RolloutConfig rollout_;        // max_new_tokens and the overlong rule
  int64_t logits_chunk_tokens_;  // optim.logits_chunk_tokens
  GradientSync* sync_;
  int64_t version_ = 0;
  std::function<void()> compute_hook_;
  int64_t optimizer_steps_ = 0;
  std::unique_ptr<Optim> optim_state_;
};

// Learning rate at optimizer step `step` (0-based): linear warm-up from
// lr / warmup_steps to lr over warmup_steps, then constant.
double LearningRateAt(const OptimConfig& optim, int64_t step);

// AdamW's settings from optim.beta1/beta2/eps/weight_decay, at `lr`.
AdamWSettings AdamWSettingsOf(const OptimConfig& optim, double lr);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_TRAINER_H_
