// Mixture-of-experts routing math: a softmax router with top-k selection,
// per-expert capacity, and the Switch/GShard load-balancing and ST-MoE
// router z auxiliary losses. Pure tensor functions, so each is tested on
// hand-computed inputs; the feed-forward module that uses them (router,
// experts, batched dispatch) is engine/model/moe_module.h, internal to the
// engine.
//
// Conventions (T tokens, N experts, k = top_k):
//   * probabilities p = softmax(router logits), computed in float32 (float64
//     for float64 logits);
//   * each token picks its k most probable experts, best first; with MoGE
//     groups (G > 1; Pangu Pro MoE's Mixture of Grouped Experts) the N
//     experts are G groups of N / G consecutive ones and the token picks its
//     k / G most probable inside every group (the k then ordered best
//     first), so each group gets exactly T * k / G assignments;
//   * replay (router replay): where a token comes with recorded experts, it
//     takes those, in their order, and only the gates are computed;
//   * gates: k = 1 uses the chosen probability itself (Switch: the router
//     gets a gradient from the task loss through the gate); k >= 2
//     renormalises the chosen probabilities to sum to 1 (GShard, Mixtral:
//     g_j = p_j / sum of the chosen p);
//   * capacity (overflow): an expert takes at most C assignments per call.
//     Assignments are ranked first by choice (every token's first choice
//     before any second choice), then by token order; an assignment ranked
//     past C at its expert is dropped: that expert contributes nothing to
//     the token, which keeps its other choice (if kept), its residual and the
//     shared expert. C = 0 means no limit (dropless).
//
// Thread safety: the functions are pure and may be called concurrently.
#ifndef FUSIONRL_ENGINE_MODEL_MOE_H_
#define FUSIONRL_ENGINE_MODEL_MOE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace fusionrl::moe {

struct RouterOutput {
  at::Tensor probs;         // [T, N] softmax of the logits (autograd)
  at::Tensor expert_index;  // [T, k] int64: chosen experts, best first
  at::Tensor gates;         // [T, k] combine weights (autograd)
  at::Tensor keep;          // [T, k] bool: the assignment survived capacity
  at::Tensor expert_load;   // [N] float32: share of the T * k assignments
                            //   routed to each expert, before capacity
  at::Tensor dropped_frac;  // [] float32: share of the T * k assignments
                            //   dropped by capacity
};

// Slots per expert for one forward call of `tokens` tokens:
// ceil(capacity_factor * tokens * top_k / num_experts); 0 (no limit) when
// capacity_factor is 0.
int64_t Capacity(double capacity_factor, int64_t tokens, int top_k,
                 int num_experts);

struct RouteOptions {
  int top_k = 1;         // 1 <= top_k <= N
  int groups = 1;        // MoGE groups: G divides N and top_k
  int64_t capacity = 0;  // as from Capacity(); 0 = dropless
  // [T, top_k] int64 experts to use (-1: route that slot as usual), or
  // undefined. Replayed assignments are never dropped: REQUIRES capacity 0.
  at::Tensor replay;
  // Whether the gates are the chosen probabilities renormalised to sum to 1
  // (true) or the probabilities themselves (false); nullopt: as top_k says
  // (renormalised for k >= 2; model.moe_gates auto).
  std::optional<bool> renormalise;
};

// Routes T tokens given router logits [T, N]. REQUIRES: T >= 1 and the
// options' constraints (checked).
RouterOutput Route(const at::Tensor& logits, const RouteOptions& options);
// Plain top-k: Route(logits, {top_k, 1, capacity}).
RouterOutput Route(const at::Tensor& logits, int top_k, int64_t capacity);

// Load-balancing loss (Switch Transformer eq. 4, GShard):
// N * sum_i f_i * P_i, with f_i the share of the T * k assignments routed to
// expert i (before capacity; no gradient) and P_i the mean over tokens of
// probs[:, i]. 1 when routing is perfectly balanced. probs [T, N] float,
// expert_index [T, k] int64. A 0-dim tensor (float32, or float64 for float64
// probs), with autograd through probs.
at::Tensor AuxLoss(const at::Tensor& probs, const at::Tensor& expert_index);

// MoGE: each group's share of the assignments, the sum of its N / groups
// consecutive experts' shares (expert_load [N]). REQUIRES groups divides N.
std::vector<double> GroupLoads(const std::vector<double>& expert_load,
                               int groups);

// Router z-loss (ST-MoE): mean over tokens of logsumexp(logits[t, :])^2;
// keeps router logits small. logits [T, N]; a 0-dim tensor (as AuxLoss).
at::Tensor ZLoss(const at::Tensor& logits);

}  // namespace fusionrl::moe

#endif  // FUSIONRL_ENGINE_MODEL_MOE_H_
