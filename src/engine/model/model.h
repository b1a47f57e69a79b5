// The policy: a Llama-style decoder-only transformer (RMSNorm, rotary
// positions, SwiGLU feed-forward or a mixture of SwiGLU experts, causal
// multi-head attention), with a key/value cache for incremental decoding.
//
// Layout conventions shared by rollout and training:
//   tokens    [B, T] int64
//   positions [B, T] int64   rotary position of each token (0 for padding)
//   key_valid [B, K] bool    which key slots hold real tokens; K = T for a
//                            full forward, K = cache length after the call
//                            for a cached one
// A query attends to keys at or before its own slot that are valid; a padding
// query attends only to itself, so padded rows never produce NaN.
//
// Ownership and threads: PolicyModel owns its parameters. It is not
// thread-safe: one thread at a time may call Forward/ForwardCached/Load, and
// the caller is responsible for exclusion between a trainer and a sampler.
// KvCache is owned by the caller and bound to the model that made it.
#ifndef FUSIONRL_ENGINE_MODEL_MODEL_H_
#define FUSIONRL_ENGINE_MODEL_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusionrl/config.h"

namespace fusionrl {

class GradientSync;

class ActivationHostPool;

// SubBlockTimer's slots of the finer units.
inline constexpr int kAttentionCoreSlot = 3;
inline constexpr int kMlpActSlot = 4;

// Wall time of each sub-block of each layer in the training forwards run
// while the timer is set (PolicyModel::set_sub_block_timer), for the
// activation planner (engine/train/activation_planner.h).
struct SubBlockTimer {
  // [layer][0 attention, 1 mlp (SwiGLU or MoE block), 2 norms (both),
  // 3 the attention core (inside 0), 4 the SwiGLUs' insides (inside 1: the
  // SiLU and product, a MoE expert's gather and gating)], seconds summed
  // over the forwards; zeroed when the timer is set.
  std::vector<std::array<double, 5>> seconds;
  // Waits for the device before each reading (CUDA); null on a CPU.
  std::function<void()> sync;
};

// Per-layer key/value buffers [B, H, capacity, Dh], filled from slot 0 up.
struct KvCache {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  int64_t length = 0;    // slots filled so far
  int64_t capacity = 0;  // slots allocated
};

// Router statistics of a MoE policy's last forward call, averaged over its
// layers (all zero / empty for a dense model or before the first forward).
struct MoeStats {
  std::vector<double> expert_load;  // [N] share of assignments per expert
  // [G] share per MoGE group (model.moe_groups; the sum of its experts'
  // loads): 1 / G each by construction when G > 1.
  std::vector<double> group_load;
  double dropped_frac = 0;  // share of assignments dropped by capacity
  double aux_loss = 0;      // load-balancing loss, unscaled (1 = balanced)
  double z_loss = 0;        // router z-loss, unscaled
};

// Expert parallelism (placement.expert_parallel): which share of every MoE
// block's experts a model holds. Rank r of `size` holds the N / size
// consecutive experts from r * N / size (with MoGE, a group or several per
// rank).
struct ExpertShard {
  int rank = 0;
  int size = 1;
};

class PolicyModel {
 public:
  // A freshly initialised model (deterministic in `seed`) on `device`.
  static absl::StatusOr<std::unique_ptr<PolicyModel>> Create(
      const ModelConfig& config, int vocab_size, c10::Device device,
      uint64_t seed);
  ~PolicyModel();
  PolicyModel(const PolicyModel&) = delete;
  PolicyModel& operator=(const PolicyModel&) = delete;

  // Logits [B, T, V] for a whole padded batch (autograd on).
  at::Tensor Forward(const at::Tensor& tokens, const at::Tensor& positions,
                     const at::Tensor& key_valid);

  // Forward() split in two, for callers that need logits at a few positions
  // only (large vocabularies): the final hidden states after the last norm,
  // and the logits [..., V] of any hidden states [..., D].
  // Logits(ForwardHidden(...)) == Forward(...). With `first_position` the
  // hidden states of positions [first_position, T) only, [B, T -
  // first_position, D] (the logits a trainer reads start at the last prompt
  // position): the last layer then computes its queries, attention output
  // and feed-forward at those positions only (keys and values at all), for
  // a dense policy whose last layer keeps its sub-blocks; otherwise every
  // position is computed and the result narrowed. Equal to the narrowed
  // full forward up to float rounding of the smaller GEMMs.
  // REQUIRES: 0 <= first_position < T.
  at::Tensor ForwardHidden(const at::Tensor& tokens,
                           const at::Tensor& positions,
                           const at::Tensor& key_valid,
                           int64_t first_position = 0);
  at::Tensor Logits(const at::Tensor& hidden);
  // The parameters Logits() reads: lm_head's weight, or the embedding's
  // when the embeddings are tied.
  std::vector<at::Tensor> head_parameters() const;

