#include "engine/swiglu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include "engine/invariant_ops.h"
#include "engine/kernel_math.h"
#include "engine/model.h"
#include "engine/moe_module.h"
#include "engine/sub_block_timing.h"

namespace fusionrl {
namespace {

namespace km = kernel_math;

// 8-float vectors only travel between always-inline bodies here (see
// engine/kernel_math.h).
#pragma GCC diagnostic ignored "-Wpsabi"

// The elementwise part of the backward, one pass over rows [r0, r1) of
// [n, f]: with g the row's gate (1 without), s = silu(h1), p = s * h3 and
// u = dy w2 on entry,
//   dgate = sum_j u p,  p <- g p,  dh3 = g u s,
//   u <- dh1 = g u h3 sig (1 + h1 (1 - sig)).
// (The composite form makes ten passes and as many [n, f] temporaries.)
FUSIONRL_KERNEL_BODY void ActBackwardBody(const float* h1, const float* h3,
                                          float* u, float* p, float* dh3,
                                          const float* gate, float* dgate,
                                          int64_t r0, int64_t r1, int64_t f) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * f;
    const float g = gate != nullptr ? gate[r] : 1.0f;
    km::V8 acc = km::V8{};
    float tail = 0;
    int64_t j = 0;
    for (; j + km::kLanes <= f; j += km::kLanes) {
      const km::V8 a = km::Load8(h1 + o + j), b = km::Load8(h3 + o + j);
      const km::V8 du = km::Load8(u + o + j);
      const km::V8 sig = 1.0f / (1.0f + km::Exp8(-a));
      const km::V8 sa = a * sig;
      const km::V8 pj = sa * b;
      acc += du * pj;
      const km::V8 gu = du * g;
      km::Store8(p + o + j, pj * g);
      km::Store8(dh3 + o + j, gu * sa);
      km::Store8(u + o + j, gu * b * sig * (1.0f + a * (1.0f - sig)));
    }
    for (; j < f; ++j) {
      const float a = h1[o + j], b = h3[o + j], du = u[o + j];
      const float sig = 1.0f / (1.0f + km::Exp(-a));
      const float sa = a * sig, pj = sa * b;
      tail += du * pj;
      p[o + j] = pj * g;
      dh3[o + j] = g * du * sa;
      u[o + j] = g * du * b * sig * (1.0f + a * (1.0f - sig));
    }
    if (dgate != nullptr) {
      float sum = tail;
      for (int l = 0; l < km::kLanes; ++l) sum += acc[l];
      dgate[r] = sum;
    }
  }
}
FUSIONRL_AVX2 void ActBackwardAvx2(const float* h1, const float* h3, float* u,
                                   float* p, float* dh3, const float* gate,
                                   float* dgate, int64_t r0, int64_t r1,
                                   int64_t f) {
  ActBackwardBody(h1, h3, u, p, dh3, gate, dgate, r0, r1, f);
}
void ActBackwardGeneric(const float* h1, const float* h3, float* u, float* p,
                        float* dh3, const float* gate, float* dgate, int64_t r0,
                        int64_t r1, int64_t f) {
  ActBackwardBody(h1, h3, u, p, dh3, gate, dgate, r0, r1, f);
}

// Whether the fused pass takes these: float32, CPU, contiguous.
bool FusedActApplies(std::initializer_list<const at::Tensor*> ts) {
  for (const at::Tensor* t : ts) {
    if (t->defined() &&
        (!t->device().is_cpu() || t->scalar_type() != at::kFloat ||
         !t->is_contiguous())) {
      return false;
    }
  }
  return true;
}

