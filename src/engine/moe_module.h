// The feed-forward modules of the policy: the dense SwiGLU and the routed
// mixture-of-experts block built on engine/moe.h. Internal to the engine:
// include only from .cc files (it pulls in LibTorch's nn headers, which the
// engine's public headers keep out).
//
// MoeFeedForward: a bias-free router Linear d_model -> N, N SwiGLU experts
// and an optional shared SwiGLU expert that every token goes through.
// Dispatch is batched: the kept assignments are grouped by expert (one
// stable sort and one host copy of the N counts per call); each expert runs
// once on the [n_e, d_model] block of its tokens (index_select), and its
// gate-weighted output is added back with index_add_. Tokens marked invalid
// (padding) are not routed, do not count towards capacity or the statistics,
// and get a zero output. Capacity is applied only when the caller asks for it
// (the model asks in the training forward; see engine/model.h).
//
// Not thread-safe (it records the statistics of its last forward).
#ifndef FUSIONRL_ENGINE_MOE_MODULE_H_
#define FUSIONRL_ENGINE_MOE_MODULE_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <vector>

#include "engine/lora.h"

namespace fusionrl {

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
  // (engine/swiglu.h); else the composite modules.
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
struct MoeLayerStats {
  at::Tensor aux_loss;      // [] load-balancing loss (autograd when on)
  at::Tensor z_loss;        // [] router z-loss (autograd when on)
  at::Tensor expert_load;   // [N] share of assignments per expert (detached)
  at::Tensor dropped_frac;  // [] share of assignments dropped (detached)
};

class MoeFeedForwardImpl : public torch::nn::Module {
 public:
  // REQUIRES: num_experts >= 2, top_k in {1, 2}, top_k <= num_experts,
  // capacity_factor >= 0.
  MoeFeedForwardImpl(int64_t d_model, int64_t d_ff, int num_experts, int top_k,
                     double capacity_factor, bool shared_expert);

  // x [..., D]; token_valid has x's leading shape (bool) or is undefined (all
  // tokens valid). With apply_capacity, each expert takes at most
  // moe::Capacity(capacity_factor, valid tokens, top_k, N) assignments.
  torch::Tensor forward(const torch::Tensor& x,
                        const torch::Tensor& token_valid, bool apply_capacity);

  // Statistics of the last forward; undefined tensors before the first.
  const MoeLayerStats& last_stats() const { return stats_; }
  // model.activations.mlp_act for every expert: each runs, gather and gate
  // included, as one SwiGLURecomputedAct node when autograd is on.
  void SetRecomputeAct(bool on);
  // Profiling: the experts' gathers, gating, SiLUs and products go to
  // timer->seconds[layer][kMlpActSlot]; null stops it.
  void SetTimer(SubBlockTimer* timer, int layer);
  int num_experts() const { return num_experts_; }

  torch::nn::Linear router{nullptr};
  std::vector<SwiGLU> experts;
  SwiGLU shared{nullptr};  // null without a shared expert

 private:
  // x [M, D], every row a token to route.
  torch::Tensor Dispatch(const torch::Tensor& x, bool apply_capacity);

  int num_experts_;
  int top_k_;
  double capacity_factor_;
  MoeLayerStats stats_;
  bool recompute_act_ = false;
  SubBlockTimer* timer_ = nullptr;
  int layer_ = 0;
};
TORCH_MODULE(MoeFeedForward);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MOE_MODULE_H_
