// One decoder layer of the policy and how its training forward keeps,
// recomputes or swaps each sub-block's activations (model.activations).
// Internal to the engine: include only from .cc files (it pulls in
// LibTorch's nn headers, which the engine's public headers keep out).
#ifndef FUSIONRL_ENGINE_MODEL_DECODER_BLOCK_H_
#define FUSIONRL_ENGINE_MODEL_DECODER_BLOCK_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "engine/model/activation_swap.h"
#include "engine/model/attention.h"
#include "engine/model/model.h"
#include "engine/model/moe_module.h"
#include "engine/model/recompute.h"
#include "fusionrl/config.h"

namespace fusionrl {

// A pre-norm block, y = h + mlp(mlp_norm(h)) with h = x + attn(attn_norm(x)).
// The feed-forward is one dense SwiGLU, or (model.moe_experts > 0) the routed
// MoE block; either way registered as "mlp".
//
// Ownership: the block shares `pool` with its model and borrows `exclude`
// and `timer` (the model's; they must outlive the forwards that use them).
// Not thread-safe (the model's contract).
class BlockImpl : public torch::nn::Module {
 public:
  // shard: the experts a MoE block holds (expert parallelism).
  explicit BlockImpl(const ModelConfig& c, ExpertShard shard = {});

  // routing (MoE only): which tokens are routed and how (token validity,
  // capacity, replayed experts). Without a cache and with autograd on, each
  // sub-block follows the plan (SetPlan).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask,
                        torch::Tensor* cache_k, torch::Tensor* cache_v,
                        int64_t cache_start, const MoeRouting& routing);

  // The block's outputs at positions [first, T) only, [B, T - first, D]:
  // keys and values from every position, everything else from those only.
  // mask [B, 1, T - first, T]. Dense blocks, and only where forward() would
  // not run the plan (WindowApplies).
  torch::Tensor ForwardWindow(const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin,
                              const torch::Tensor& mask, int64_t first);
  // Whether ForwardWindow computes what forward() does at those positions:
  // a dense block whose sub-blocks are all kept (the finer units may
  // recompute) and that is not being profiled. A MoE block's capacity
  // depends on the tokens routed together, so it never applies there.
  bool WindowApplies() const;

  // Replaces the plan of this layer's sub-blocks.
  void SetPlan(const LayerActivationPlan& p);

  int layer = 0;                             // index in the decoder
  SubBlockTimer* timer = nullptr;            // profiling, when set
  std::shared_ptr<ActivationHostPool> pool;  // swap target
  const std::unordered_set<const void*>* exclude = nullptr;  // not swapped
  // MoE under recompute: the last forward's auxiliary losses, outputs of the
  // recompute node (the module's own last_stats() is overwritten by the
  // recomputation in backward: equal values, but another graph).
  torch::Tensor aux_loss, z_loss;
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  Attention attn{nullptr};
  SwiGLU mlp{nullptr};          // dense
  MoeFeedForward moe{nullptr};  // MoE

 private:
  using Tensors = std::vector<at::Tensor>;

  // The block as four steps, each run as the plan says:
  //   0: n1 = attn_norm(x)          (norm)
  //   1: h  = x + attn(n1)          (attention)
  //   2: n2 = mlp_norm(h)           (norm)
  //   3: y  = h + mlp(n2) [+ aux]   (mlp)
  // Consecutive steps under recompute run as one recompute node, which keeps
  // only the values the run reads from before it: all of a layer under
  // recompute keeps just its input x (as whole-layer checkpointing does).
  enum Value { kX, kN1, kH, kN2, kY, kAux, kZ, kNumValues };
  using Values = std::array<torch::Tensor, kNumValues>;

  // A run of steps executed together: one step kept or swapped, or
  // consecutive steps under recompute. in: the values it reads from before
  // it; out: the values it writes that later steps read, and the results.
  struct Segment {
    int first = 0, last = 0;
    ActivationAction action = ActivationAction::kKeep;
    std::vector<int> in, out;
  };

  bool AllKeep() const;
  void Apply(int step, Values& v, const torch::Tensor& cos,
             const torch::Tensor& sin, const torch::Tensor& mask,
             const MoeRouting& routing);
  torch::Tensor PlannedForward(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin,
                               const torch::Tensor& mask,
                               const MoeRouting& routing);
  // Runs one sub-block (kind: 0 attention, 1 mlp, 2 norm) as `action` says,
  // adding its wall time to the timer when one is set.
  Tensors Run(int kind, ActivationAction action, RecomputeFn fn,
              const Tensors& inputs, std::vector<at::Tensor> params);
  Tensors RunAs(ActivationAction action, RecomputeFn fn, const Tensors& inputs,
                std::vector<at::Tensor> params);

  LayerActivationPlan plan_;       // set with SetPlan
  std::vector<Segment> segments_;  // derived from plan_ by SetPlan
};
TORCH_MODULE(Block);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_DECODER_BLOCK_H_
