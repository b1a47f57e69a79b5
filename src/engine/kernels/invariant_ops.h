// Products and sums whose result does not depend on the intra-op thread
// count.
//
// RL Fusion moves threads between a card's trainer and its rollout as each
// becomes idle (docs/stalesync.md "Threads"), so one step may train on one
// thread and the next on two. With OpenBLAS a matrix product computed on
// two threads differs from the one-thread product in the last bits (its
// threaded driver blocks the work differently), and so do LibTorch's full
// reductions over 32768 elements or more (one partial sum per thread). Left
// alone, two runs of one fused config drift apart after a few steps. The
// trainer's model therefore computes:
//   - matrix products in fixed row blocks, each block one single-threaded
//     BLAS call: the blocks depend on the shapes only, and threads only
//     decide who computes which block;
//   - full sums as a tree of row sums of fixed width (each row summed by one
//     thread, in one order).
// A block calls the BLAS itself, with the arguments LibTorch 1.13's CPU
// addmm would pass (so the block is bitwise at::mm's), not through the
// operator dispatcher: a decode step of a mixture of experts runs thousands
// of small blocks, and the dispatcher's few microseconds per call were most
// of its host time (docs/moe.md "Dispatch"). Where that call does not apply
// (another dtype or layout, no BLAS symbol in the process) a block is one
// at::mm_out.
// Off the CPU (CUDA) both are the plain LibTorch call: a GPU kernel's
// result does not depend on a host thread count.
//
// Thread safety: pure functions of their arguments.
#ifndef FUSIONRL_ENGINE_KERNELS_INVARIANT_OPS_H_
#define FUSIONRL_ENGINE_KERNELS_INVARIANT_OPS_H_

#include <ATen/core/Tensor.h>

#include <vector>

namespace fusionrl {

// a [M, K] @ b [K, N] -> [M, N], with no autograd graph of its own (use
// InvariantLinear for a differentiable product).
at::Tensor InvariantMm(const at::Tensor& a, const at::Tensor& b);

// One product of a group: out = a @ b, with a [M, K], b [K, N] and out
// [M, N] allocated by the caller, its rows contiguous (stride(1) == 1; a row
// range of a larger tensor is fine).
struct MmProblem {
  at::Tensor out, a, b;
};

// Every problem's product in one pass: the row blocks of all of them are
// spread over the caller's threads together, so many small products (the
// experts of a mixture) keep every thread busy and cost one call, not one
// each. Each out is bitwise what InvariantMm(a, b) returns. No autograd.
void InvariantMmGroup(const std::vector<MmProblem>& problems);

// x [..., in] @ weight[out, in]^T (+ bias [out]) -> [..., out], as
// torch::linear, differentiable in x, weight and bias; the backward
// products are invariant too.
at::Tensor InvariantLinear(const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias = at::Tensor());

// Grouped linear maps (a mixture's experts): rows [s_g, s_g + counts[g]) of
// x [M, in] times weights[g]^T (each [out, in]) -> [M, out], where s_g is the
// sum of the counts before g and the counts sum to M. Differentiable in x
// and every weight; forward and backward each run their products as one
// InvariantMmGroup, bitwise equal to one InvariantLinear per group (a group
// with no rows leaves its weight's gradient undefined, as no call would).
at::Tensor InvariantGroupedLinear(const at::Tensor& x,
                                  const std::vector<int64_t>& counts,
                                  const std::vector<at::Tensor>& weights);

// The sum of all elements of `t` as a 0-dim tensor of t's dtype,
// differentiable.
at::Tensor InvariantSum(const at::Tensor& t);

// torch::nn::utils::clip_grad_norm_ (L2, max_norm > 0) with the norm taken
// by InvariantSum: scales every defined gradient by max_norm / (norm + 1e-6)
// when that is below 1, and returns the norm before clipping. With
// max_norm <= 0 only the norm is returned.
double InvariantClipGradNorm(const std::vector<at::Tensor>& params,
                             double max_norm);

// The two halves of InvariantClipGradNorm, for a norm taken over several
// ranks (expert parallelism): the squared norm of `params`' gradients, and
// scaling them by max_norm / (norm + 1e-6) where that is below 1 (max_norm
// > 0).
double InvariantGradSquaredNorm(const std::vector<at::Tensor>& params);
void ClipGradsToNorm(const std::vector<at::Tensor>& params, double norm,
                     double max_norm);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_KERNELS_INVARIANT_OPS_H_
