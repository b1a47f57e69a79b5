#include "engine/invariant_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>

#include "engine/intra_op_threads.h"

namespace fusionrl {
namespace {

// Rows per block of a product with `m` rows: at least 8 blocks once there
// are 128 rows, blocks of 16 to 256 rows. A function of m only.
int64_t BlockRows(int64_t m) {
  return std::clamp<int64_t>((m + 7) / 8, 16, 256);
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  // x2 [N, in], weight [out, in] -> [N, out]
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& x2, const at::Tensor& weight) {
    ctx->save_for_backward({x2, weight});
    return InvariantMm(x2, weight.t());
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &weight = saved[1];
    const at::Tensor& dy = grads[0];
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = InvariantMm(dy, weight);
    if (ctx->needs_input_grad(1)) dw = InvariantMm(dy.t(), x2);
    return {dx, dw};
  }
};

}  // namespace

at::Tensor InvariantMm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "InvariantMm: [M, K] @ [K, N], got ", a.sizes(), " and ",
              b.sizes());
  if (!a.device().is_cpu()) return at::mm(a, b);
  const int64_t m = a.size(0);
  at::Tensor out = at::empty({m, b.size(1)}, a.options());
  if (m == 0) return out;
  const int64_t rows = BlockRows(m);
  const int64_t blocks = (m + rows - 1) / rows;
  RunBlocksAlone(blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      const int64_t r0 = i * rows, n = std::min(rows, m - r0);
      at::Tensor block = out.narrow(0, r0, n);
      at::mm_out(block, a.narrow(0, r0, n), b);
    }
  });
  return out;
}

at::Tensor InvariantLinear(const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias) {
  if (!x.device().is_cpu()) return at::linear(x, weight, bias);
  const int64_t in = x.size(-1);
  at::Tensor y = LinearFunction::apply(x.reshape({-1, in}), weight);
  if (bias.defined()) y = y + bias;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return y.view(shape);
}

at::Tensor InvariantSum(const at::Tensor& t) {
  // Below LibTorch's grain size a sum runs on one thread already.
  constexpr int64_t kSerial = 16384;
  constexpr int64_t kWidth = 1024;
  at::Tensor flat = t.reshape({-1});
  if (!t.device().is_cpu()) return flat.sum();
  while (flat.numel() > kSerial) {
    const int64_t pad = (kWidth - flat.numel() % kWidth) % kWidth;
    if (pad > 0) flat = at::constant_pad_nd(flat, {0, pad});
    flat = flat.view({-1, kWidth}).sum(1);
  }
  return flat.sum();
}

double InvariantGradSquaredNorm(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  double sq = 0;
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (g.defined()) sq += InvariantSum(g.square()).item<double>();
  }
  return sq;
}

void ClipGradsToNorm(const std::vector<at::Tensor>& params, double norm,
                     double max_norm) {
  if (max_norm <= 0) return;
  at::NoGradGuard no_grad;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1) return;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
}

double InvariantClipGradNorm(const std::vector<at::Tensor>& params,
                             double max_norm) {
  const double norm = std::sqrt(InvariantGradSquaredNorm(params));
  ClipGradsToNorm(params, norm, max_norm);
  return norm;
}

}  // namespace fusionrl