// Inputs x, w1, w3, w2, then rows and gate where present (an undefined
// tensor cannot be an input of a custom Function in LibTorch 1.13).
class SwiGLUAct : public torch::autograd::Function<SwiGLUAct> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& w3, const torch::Tensor& w2,
                               const c10::optional<torch::Tensor>& rows,
                               const c10::optional<torch::Tensor>& gate) {
    const torch::Tensor xs = rows ? x.index_select(0, *rows) : x;
    const torch::Tensor h1 = InvariantMm(xs, w1.t());
    const torch::Tensor h3 = InvariantMm(xs, w3.t());
    torch::Tensor y = InvariantMm(at::silu(h1).mul_(h3), w2.t());
    if (gate) y.mul_(*gate);
    ctx->saved_data["rows"] = rows.has_value();
    ctx->saved_data["gate"] = gate.has_value();
    torch::autograd::variable_list saved = {x, w1, w3, w2, h1, h3};
    if (rows) saved.push_back(*rows);
    if (gate) saved.push_back(*gate);
    ctx->save_for_backward(saved);
    return y;
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &w1 = saved[1], &w3 = saved[2],
                        &w2 = saved[3], &h1 = saved[4], &h3 = saved[5];
    const bool has_rows = ctx->saved_data["rows"].toBool();
    const bool has_gate = ctx->saved_data["gate"].toBool();
    const torch::Tensor rows = has_rows ? saved[6] : torch::Tensor();
    const torch::Tensor gate =
        has_gate ? saved[has_rows ? 7 : 6] : torch::Tensor();
    const torch::Tensor& dy = grads[0];
    const torch::Tensor xs = has_rows ? x.index_select(0, rows) : x;
    torch::Tensor dh1 = InvariantMm(dy, w2);  // d(ungated output) w2, [n, F]
    torch::Tensor p, dh3, dgate;
    if (FusedActApplies({&h1, &h3, &dh1, &gate})) {
      const int64_t n = h1.size(0), f = h1.size(1);
      p = at::empty_like(h1);
      dh3 = at::empty_like(h1);
      if (has_gate) dgate = at::empty({n, 1}, h1.options());
      const float* g = has_gate ? gate.data_ptr<float>() : nullptr;
      float* dg = has_gate ? dgate.data_ptr<float>() : nullptr;
      const auto run =
          km::CpuHasAvx2Fma() ? ActBackwardAvx2 : ActBackwardGeneric;
      at::parallel_for(0, n, km::Grain(8 * f), [&](int64_t r0, int64_t r1) {
        run(h1.data_ptr<float>(), h3.data_ptr<float>(), dh1.data_ptr<float>(),
            p.data_ptr<float>(), dh3.data_ptr<float>(), g, dg, r0, r1, f);
      });
    } else {
      const torch::Tensor sig = at::sigmoid(h1);
      const torch::Tensor s = h1 * sig;  // silu(h1)
      p = s * h3;
      if (has_gate) {
        dgate = (dh1 * p).sum(1, /*keepdim=*/true);
        dh1.mul_(gate);
        p.mul_(gate);
      }
      dh3 = dh1 * s;
      // silu'(h) = sig * (1 + h * (1 - sig))
      dh1 = dh1 * h3 * sig * (1 + h1 * (1 - sig));
    }
    const torch::Tensor dw2 = InvariantMm(dy.t(), p);
    const torch::Tensor dxs = InvariantMm(dh1, w1).add_(InvariantMm(dh3, w3));
    const torch::Tensor dx =
        has_rows ? at::zeros_like(x).index_add_(0, rows, dxs) : dxs;
    return {dx,  InvariantMm(dh1.t(), xs), InvariantMm(dh3.t(), xs),
            dw2, torch::Tensor(),          dgate};
  }
};

}  // namespace

at::Tensor SwiGLURecomputedAct(const at::Tensor& x, const at::Tensor& rows,
                               const at::Tensor& gate, const at::Tensor& w1,
                               const at::Tensor& w3, const at::Tensor& w2) {
  auto present = [](const at::Tensor& t) {
    return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
  };
  if (rows.defined()) {
    return SwiGLUAct::apply(x, w1, w3, w2, present(rows), present(gate));
  }
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  at::Tensor y =
      SwiGLUAct::apply(flat, w1, w3, w2, c10::nullopt, present(gate));
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w2.size(0);
  return y.view(shape);
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  if (lora[0] != nullptr || lora[1] != nullptr || lora[2] != nullptr) {
    const bool training = is_training();
    const torch::Tensor a =
        LoraLinear(x, w1->weight, torch::Tensor(), lora[0], training);
    const torch::Tensor b =
        LoraLinear(x, w3->weight, torch::Tensor(), lora[1], training);
    return LoraLinear(TimeSubBlock(timer, layer, kMlpActSlot,
                                   [&] { return torch::silu(a) * b; }),
                      w2->weight, torch::Tensor(), lora[2], training);
  }
  if (recompute_act && at::GradMode::is_enabled()) {
    return SwiGLURecomputedAct(x, torch::Tensor(), torch::Tensor(), w1->weight,
                               w3->weight, w2->weight);
  }
  const torch::Tensor a = InvariantLinear(x, w1->weight),
                      b = InvariantLinear(x, w3->weight);
  // Profiling: what mlp_act would recompute.
  return InvariantLinear(TimeSubBlock(timer, layer, kMlpActSlot,
                                      [&] { return torch::silu(a) * b; }),
                         w2->weight);
}

}  // namespace fusionrl
