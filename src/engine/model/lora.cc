#include "engine/model/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/seed.h"
#include "engine/kernels/invariant_ops.h"

namespace fusionrl {

at::Tensor LoraLinear(const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, const LoraAdapter* lora,
                      bool training) {
  at::Tensor y = InvariantLinear(x, weight, bias);
  if (lora == nullptr) return y;
  at::Tensor in = x.to(at::kFloat);
  // In training mode, with or without autograd: a recomputed sub-block's
  // first pass runs under no-grad and must draw the mask its second does.
  if (training && lora->dropout > 0) {
    // Drawn on the CPU from a generator of its own: the same mask on every
    // device and in a recomputed forward.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(MixSeed(
        lora->dropout_seed != nullptr ? *lora->dropout_seed : 0, lora->index));
    const double keep = 1.0 - lora->dropout;
    at::Tensor mask =
        at::empty(in.sizes(), at::TensorOptions().dtype(at::kFloat))
            .bernoulli_(keep, gen)
            .div_(keep)
            .to(in.device());
    in = in * mask;
  }
  at::Tensor update =
      InvariantLinear(InvariantLinear(in, lora->a), lora->b) * lora->scale;
  return y + update.to(y.scalar_type());
}

at::Tensor MergedWeight(const at::Tensor& base, const LoraAdapter& lora) {
  at::NoGradGuard no_grad;
  at::Tensor delta = at::mm(lora.b.detach(), lora.a.detach());
  return (base.to(at::kFloat) + delta * lora.scale).to(base.scalar_type());
}

}  // namespace fusionrl