  // Allocates an empty cache for `batch` sequences of up to `capacity` slots.
  KvCache NewCache(int64_t batch, int64_t capacity) const;

  // Appends `tokens` [B, t] at slots cache.length.. and returns their logits
  // [B, t, V], or only the last slot's [B, 1, V] with `last_only` (a
  // prefill: the LM head over a large vocabulary at every prompt position
  // would cost t times more and is never read). `key_valid` is
  // [B, cache.length + t]. Run under no-grad.
  // REQUIRES: cache.length + t <= cache.capacity.
  at::Tensor ForwardCached(const at::Tensor& tokens,
                           const at::Tensor& positions,
                           const at::Tensor& key_valid, KvCache& cache,
                           bool last_only = false);

  // MoE (model.moe_experts > 0): every block's feed-forward is a routed
  // mixture of experts (engine/model/moe.h). Capacity (moe_capacity_factor)
  // applies only to a training forward: Forward() in training mode with
  // autograd on. ForwardCached() and no-grad or eval-mode Forward() calls are
  // dropless, so a token's routing depends on its hidden state alone and the
  // sampler and the trainer route it alike.
  //
  // The auxiliary loss of the last Forward/ForwardCached call, summed over
  // layers: moe_aux_loss_coef * load-balancing loss + moe_z_loss_coef *
  // router z-loss, with autograd when that call had it. Undefined for a
  // dense model or before the first forward.
  at::Tensor AuxLoss() const;
  // The last call's router statistics (one host copy). With the MoE block
  // under recompute, backward runs it again: the statistics are then those
  // of the recomputation, which equal the forward's.
  MoeStats moe_stats() const;

  // Router replay: while `routes` ([B, T, n_layers, top_k] int64 on the
  // model's device; -1 where a token is routed as usual) is set, every
  // forward without a cache of a [B, T] batch routes token (b, t) at layer l
  // to routes[b, t, l] and computes only the gates (dropless;
  // engine/model/moe.h). Undefined clears it. REQUIRES a MoE model (checked).
  void SetRouteReplay(const at::Tensor& routes);
  // While on, each forward records the experts every token of it ran on:
  // last_routes() is [B, t, n_layers, top_k] int64 (the kept experts in
  // choice order; -1 for a dropped assignment or a padding token), or
  // undefined (off, a dense model, or before the first forward).
  void set_record_routes(bool on);
  at::Tensor last_routes() const;

  // Copies all parameter values from `other` (same config), and with LoRA
  // the adapters of an unmerged `other`.
  void CopyWeightsFrom(const PolicyModel& other);

  // A new model with a copy of these weights, gradients off, on this
  // model's device or on `device` (a rollout card of its own).
  std::unique_ptr<PolicyModel> CloneFrozen() const;
  std::unique_ptr<PolicyModel> CloneFrozen(c10::Device device) const;

  // Expert parallelism (placement.expert_parallel; docs/moe.md). A
  // trainable copy of this model (a MoE model holding every expert) that
  // holds only `shard`'s experts of every block, under their global names
  // ("block0.mlp.expert5.w1.weight"), with the same values; its router,
  // shared expert and dense parameters are whole copies. Its forwards need
  // set_expert_group first. REQUIRES: a MoE model without shards or LoRA,
  // shard.size dividing moe_experts (InvalidArgument otherwise).
  absl::StatusOr<std::unique_ptr<PolicyModel>> ExpertShardOf(
      ExpertShard shard) const;
  const ExpertShard& expert_shard() const;
  // A frozen model of this config holding every expert, on `device`,
  // without an expert group: an expert shard's whole model, its values to
  // be set by GatherExperts or read from a checkpoint (freshly initialised
  // until then). REQUIRES: no LoRA.
  std::unique_ptr<PolicyModel> WholeFrozen(c10::Device device) const;
  // The c10d group of the shard.size ranks holding the shards (borrowed,
  // rank shard.rank of it): every forward exchanges token rows with them
  // (engine/model/moe_module.h), so all of them run the same forwards and
  // backwards in the same order. A CloneFrozen() of a shard keeps the
  // shard and the group.
  void set_expert_group(GradientSync* group);
  GradientSync* expert_group() const;
  // Joins the expert exchanges one forward of this model makes (each MoE
  // block's, in order) with no tokens: what a rank of the group with
  // nothing to compute runs so that the others' forward completes (a
  // rollout in lockstep, RolloutEngine::set_expert_lockstep).
  // FailedPrecondition unless the model is an expert shard with its group;
  // Internal when an exchange fails.
  absl::Status JoinExpertExchanges();
  // Gathering, gradients and plans of the shards:
  // engine/model/expert_parallel.h.

