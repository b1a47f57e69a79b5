// FusionRL job configuration.
//
// A job is fully described by one YAML file. Configuration flows one way:
//   YAML text -> LoadJobConfig() -> JobConfig (plain structs, validated once)
//   -> passed by const reference to every component.
// Every field has its default inline and a comment. Tests build configs in
// code by starting from `JobConfig{}` and changing fields.
//
// Errors: LoadJobConfig() never throws. A bad file yields an
// InvalidArgument (bad key, type or value) or NotFound (missing file) status
// whose message is one line: "<file>: <key.path>: <reason>".
#ifndef FUSIONRL_CONFIG_H_
#define FUSIONRL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fusionrl/activation_config.h"

namespace fusionrl {

// Rotary position scaling (Hugging Face `rope_scaling`).
//   none:   plain rotary.
//   linear: positions divided by `factor` (every frequency / factor).
//   llama3: Llama 3.1's frequency-dependent scaling: wavelengths shorter
//           than original_max_position_embeddings / high_freq_factor are
//           kept, longer than .. / low_freq_factor divided by `factor`,
//           smoothly interpolated in between.
struct RopeScalingConfig {
  std::string type = "none";                    // none | linear | llama3
  double factor = 1.0;                          // linear, llama3: > 0
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3: > low_freq_factor
  int original_max_position_embeddings = 8192;  // llama3
};

// Decoder-only transformer (Llama style: RMSNorm, rotary, SwiGLU), with the
// variations of the Hugging Face architectures FusionRL imports
// (docs/models.md): grouped-query attention, a head size of its own, q/k/v
// biases (Qwen2), per-head q/k RMSNorm (Qwen3), tied embeddings and rotary
// scaling.
//
// With `hf_path` set, the architecture keys below (marked [arch]) come from
// the directory's config.json: each must be left at its default or equal the
// imported value, and a different value is an error naming both.
// model.attention_kernel (see ModelConfig).
enum class AttentionKernel { kFused, kComposite };
absl::StatusOr<AttentionKernel> ParseAttentionKernel(absl::string_view name);
const char* AttentionKernelName(AttentionKernel kernel);

// LoRA post-training (docs/models.md "LoRA"): the base weights are frozen
// and each targeted projection W gets a trainable low-rank update,
// W + (alpha / rank) * B A with A [rank, in] and B [out, rank], both float32
// whatever model.dtype is. The optimizer holds the adapters only; rollout
// samples from merged weights; weight syncs and checkpoints carry the
// adapters only.
struct LoraConfig {
  int rank = 0;        // r >= 1; 0 = no LoRA (full fine-tuning)
  double alpha = 16;   // the update is scaled by alpha / rank
  double dropout = 0;  // on the adapter's input, training forwards only
  // Comma-separated Hugging Face projection names (a YAML list reads too):
  // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or
  // all-linear (all seven).
  std::string targets = "all-linear";
};

// The Hugging Face projection names LoRA can target, in layer order.
inline constexpr const char* kLoraTargetNames[] = {
    "q_proj",    "k_proj",  "v_proj",   "o_proj",
    "gate_proj", "up_proj", "down_proj"};
// model.lora.targets as names (all-linear expanded, in kLoraTargetNames
// order, duplicates removed); InvalidArgument naming an unknown one.
absl::StatusOr<std::vector<std::string>> ParseLoraTargets(
    absl::string_view targets);

// How a MoE token's k chosen router probabilities become its combine
// weights (model.moe_gates): auto = the probability itself for k = 1
// (Switch) and renormalised to sum to 1 for k >= 2 (GShard, Mixtral);
// renormalised = always (k = 1: a gate of 1; Hugging Face's
// norm_topk_prob true); probabilities = never (norm_topk_prob false, as
// Qwen3MoeConfig's default, Qwen2-MoE and OLMoE).
enum class MoeGates { kAuto, kRenormalised, kProbabilities };
absl::StatusOr<MoeGates> ParseMoeGates(absl::string_view name);
const char* MoeGatesName(MoeGates gates);
// Whether `gates` renormalises the chosen probabilities of a top-`top_k`
// router (auto resolved by k).
bool RouterRenormalises(MoeGates gates, int top_k);

struct ModelConfig {
  // A Hugging Face model directory (config.json, model.safetensors or a
  // sharded set with model.safetensors.index.json, tokenizer.json,
  // tokenizer_config.json, optional generation_config.json). Its weights are
  // the initial policy, its tokenizer the job's tokenizer. "" = a built-in
  // model initialised from `seed`.
  std::string hf_path;
  // [arch] "" (the built-in decoder) | LlamaForCausalLM | Qwen2ForCausalLM |
  // Qwen3ForCausalLM | MistralForCausalLM: the architecture a checkpoint is
  // exported as; set from config.json with hf_path, or by hand to train a
  // randomly initialised model of that architecture.
  std::string architecture;
  // Tokenizer directory (tokenizer.json + tokenizer_config.json); "" = the
  // hf_path's tokenizer, or the character tokenizer of the built-in tasks.
  std::string tokenizer;
  // Compute and parameter dtype: float32 | bfloat16. Stored weights of any
  // of F32/BF16/F16 are converted to it on load.
  std::string dtype = "float32";
  // Attention core of whole sequences (training, prefill; engine/
  // attention_kernels.h): fused = one CPU kernel per (sequence, head) for
  // forward and backward, keeping one log-sum-exp per query instead of the
  // probabilities, where it supports the policy (float32 on CPU), else
  // composite; composite = the reference ATen ops.
  AttentionKernel attention_kernel = AttentionKernel::kFused;
  int vocab_size = 0;           // [arch] embedding rows; 0 = the tokenizer's
  int d_model = 128;            // [arch] hidden width
  int n_layers = 4;             // [arch] transformer blocks
  int n_heads = 4;              // [arch] query heads
  int n_kv_heads = 0;           // [arch] key/value heads (GQA); 0 = n_heads
  int head_dim = 0;             // [arch] per-head size; 0 = d_model / n_heads
  int d_ff = 384;               // [arch] SwiGLU inner width
  int max_seq_len = 64;         // longest prompt + response, in tokens
  double rope_theta = 10000.0;  // [arch] rotary base
  RopeScalingConfig rope_scaling;  // [arch]
  double norm_eps = 1e-5;          // [arch] RMSNorm epsilon
  bool qkv_bias = false;           // [arch] biases on q/k/v projections
  bool qk_norm = false;            // [arch] per-head RMSNorm of q and k
  bool tie_embeddings = false;     // [arch] lm_head shares the embedding
  double init_std = 0.02;          // std of the normal init of linear weights
  // Mixture of experts: with moe_experts > 0 every block's feed-forward is a
  // routed MoE block (engine/model/moe.h) instead of one dense SwiGLU.
  int moe_experts = 0;  // N experts per block: 0 (dense) or 2..128
  int moe_top_k = 2;    // experts per token: 1..8, <= moe_experts
  // MoGE (Mixture of Grouped Experts, Pangu Pro MoE): the N experts are
  // split into G equal groups of consecutive experts and each token takes
  // its top (top_k / G) experts inside every group, so every group gets
  // exactly T * top_k / G assignments of T tokens. 1 = plain top-k.
  // REQUIRES with G > 1: N and top_k multiples of G.
  int moe_groups = 1;
  // Training forward only (rollout and evaluation are always dropless): each
  // expert takes at most ceil(capacity_factor * T * top_k / N) of the T
  // tokens of a forward call; assignments past that are dropped (the token
  // keeps its residual and the shared expert). 0 = dropless.
  double moe_capacity_factor = 0;
  double moe_aux_loss_coef = 0.01;       // load-balancing loss weight (Switch)
  double moe_z_loss_coef = 0.001;        // router z-loss weight (ST-MoE)
  bool moe_shared_expert = false;        // add one always-on SwiGLU expert
  int moe_d_ff = 0;                      // each expert's inner width; 0 = d_ff
  MoeGates moe_gates = MoeGates::kAuto;  // [arch] see MoeGates
  // Selective recompute / swap of activations (training forward only: a
  // no-grad forward keeps nothing anyway). Not part of the model's shape.
  ActivationConfig activations;
  // LoRA (see LoraConfig); off unless lora.rank > 0 or lora_path is set.
  LoraConfig lora;
  // A PEFT adapter directory (adapter_config.json +
  // adapter_model.safetensors) whose adapters the policy starts from; its
  // r, lora_alpha and target_modules set model.lora (keys set there too
  // must agree).
  std::string lora_path;
};

// Whether LoRA is on: model.lora.rank > 0 (set by lora_path too).
inline bool LoraEnabled(const ModelConfig& m) { return m.lora.rank > 0; }

// A task with a verifiable reward. Which fields matter depends on `name`.
struct TaskConfig {
  // addition | countdown | repeat | reverse | sort | jsonl | math
  std::string name = "addition";
  int64_t seed = 1234;   // seeds the train generator and the eval split
  int eval_size = 200;   // held-out prompts; never used for training
  int min_digits = 1;    // addition: operand digits; reverse/sort: length
  int max_digits = 3;    //   of the string; repeat: the count of a short
                         //   problem (min_digits..max_digits)
  int num_operands = 3;  // countdown: how many numbers are given
  int max_operand = 20;  // countdown: numbers are drawn from 1..max
  // repeat: share of long problems, whose count is drawn from
  // (long_max + 1) / 2..long_max; answers are at most 2 * long_max chars.
  double long_fraction = 0.125;
  int long_max = 24;
  std::string train_path;  // jsonl, math: training file (one JSON object a
                           //   line)
  std::string eval_path;   // jsonl, math: held-out file; "" = hold out the
                           //   last eval_size lines of train_path
  // RewardFn name (see fusionrl/task.h); "" = the task's default verifier.
  std::string reward;
  // How a problem becomes prompt text: chatml | llama3 | none, or "" = auto:
  // detected from the chat_template of a Hugging Face model's
  // tokenizer_config.json (an error if it is not recognised), none for the
  // built-in character model.
  std::string chat_template;
  // System message put before every prompt; "" = none. A problem's own
  // system message takes its place.
  std::string system_prompt;
};

// Autoregressive sampling.
// rollout.decode (see RolloutConfig).
enum class DecodeMode { kFused, kComposite, kStatic };
absl::StatusOr<DecodeMode> ParseDecodeMode(absl::string_view name);
const char* DecodeModeName(DecodeMode mode);

// What happens to a response cut at rollout.max_new_tokens
// (rollout.overlong): keep | mask | penalize (see RolloutConfig).
enum class OverlongMode { kKeep, kMask, kPenalize };
absl::StatusOr<OverlongMode> ParseOverlongMode(absl::string_view name);
const char* OverlongModeName(OverlongMode mode);

struct RolloutConfig {
  int prompts_per_step = 16;  // prompt groups sampled per RL step
  int group_size = 8;         // responses per prompt (GRPO/RLOO group)
  int max_new_tokens = 16;    // response length cap (tokens, eos included)
  double temperature = 1.0;   // 0 = greedy
  int top_k = 0;              // 0 = off
  double top_p = 1.0;         // 1 = off
  // Decode path (engine/rollout/rollout.h): fused = the CPU decoder with fused
  // kernels, prefix sharing and continuous batching where it supports the
  // policy (a float32 dense model on a CPU), else composite; composite = the
  // module graph with prefix sharing and row compaction (what MoE policies
  // and CUDA devices run); static = the reference loop (every row prefilled
  // and decoded to the end).
  DecodeMode decode = DecodeMode::kFused;
  // Fused path: sequences decoded at once; a finished one's slot takes the
  // next waiting one (continuous batching). 0 = all of a step's sequences.
  // Bounds the KV cache at decode_slots x (prompt + max_new_tokens).
  int decode_slots = 0;
  // Fused and disaggregated placements, fused decode path: the rollout
  // thread samples the steps StaleSync admits at once that share a policy
  // version in one engine call, a finished sequence's slot taking the next
  // waiting one of the same or a later step (worker/fused_rollout.h).
  bool cross_step_batching = true;
  // Responses cut at max_new_tokens without a stop token (docs/tasks.md
  // "Overlong responses"): keep = graded and trained as written; mask =
  // graded (their group's advantages use the reward) but their tokens leave
  // the loss (DAPO's overlong filter); penalize = DAPO's soft overlong
  // punishment: a response longer than max_new_tokens - overlong_buffer
  // loses overlong_penalty x (length - (max_new_tokens - overlong_buffer)) /
  // overlong_buffer of reward, up to overlong_penalty at the cap.
  OverlongMode overlong = OverlongMode::kKeep;
  int overlong_buffer = 0;        // penalize: tokens of the ramp; 0 = auto
  double overlong_penalty = 1.0;  // penalize: reward lost at the cap
};

// Every string-valued mode of the config below is an enum, parsed once by
// the config reader from its YAML spelling (ParseX) and written back by the
// emitter with the same spelling (XName); code compares enumerators, never
// strings. ParseX gives InvalidArgument "must be one of <the spellings, in
// this order>; got '<name>'" for anything else; XName gives "?" for a value
// out of the enum's range (which ValidateJobConfig() refuses).

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

// The RL loop (`fusionrl run`).
// run.data_plane (see RunConfig).
enum class DataPlane { kController, kC10d };
absl::StatusOr<DataPlane> ParseDataPlane(absl::string_view name);
const char* DataPlaneName(DataPlane plane);

struct RunConfig {
  int total_steps = 100;     // RL steps (rollout + train)
  int eval_every = 10;       // greedy eval on the held-out split; 0 = off
  int checkpoint_every = 0;  // 0 = only the final checkpoint
  int log_every = 1;         // progress line period, in steps
  // Deadline of every collective between cards (gradient all-reduce, metric
  // sums): a card that stops answering becomes an error, not a hang.
  double collective_timeout_seconds = 300;
  // Where the gradients of a job spanning several super nodes are summed:
  //   controller: each node's first card sends its node's sum to the
  //               controller (WorkService.Reduce), which adds them up;
  //   c10d:       the nodes' first cards form a c10d process group (Gloo on
  //               CPU), rendezvousing through the controller's store; the
  //               controller carries no tensor bytes (docs/cluster.md).
  // StaleSync jobs with max_clock_skew > 0 exchange their updates through
  // the controller (WorkService.ExchangeUpdates) or, on c10d, with
  // asynchronous all-reduces over that group, and sync their weights by a
  // broadcast over it (docs/stalesync.md).
  DataPlane data_plane = DataPlane::kController;
  // After the final checkpoint (RL and SFT), also write the policy as a
  // Hugging Face directory at <output_dir>/hf (`fusionrl export`), in
  // export_dtype (float32 | bfloat16).
  bool export_final = false;
  std::string export_dtype = "float32";
  // Also write every metrics record's numbers as TensorBoard scalars to
  // <output_dir>/tensorboard/ (RL jobs; docs/observability.md).
  bool tensorboard = false;
};

// Supervised warm start (`fusionrl sft`).
struct SftConfig {
  int steps = 300;        // optimizer steps
  int batch_size = 64;    // sequences per step
  double lr = 1e-3;       // peak learning rate (AdamW; optim.* betas,
                          //   eps, weight_decay, grad_clip apply)
  int warmup_steps = 20;  // linear warm-up of the lr from 0
  int eval_every = 100;   // greedy eval period; 0 = only at the end
};

// What each card of a job does (placement.mode).
//   colocated-sync: every card trains and samples, alternating (hybrid
//                   engine).
//   disaggregated:  separate rollout and train cards.
//   fused:          every card trains and samples at the same time (RL
//                   Fusion).
enum class PlacementMode { kColocatedSync, kDisaggregated, kFused };
absl::StatusOr<PlacementMode> ParsePlacementMode(absl::string_view name);
const char* PlacementModeName(PlacementMode mode);

// fused, with a lag and every thread shared: whether a card's trainer and
// rollout compute at the same time or take turns on all its threads
// (worker/step/card_turns.h). probe measures both and keeps the faster; auto
// probes on an accelerator and takes turns (interleaved) on a CPU card,
// where both roles are bound by the same cores (docs/BENCHMARKS.md).
enum class FusedTurns { kAuto, kConcurrent, kInterleaved, kProbe };
absl::StatusOr<FusedTurns> ParseFusedTurns(absl::string_view name);
const char* FusedTurnsName(FusedTurns turns);

// Expert parallelism: what a card samples and evaluates from.
//   gathered: a frozen copy of the whole model, gathered from the group
//             after every step (rollout free of collectives; a whole
//             model's memory on every card).
//   shard:    the card's own expert shard, in lockstep with its group
//             (every decode step exchanges tokens; no whole copy).
enum class ExpertSampling { kGathered, kShard };
absl::StatusOr<ExpertSampling> ParseExpertSampling(absl::string_view name);
const char* ExpertSamplingName(ExpertSampling sampling);

// Which cards a job gets and what each card does. A super node is a group
// of cards with a fast local interconnect (one machine here); the job takes
// the same number of cards in each of the super nodes it spans.
struct PlacementConfig {
  // colocated-sync | disaggregated | fused (see PlacementMode).
  PlacementMode mode = PlacementMode::kColocatedSync;
  int super_nodes = 1;                   // super nodes the job spans
  int cards_per_super_node = 1;          // cards used in each super node
  int rollout_cards_per_super_node = 0;  // disaggregated only: how many of
                                         //   those cards sample; the rest
                                         //   train (0 for the other modes)
  // fused: LibTorch intra-op threads of each card's trainer and rollout
  // thread; 0 = split the card's share of num_threads (trainer half,
  // rollout the rest).
  int fused_train_threads = 0;
  int fused_rollout_threads = 0;
  // fused: a role whose partner is idle borrows the partner's threads (the
  // trainer before each forward pass, the rollout before each decode step),
  // so the card's compute is not left idle. Results do not depend on it
  // (docs/stalesync.md, "Threads").
  bool fused_share_idle_threads = true;
  // fused, s > 0, sharing on: auto | concurrent | interleaved | probe (see
  // FusedTurns). Results do not depend on it, only the speed.
  FusedTurns fused_turns = FusedTurns::kAuto;
  // Expert parallelism (MoE; docs/moe.md): each run of E consecutive
  // training cards of a node holds one policy, each card 1 / E of every
  // block's experts (tokens reach them by all-to-all). 1 = every card
  // holds every expert.
  int expert_parallel = 1;
  // expert_parallel > 1: gathered | shard (see ExpertSampling).
  ExpertSampling expert_sampling = ExpertSampling::kGathered;
  bool fail_if_unplaceable = false;  // false: wait for capacity, showing the
                                     //   reason in status; true: fail the job
};

// What happens to a prompt group over the policy lag that reaches the
// trainer (stalesync.over_stale): regenerate = sampled again from the
// current weights; drop = masked out of the step.
enum class OverStalePolicy { kRegenerate, kDrop };
absl::StatusOr<OverStalePolicy> ParseOverStalePolicy(absl::string_view name);
const char* OverStalePolicyName(OverStalePolicy policy);

// Which policy version a fused or disaggregated rollout samples a step
// from (stalesync.rollout_version; docs/stalesync.md#which-version-samples):
// lagged = exactly the oldest the lag allows, so the versions, and with
// them the whole run, depend on the config alone; newest = the newest
// version published when the step's rollout starts (fresher samples, but
// timing decides which version samples what); jit = newest, started just
// in time: as late as the measured rollout and training times say still
// hides it, never beyond the lag (timing decides, as with newest).
enum class RolloutVersion { kLagged, kNewest, kJustInTime };
absl::StatusOr<RolloutVersion> ParseRolloutVersion(absl::string_view name);
const char* RolloutVersionName(RolloutVersion rule);

// StaleSync: bounded staleness (placement.mode fused).
struct StaleSyncConfig {
  // s: a sample may be trained on only if trainer version - behaviour
  // version <= s. Rollout of step u starts only once the policy it samples
  // from is at least version u - 1 - s, so no sample can exceed it; 0 is
  // exactly synchronous on-policy RL. s > 0 requires
  // algorithm.decoupled_loss: true (the plain PPO ratio against a stale
  // behaviour policy gives a biased update; validation refuses it).
  int max_policy_lag = 0;
  // A sample over the lag cannot be admitted, but if one ever reaches the
  // trainer it is never used silently: regenerate = its prompt group is
  // sampled again from the current weights; drop = the group is masked out
  // of the step. Counted per step (over_stale_samples in metrics.jsonl).
  OverStalePolicy over_stale = OverStalePolicy::kRegenerate;
  // lagged: the rollout of the i-th step after the start (or a reset at
  // version v0) samples from version max(v0, v0 + i - s): every sample is
  // exactly s versions old once the pipeline is full, two runs of a config
  // are the same run, and a checkpoint carries the batches sampled ahead so
  // a resume continues exactly. newest: from the newest version published
  // when the step's rollout starts (staleness <= s, often less; which
  // version samples what depends on timing, so neither runs nor resumes
  // repeat bit for bit; no prompt group is lost or trained twice). jit:
  // newest, but the i-th step's rollout waits for version v0 + i - d, d in
  // 1..s the fewest training steps predicted to cover one step's rollout
  // (the card's measured seconds, with a 20% margin; s until both are
  // measured): staleness only where it buys overlap
  // (docs/stalesync.md#just-in-time-admission).
  RolloutVersion rollout_version = RolloutVersion::kLagged;
  // Partial rollout (N > 0): a response of step t samples its tokens
  // [jN, (j+1)N) from the version that samples step t + j (lagged), j at
  // most s - 1 (the last segment runs to the end). Where that version is
  // newer than the step's own, the response is interrupted after jN tokens
  // and its tail continues in the next round, re-prefilled under the newer
  // weights and decoded beside the next step's responses, instead of
  // decoding alone at the end of its own round. Staleness counts from the
  // oldest token (<= s); every token's version is recorded. Needs fused or
  // disaggregated placement, max_policy_lag >= 2 and rollout_version
  // lagged; N < rollout.max_new_tokens. 0 = off (docs/stalesync.md).
  int partial_rollout_tokens = 0;
  // Lagged: m consecutive steps sample from one policy version (1..s + 1).
  // 1 = each step its own version, exactly s old once the pipeline is
  // full. m > 1: the steps of each block of m (counted from the frame's
  // start) sample from the version their last step is admitted at, so they
  // are s - m + 1 .. s old and their rollouts decode in one round, a long
  // tail beside the next step's responses (continuous batching across
  // steps); the block starts once that version is published, which hides
  // less of it behind training. For rollout-bound runs with long-tailed
  // response lengths (docs/stalesync.md#steps-sharing-a-version). Not with
  // partial rollout.
  int steps_per_version = 1;
  // k: across super nodes, a super node that finished step c starts step
  // c + 1 only while c - min(clocks of the other super nodes) <= k, and
  // applies the other super nodes' gradient updates as they arrive (those
  // of steps <= c + 1 - k at the latest); 0 is one synchronous data-parallel
  // step (a global barrier). Ignored with one super node.
  int max_clock_skew = 0;
};

// Per-card memory accounting and hand-over between the roles of a card
// (src/core/memory_manager.h, docs/stalesync.md "Per-card memory").
// memory.offload_optimizer (see MemoryConfig): never = refuse a request
// that does not fit; auto = offload the optimizer state to host memory to
// make room.
enum class OffloadPolicy { kNever, kAuto };
absl::StatusOr<OffloadPolicy> ParseOffloadPolicy(absl::string_view name);
const char* OffloadPolicyName(OffloadPolicy policy);

struct MemoryConfig {
  // Device memory each card may use for weights, rollout snapshot, optimizer
  // state, gradients, activations and KV cache together, in MiB (2^20
  // bytes); 0 = unlimited (account only, never refuse).
  double card_budget_mib = 0;
  // When the KV cache or the activations would exceed the budget: auto =
  // move the optimizer state to host memory first (it comes back before the
  // next optimizer step once it fits); never = refuse the request.
  OffloadPolicy offload_optimizer = OffloadPolicy::kAuto;
};

// Multi-turn rollouts (include/fusionrl/environment.h, docs/agents.md): an
// environment answers each assistant turn; a sample is a whole episode.
struct EnvConfig {
  // "" = single-turn rollouts (the default); a registered environment
  // ("calculator", "no_tools", your own) or "remote" (gRPC servers).
  std::string name;
  // remote: "host:port", or several comma-separated (episodes are spread
  // over them by their index).
  std::string address;
  // How tool calls are written and parsed: auto = from the chat template
  // (hermes for <tool_call>, llama3 for Llama-3 templates, plain without a
  // template); hermes | llama3 | plain ("[name text]").
  std::string tool_format = "auto";
  int max_turns = 4;  // assistant turns per episode
  // Model + environment tokens after the prompt; 0 = whatever the model's
  // max_seq_len leaves after the prompt. rollout.max_new_tokens bounds
  // each turn.
  int max_episode_tokens = 0;
  double call_deadline_seconds = 10;  // each Open / Step call
  double episode_env_seconds = 60;    // all environment calls of an episode
  int max_concurrency = 16;           // environment calls in flight at once
  // An episode whose environment failed (an error, a deadline): zero =
  // trained with reward 0; drop = its group kept out of the loss.
  std::string on_failure = "zero";
  // An unreachable environment (UNAVAILABLE: connection refused, a server
  // down or restarting) fails no episode: the step runs those episodes
  // again with backoff for up to this long from the end of the attempt
  // that first met it, then fails the job naming the server. 0 = fail at
  // once.
  double unavailable_seconds = 120;
  // A turn's answer joins the decode batch this many decode steps after
  // the turn ended (the rollout waits for it then, never earlier): the
  // schedule, so the samples, do not depend on how fast the environment
  // answered. Larger values hide slower environments.
  int admit_after_steps = 1;
};

// How clients of a cluster controller (`fusionrl submit`, `fusionrl status`)
// authenticate; the controller and workers take the same as flags.
struct ClusterConfig {
  std::string auth_token_file;  // file whose first line is the shared token
  std::string auth_token_env;   // or: environment variable holding it
};

struct JobConfig {
  std::string name = "job";    // shown in logs and summaries
  std::string source_path;     // the YAML file this came from (not a key)
  int64_t seed = 1;            // seeds init, sampling and data order
  std::string device = "cpu";  // torch device string: cpu, cuda, cuda:1
  int num_threads = 2;         // LibTorch intra-op threads
  std::string output_dir = "runs/job";  // metrics, checkpoints, summary
  std::string init_checkpoint;  // policy to start from ("" = random init)
  ModelConfig model;
  TaskConfig task;
  RolloutConfig rollout;
  AlgorithmConfig algorithm;
  OptimConfig optim;
  RunConfig run;
  SftConfig sft;
  PlacementConfig placement;
  StaleSyncConfig stalesync;
  MemoryConfig memory;
  ClusterConfig cluster;
  EnvConfig env;
};

// Reads `path`, applies `overrides` ("key.path=value", YAML scalar syntax
// for the value) in order, and validates. A file with no keys (zero bytes,
// or only comments and whitespace) is an InvalidArgument, "<path>: the file
// is empty (no keys); ...": an empty file is a mistake, not a request for a
// default job (write `{}` for that). Relative file paths inside the config
// (init_checkpoint, task.train_path, task.eval_path) are taken as given, i.e.
// relative to the working directory, as with any command-line tool; a path
// that does not exist is a NotFound error naming the key.
absl::StatusOr<JobConfig> LoadJobConfig(
    const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text (which must hold at least one key, or be `{}`);
// `source_name` is used in error messages.
absl::StatusOr<JobConfig> ParseJobConfig(
    const std::string& yaml_text, const std::string& source_name,
    const std::vector<std::string>& overrides = {});

// Range and consistency checks on an already built config (LoadJobConfig
// runs them). Messages name the key path.
absl::Status ValidateJobConfig(const JobConfig& config);

// What LoadJobConfig does once the keys are read, for a config built in
// code: takes the architecture from model.hf_path's config.json (when the
// path is set and exists; a conflicting explicit value is an error) and
// validates, as ValidateJobConfig. A program's struct goes through this once,
// as a file's keys do; the result is what the job runs.
absl::Status ResolveJobConfig(JobConfig& config);

// The config as YAML, with every key (for logging and for reproducing runs).
std::string JobConfigToYaml(const JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_H_
