// model.activations: what a training step does with the activations its
// transformer blocks save for backward (keep, recompute or swap, per
// sub-block and per layer), and the resolved per-layer plan. Part of the
// job configuration (fusionrl/config.h includes it).
#ifndef FUSIONRL_ACTIVATION_CONFIG_H_
#define FUSIONRL_ACTIVATION_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

// What a transformer block's sub-blocks do with the activations they save
// for backward (model.activations; engine/train/activation_memory.h measures
// it).
//   keep:      autograd holds them until backward (the default).
//   recompute: activation checkpointing: the sub-block's forward runs under
//              no-grad and keeps only its inputs; backward runs it again.
//   swap:      the saved activations are copied to a host pool in forward
//              and brought back in backward. On a CPU device the pool is the
//              same memory, so swap frees nothing there.
// Sub-blocks: attention (q/k/v/o projections, rotary, softmax), mlp (the
// SwiGLU, or the whole MoE block: router, experts, shared expert) and norm
// (both RMSNorms of the block). A finer unit, attention_core (keep or
// recompute), is the part of attention between the projections: scores,
// mask, softmax and the weighted sum of values, whose saved activations grow
// with the square of the sequence length while its compute is a small part
// of the layer's (Megatron-LM's selective recompute). Recomputing it keeps
// q, k and v (the projections are not run again); it applies where attention
// itself is kept or swapped. The other finer unit, mlp_act (keep or
// recompute), is the inside of each SwiGLU between its projections: the
// SiLU and the product, and for a MoE expert also the gather of its tokens
// and the gate's scaling. Recomputing it keeps w1 x and w3 x only (Megatron-
// LM's moe_act); it applies where mlp itself is kept or swapped.
// model.activations.policy: keep | recompute | swap, the action of every
// sub-block not set on its own; auto: at the first training step a planner
// measures each sub-block and picks actions so the activations fit
// budget_mib at the least extra time (engine/train/activation_planner.h).
enum class ActivationPolicy { kKeep, kRecompute, kSwap, kAuto };
absl::StatusOr<ActivationPolicy> ParseActivationPolicy(absl::string_view name);
const char* ActivationPolicyName(ActivationPolicy policy);

// One sub-block's own setting: kDefault ("" or unset in YAML) takes the
// policy's action (keep for attention_core and mlp_act, which the policy
// does not set); else keep | recompute | swap.
enum class SubBlockActivation { kDefault, kKeep, kRecompute, kSwap };
absl::StatusOr<SubBlockActivation> ParseSubBlockActivation(
    absl::string_view name);
const char* SubBlockActivationName(SubBlockActivation setting);

struct ActivationConfig {
  ActivationPolicy policy = ActivationPolicy::kKeep;
  // Under policy auto these stay kDefault and `layers` empty.
  SubBlockActivation attention = SubBlockActivation::kDefault;
  SubBlockActivation mlp = SubBlockActivation::kDefault;
  SubBlockActivation norm = SubBlockActivation::kDefault;
  // keep | recompute only (a swap of these is refused).
  SubBlockActivation attention_core = SubBlockActivation::kDefault;
  SubBlockActivation mlp_act = SubBlockActivation::kDefault;
  // Per-layer overrides, applied last: entries "<layer>: <sub>=<action>,
  // <sub>=<action>" separated by ';', e.g. "0: mlp=keep; 3: attention=swap"
  // (sub: attention, mlp, norm, attention_core, mlp_act).
  // Layer indices must be < model.n_layers, each layer listed once.
  std::string layers;
  double budget_mib = 0;  // auto only (> 0 there): activation budget, MiB
};

enum class ActivationAction { kKeep, kRecompute, kSwap };

// The resolved action of each sub-block of one layer.
struct LayerActivationPlan {
  ActivationAction attention = ActivationAction::kKeep;
  ActivationAction mlp = ActivationAction::kKeep;
  ActivationAction norm = ActivationAction::kKeep;
  ActivationAction attention_core = ActivationAction::kKeep;  // keep|recompute
  ActivationAction mlp_act = ActivationAction::kKeep;         // keep|recompute
};

// The plan of each of `n_layers` layers: defaults, then per-sub-block
// fields, then per-layer overrides. InvalidArgument naming the bad part of a
// field. Policy auto resolves to keep everywhere (the planner decides).
absl::StatusOr<std::vector<LayerActivationPlan>> ResolveActivationPlan(
    const ActivationConfig& config, int n_layers);

// "keep", "recompute", "swap".
const char* ActivationActionName(ActivationAction action);

}  // namespace fusionrl

#endif  // FUSIONRL_ACTIVATION_CONFIG_H_