  // Selective recompute / swap (model.activations, resolved per layer at
  // Create; engine/train/activation_memory.h). Applies to Forward() with
  // autograd on; ForwardCached() and no-grad calls always keep (they save
  // nothing). Replaces the plan; InvalidArgument unless it has one entry a
  // layer. Create fails with Unimplemented for model.activations.policy auto.
  absl::Status SetActivationPlan(std::vector<LayerActivationPlan> plan);
  const std::vector<LayerActivationPlan>& activation_plan() const;
  // The host pool of swapped activations (owned by the model; its byte
  // counts are what the live graphs of this model hold there).
  ActivationHostPool& activation_host_pool() const;
  // While `timer` is set (nullptr to unset; it must outlive its use), every
  // Forward() with autograd on runs block by block through the plan's
  // sub-block path and adds each sub-block's time to it.
  void set_sub_block_timer(SubBlockTimer* timer);

  // LoRA (model.lora; docs/models.md "LoRA"). A model created with
  // model.lora.rank > 0 holds the frozen base weights and, for each targeted
  // projection of each layer, float32 adapters A [r, in] (uniform in
  // +-1/sqrt(in), deterministic in the seed) and B [out, r] (zero); its
  // forwards add (alpha / r) * B A x (engine/model/lora.h). CloneFrozen() is a
  // view computing the policy's forwards: float32, merged (W + s B A in the
  // targeted weights, at the base model's cost); bfloat16, unmerged (copied
  // adapters added as training adds them: a bfloat16 merge loses updates
  // below W's spacing). On the same device it shares the untargeted tensors
  // and base weights (fixed after set-up) with this model (must outlive it).
  bool lora() const;
  bool lora_merged() const;
  // What training updates and a weight sync moves: with LoRA the adapters
  // (A then B of each targeted projection, layer by layer: "block0.attn.
  // wq.lora_A", ...), else every parameter.
  std::vector<at::Tensor> trainable_parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> named_trainable_parameters()
      const;
  int64_t num_trainable_parameters() const;
  // Sets the trainable tensors from `values` (trainable_parameters()'s
  // order and shapes, any device); a merged view merges again from its
  // base.
  void LoadTrainable(const std::vector<at::Tensor>& values);
  // The dropout masks of the next training forwards (model.lora.dropout >
  // 0) are a function of `seed` and the adapter alone.
  void set_lora_dropout_seed(uint64_t seed);

  // The base parameters (with LoRA: without the adapters; a merged view's
  // targeted weights hold the merged values).
  std::vector<at::Tensor> parameters() const;
  // Parameters by FusionRL name ("embed.weight", "block0.attn.wq.weight",
  // ...; engine/model/hf_model.h maps them to Hugging Face names), in a fixed
  // order.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  int64_t num_parameters() const;
  void set_training(bool on);

  // Weights in torch's archive format (model.pt) and the shape metadata.
  // With LoRA the adapters only (the base is the job's model.hf_path or
  // init_checkpoint).
  absl::Status Save(const std::string& path) const;
  // Save() of the parameters whose names `keep` accepts (an expert shard's
  // own experts, next to another shard's model.pt: engine/train/checkpoint.h).
  absl::Status Save(const std::string& path,
                    const std::function<bool(const std::string&)>& keep) const;
  // Loads weights saved by Save(); FailedPrecondition naming the mismatching
  // tensor if the shapes differ from this model's config. A LoRA model takes
  // the adapters of a LoRA archive, or the base weights of a full one (a
  // LoRA job started from a full checkpoint).
  absl::Status Load(const std::string& path);
  // Load() of weights spread over several archives (a checkpoint whose
  // expert shards wrote their experts apart): each tensor is read from the
  // first archive that holds it.
  absl::Status Load(const std::vector<std::string>& paths);

  const ModelConfig& config() const;
  int vocab_size() const;
  c10::Device device() const;

  struct Impl;  // defined in model.cc

 private:
  explicit PolicyModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Positions and key-validity for a left-padded batch: given valid [B, T]
// (bool), positions = cumsum(valid) - 1 clamped at 0.
at::Tensor PositionsFromValid(const at::Tensor& valid);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_MODEL_H_
