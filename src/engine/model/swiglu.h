// The SwiGLU feed-forward with its inside recomputed (the mlp_act unit of
// model.activations): one autograd node from the gathered input to the
// gated output that keeps only the two projections. Internal to the engine.
#ifndef FUSIONRL_ENGINE_MODEL_SWIGLU_H_
#define FUSIONRL_ENGINE_MODEL_SWIGLU_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fusionrl {

// y = gate * (silu(xs w1^T) * (xs w3^T)) w2^T with xs = x[rows] (x when
// `rows` is undefined) and gate [n, 1] (1 when undefined); x [M, D] or, with
// no rows, any [..., D]; w1, w3 [F, D], w2 [D, F]. Under autograd it is one
// node that saves x, rows, gate, the weights and the two projections
// (xs w1^T, xs w3^T): not xs, silu, the product or the ungated output,
// which autograd's composite graph keeps (4F + 2D values per row against
// 2F here). Its backward gathers xs and recomputes silu and the product
// (no GEMM more); the gate's gradient is rowsum((dy w2) * product), which
// needs no ungated output. Gradients reach x (scattered back to `rows`),
// gate and the three weights. Not twice differentiable.
at::Tensor SwiGLURecomputedAct(const at::Tensor& x, const at::Tensor& rows,
                               const at::Tensor& gate, const at::Tensor& w1,
                               const at::Tensor& w3, const at::Tensor& w2);

// The same for a mixture's experts as one node: rows [s_g, s_g + counts[g])
// of xs (sorted by expert; s_g the sum of the counts before g) go through
// expert g's weights w1[g], w3[g], w2[g]. Every product of the forward, and
// of the backward, runs as one InvariantMmGroup pass (all experts' blocks
// spread over the threads together), and x's gradient is scattered back once
// for all experts. Bitwise equal, output and weight gradients, to one
// SwiGLURecomputedAct per expert. A group with no rows leaves its weights'
// gradients undefined.
at::Tensor GroupedSwiGLURecomputedAct(
    const at::Tensor& x, const at::Tensor& rows, const at::Tensor& gate,
    const std::vector<int64_t>& counts, const std::vector<at::Tensor>& w1,
    const std::vector<at::Tensor>& w3, const std::vector<at::Tensor>& w2);

// The grouped experts' output with no autograd (rollout, evaluation): the
// forward of GroupedSwiGLURecomputedAct on xs [n, D] itself (no rows),
// gated when `gate` is defined.
at::Tensor GroupedSwiGLU(const at::Tensor& xs, const at::Tensor& gate,
                         const std::vector<int64_t>& counts,
                         const std::vector<at::Tensor>& w1,
                         const std::vector<at::Tensor>& w3,
                         const std::vector<at::Tensor>& w2);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_SWIGLU_H_
