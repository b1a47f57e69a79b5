// LoRA adapters of the policy's projections (model.lora; docs/models.md
// "LoRA"): the low-rank update a frozen weight W gets, and the two ways the
// model computes with it.
//
//   unmerged (training): y = x W^T (+ b) + s * (drop(x) A^T) B^T
//   merged (rollout):    y = x W'^T (+ b), W' = W + s * B A
//
// with A [r, in] and B [out, r] in float32 whatever the weight's dtype, and
// s = alpha / r. Internal to the engine.
#ifndef FUSIONRL_ENGINE_MODEL_LORA_H_
#define FUSIONRL_ENGINE_MODEL_LORA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusionrl {

struct LoraAdapter {
  at::Tensor a;  // [r, in] float32, trainable
  at::Tensor b;  // [out, r] float32, trainable
  double scale = 0;
  double dropout = 0;
  // Seeds this adapter's dropout mask (training forwards with dropout > 0):
  // the mask is a function of (*dropout_seed, index) alone, so a recomputed
  // forward draws the same mask as the forward it recomputes.
  const uint64_t* dropout_seed = nullptr;
  uint64_t index = 0;
};

// x W^T (+ bias), plus the adapter's update when `lora` is non-null;
// `training` (the module's training mode): the adapter's input is dropped
// (dropout > 0).
// Differentiable in x, the weight, the bias and the adapter.
at::Tensor LoraLinear(const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, const LoraAdapter* lora,
                      bool training);

// W + s * B A in W's dtype, computed in float32 (no autograd).
at::Tensor MergedWeight(const at::Tensor& base, const LoraAdapter& lora);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_LORA_H_
