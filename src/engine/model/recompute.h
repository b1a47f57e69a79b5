// Activation checkpointing of one function: run it keeping only its inputs,
// run it again in backward. Used by the model's selective recompute
// (model.activations) and by the trainer's chunked LM head (large
// vocabularies: only one chunk's logits exist at a time, in forward and in
// backward).
#ifndef FUSIONRL_ENGINE_MODEL_RECOMPUTE_H_
#define FUSIONRL_ENGINE_MODEL_RECOMPUTE_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace fusionrl {

// A pure function of its differentiable `inputs` and of the parameters it
// reads (other tensors it needs are captured by value). It must give the
// same values when run again (no randomness).
using RecomputeFn =
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// fn(inputs) under no-grad, as one autograd node that saves only `inputs`.
// Its backward runs fn again with grad on, on detached copies of the
// inputs, and differentiates that graph with respect to the inputs and
// `params` (the parameters fn reads): their gradients reach .grad like any
// other use, so gradient accumulation over micro-batches is unchanged.
// Outputs that do not depend on a differentiable input get no gradient.
std::vector<at::Tensor> RunRecomputed(RecomputeFn fn,
                                      const std::vector<at::Tensor>& inputs,
                                      std::vector<at::Tensor> params);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_RECOMPUTE_H_
