// The feed-forward modules of the policy: the dense SwiGLU and the routed
// mixture-of-experts block built on engine/model/moe.h. Internal to the engine:
// include only from .cc files (it pulls in LibTorch's nn headers, which the
// engine's public headers keep out).
//
// MoeFeedForward: a bias-free router Linear d_model -> N, N SwiGLU experts
// and an optional shared SwiGLU expert that every token goes through.
// Dispatch is batched and its index work is done once per call: the kept
// assignments are sorted by expert (one stable sort and one host copy of
// the N counts), their tokens gathered in that order, all experts run as one
// grouped computation over their contiguous slices (each projection one
// pass over every expert's row blocks), and the gate-weighted outputs go
// back with one index_add_. Tokens
// marked invalid
// (padding) are not routed, do not count towards capacity or the statistics,
// and get a zero output. Capacity is applied only when the caller asks for it
// (the model asks in the training forward; see engine/model/model.h).
//
// Not thread-safe (it records the statistics of its last forward).
#ifndef FUSIONRL_ENGINE_MODEL_MOE_MODULE_H_
#define FUSIONRL_ENGINE_MODEL_MOE_MODULE_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/model/lora.h"
#include "engine/model/model.h"  // ExpertShard

namespace fusionrl {

class GradientSync;
struct SubBlockTimer;

// w2(silu(w1 x) * w3 x), no biases.
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t d_model, int64_t d_ff) {
    w1 = register_module(
        "w1",
        torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
    w3 = register_module(
        "w3",
        torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
    w2 = register_module(
        "w2",
        torch::nn::Linear(torch::nn::LinearOptions(d_ff, d_model).bias(false)));
  }
  // With recompute_act and autograd on, one SwiGLURecomputedAct node
  // (engine/model/swiglu.h); else the composite modules.
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
  // LoRA adapters of w1 (gate_proj), w3 (up_proj), w2 (down_proj), owned by
  // the model; null: none, or merged. With any, forward() runs the composite
  // modules (the recomputed inside reads the weights alone).
  std::array<const LoraAdapter*, 3> lora{};
  // Selective recompute of the inside (model.activations.mlp_act).
  bool recompute_act = false;
  // Profiling (PolicyModel::set_sub_block_timer): the SiLU and product's
  // forward time goes to timer->seconds[layer][kMlpActSlot].
  SubBlockTimer* timer = nullptr;
  int layer = 0;
};
TORCH_MODULE(SwiGLU);

// What one MoE layer's last forward measured over its routed tokens.
// How one forward call routes its tokens (the model fills it per layer).
struct MoeRouting {
  // [B, T] bool (x's leading shape): which tokens are routed; undefined:
  // all of them.
  torch::Tensor token_valid;
  // Drop assignments past moe::Capacity (the training forward only).
  bool apply_capacity = false;
  // Router replay: [B, T, top_k] int64, the experts each token takes (-1:
  // route it as usual), or undefined. Replayed tokens are never dropped.
  torch::Tensor replay;
};

struct MoeLayerStats {
  at::Tensor aux_loss;      // [] load-balancing loss (autograd when on)
  at::Tensor z_loss;        // [] router z-loss (autograd when on)
  at::Tensor expert_load;   // [N] share of assignments per expert (detached)
  at::Tensor dropped_frac;  // [] share of assignments dropped (detached)
};

class MoeFeedForwardImpl : public torch::nn::Module {
 public:
  // REQUIRES: num_experts >= 2, 1 <= top_k <= num_experts, groups dividing
  // num_experts and top_k, capacity_factor >= 0, shard.size dividing
  // num_experts. With shard.size > 1 the module holds its shard's experts
  // only (registered under their global names, "expert<i>") and needs
  // set_expert_group before its first forward. `renormalise_gates`:
  // moe::RouteOptions::renormalise.
  MoeFeedForwardImpl(int64_t d_model, int64_t d_ff, int num_experts, int top_k,
                     int groups, double capacity_factor, bool shared_expert,
                     ExpertShard shard = {},
                     std::optional<bool> renormalise_gates = std::nullopt);

  // Expert parallelism: the group of the shard.size ranks that hold the
  // block's shards (borrowed; rank shard.rank of them). Every forward then
  // exchanges rows with them: each kept assignment's token row goes to the
  // rank that holds its expert and the expert's output comes back (an
  // all-to-all each way; backward sends the gradients the same ways), so
  // every rank of the group must run the same forwards (and backwards) in
  // the same order, with any number of tokens, none included. Router,
  // gates, capacity and statistics stay per rank; an expert's gradient sums
  // the contributions of every rank's tokens. A failed exchange throws
  // c10::Error with the group's error.
  void set_expert_group(GradientSync* group);

  // x [..., D], routed as `routing` says. With apply_capacity (and no
  // replay), each expert takes at most moe::Capacity(capacity_factor, valid
  // tokens, top_k, N) assignments.
  torch::Tensor forward(const torch::Tensor& x, const MoeRouting& routing);

  // Statistics of the last forward; undefined tensors before the first.
  const MoeLayerStats& last_stats() const { return stats_; }
  // While on, each forward records the experts every token ran on:
  // last_routes() is [..., top_k] int64 over x's leading shape, the kept
  // experts in choice order, -1 for a dropped assignment or an unrouted
  // (invalid) token. Undefined while off.
  void set_record_routes(bool on) {
    record_routes_ = on;
    if (!on) routes_ = torch::Tensor();
  }
  const torch::Tensor& last_routes() const { return routes_; }
  // model.activations.mlp_act for every expert: each runs, gather and gate
  // included, as one SwiGLURecomputedAct node when autograd is on.
  void SetRecomputeAct(bool on);
  // Profiling: the experts' gathers, gating, SiLUs and products go to
  // timer->seconds[layer][kMlpActSlot]; null stops it.
  void SetTimer(SubBlockTimer* timer, int layer);
  int num_experts() const { return num_experts_; }
  const ExpertShard& shard() const { return shard_; }
  // The global index of experts[0].
  int first_expert() const {
    return shard_.rank * (num_experts_ / shard_.size);
  }

  torch::nn::Linear router{nullptr};
  std::vector<SwiGLU> experts;  // this shard's: global first_expert() + i
  SwiGLU shared{nullptr};       // null without a shared expert

 private:
  // Expert parallelism: the outputs (ungated) of the kept assignments whose
  // token rows are `xs` (sorted by global expert, count[i] of expert i),
  // computed by the ranks that hold their experts.
  torch::Tensor ExchangeAndRun(const torch::Tensor& xs,
                               const std::vector<int64_t>& count);
  // The experts' outputs, gated by `gate` ([n, 1]) where it is defined, for
  // xs = x[rows] (x itself where rows is undefined): rows [s_g, s_g +
  // counts[g]) of xs go through experts[expert_of[g]]. All experts run as
  // one grouped computation (swiglu.h, invariant_ops.h); with LoRA adapters
  // on the experts, one expert at a time through their own forwards.
  torch::Tensor RunExperts(const torch::Tensor& x, const torch::Tensor& rows,
                           const torch::Tensor& gate,
                           const std::vector<int64_t>& counts,
                           const std::vector<int>& expert_of);
  // x [M, D], every row a token to route; replay [M, top_k] or undefined.
  // Sets *routes ([M, top_k]) when recording.
  torch::Tensor Dispatch(const torch::Tensor& x, bool apply_capacity,
                         const torch::Tensor& replay, torch::Tensor* routes);

  int num_experts_;
  int top_k_;
  int groups_;
  std::optional<bool> renormalise_gates_;
  ExpertShard shard_;
  GradientSync* expert_group_ = nullptr;
  bool record_routes_ = false;
  torch::Tensor routes_;
  double capacity_factor_;
  MoeLayerStats stats_;
  bool recompute_act_ = false;
  SubBlockTimer* timer_ = nullptr;
  int layer_ = 0;
};
TORCH_MODULE(MoeFeedForward);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_MOE_MODULE_H_
