#include "engine/model/swiglu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <vector>

#include "engine/kernels/invariant_ops.h"
#include "engine/kernels/kernel_math.h"
#include "engine/model/model.h"
#include "engine/model/moe_module.h"
#include "engine/model/sub_block_timing.h"

namespace fusionrl {
namespace {

namespace km = kernel_math;

// 8-float vectors only travel between always-inline bodies here (see
// engine/kernels/kernel_math.h).
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

// The experts' weights: expert g's are w1[g], w3[g], w2[g].
struct ExpertWeights {
  std::vector<at::Tensor> w1, w3, w2;
};

// The forward products of the grouped experts on xs [n, D]: the two
// projections h1, h3 [n, F] and the (ungated) output [n, D].
struct GroupedForward {
  at::Tensor h1, h3, y;
};

GroupedForward RunGroupedForward(const at::Tensor& xs,
                                 const std::vector<int64_t>& counts,
                                 const ExpertWeights& w) {
  const int64_t n = xs.size(0), f = w.w1[0].size(0), d = w.w2[0].size(0);
  GroupedForward out;
  out.h1 = at::empty({n, f}, xs.options());
  out.h3 = at::empty({n, f}, xs.options());
  out.y = at::empty({n, d}, xs.options());
  std::vector<MmProblem> problems;
  int64_t start = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t c = counts[g];
    if (c > 0) {
      const at::Tensor x_g = xs.narrow(0, start, c);
      problems.push_back({out.h1.narrow(0, start, c), x_g, w.w1[g].t()});
      problems.push_back({out.h3.narrow(0, start, c), x_g, w.w3[g].t()});
    }
    start += c;
  }
  InvariantMmGroup(problems);
  const at::Tensor act = at::silu(out.h1).mul_(out.h3);
  problems.clear();
  start = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t c = counts[g];
    if (c > 0) {
      problems.push_back(
          {out.y.narrow(0, start, c), act.narrow(0, start, c), w.w2[g].t()});
    }
    start += c;
  }
  InvariantMmGroup(problems);
  return out;
}

void CheckGroups(int64_t rows, const std::vector<int64_t>& counts,
                 const ExpertWeights& w) {
  const size_t g = counts.size();
  TORCH_CHECK(
      g >= 1 && w.w1.size() == g && w.w3.size() == g && w.w2.size() == g,
      "SwiGLU experts: ", g, " counts for ", w.w1.size(), ", ", w.w3.size(),
      " and ", w.w2.size(), " weights");
  int64_t sum = 0;
  for (int64_t c : counts) {
    TORCH_CHECK(c >= 0, "SwiGLU experts: a negative row count");
    sum += c;
  }
  TORCH_CHECK(sum == rows, "SwiGLU experts: the counts sum to ", sum, " for ",
              rows, " rows");
}

// Inputs x, w1[0..G), w3[0..G), w2[0..G), the counts, then rows and gate
// where present (an undefined tensor cannot be an input of a custom
// Function in LibTorch 1.13).
class SwiGLUAct : public torch::autograd::Function<SwiGLUAct> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& x, at::TensorList w1,
                               at::TensorList w3, at::TensorList w2,
                               const std::vector<int64_t>& counts,
                               const c10::optional<torch::Tensor>& rows,
                               const c10::optional<torch::Tensor>& gate) {
    const torch::Tensor xs = rows ? x.index_select(0, *rows) : x;
    const ExpertWeights w{w1.vec(), w3.vec(), w2.vec()};
    GroupedForward f = RunGroupedForward(xs, counts, w);
    if (gate) f.y.mul_(*gate);
    ctx->saved_data["rows"] = rows.has_value();
    ctx->saved_data["gate"] = gate.has_value();
    ctx->saved_data["counts"] = counts;
    torch::autograd::variable_list saved = {x, f.h1, f.h3};
    for (const std::vector<at::Tensor>* ws : {&w.w1, &w.w3, &w.w2}) {
      saved.insert(saved.end(), ws->begin(), ws->end());
    }
    if (rows) saved.push_back(*rows);
    if (gate) saved.push_back(*gate);
    ctx->save_for_backward(saved);
    return f.y;
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const size_t groups = counts.size();
    const torch::Tensor &x = saved[0], &h1 = saved[1], &h3 = saved[2];
    auto w1 = [&](size_t g) -> const at::Tensor& { return saved[3 + g]; };
    auto w3 = [&](size_t g) -> const at::Tensor& {
      return saved[3 + groups + g];
    };
    auto w2 = [&](size_t g) -> const at::Tensor& {
      return saved[3 + 2 * groups + g];
    };
    size_t next = 3 + 3 * groups;
    const bool has_rows = ctx->saved_data["rows"].toBool();
    const bool has_gate = ctx->saved_data["gate"].toBool();
    const torch::Tensor rows = has_rows ? saved[next++] : torch::Tensor();
    const torch::Tensor gate = has_gate ? saved[next] : torch::Tensor();
    const torch::Tensor& dy = grads[0];
    const torch::Tensor xs = has_rows ? x.index_select(0, rows) : x;
    const int64_t n = h1.size(0), f = h1.size(1);
    // d(ungated output) w2, [n, F]
    torch::Tensor dh1 = at::empty({n, f}, h1.options());
    {
      std::vector<MmProblem> problems;
      int64_t start = 0;
      for (size_t g = 0; g < groups; ++g) {
        if (counts[g] > 0) {
          problems.push_back({dh1.narrow(0, start, counts[g]),
                              dy.narrow(0, start, counts[g]), w2(g)});
        }
        start += counts[g];
      }
      InvariantMmGroup(problems);
    }
    torch::Tensor p, dh3, dgate;
    if (FusedActApplies({&h1, &h3, &dh1, &gate})) {
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
    // Every expert's weight gradients and its rows of dxs = dh1 w1 + dh3 w3,
    // in one pass.
    torch::autograd::tensor_list out(3 * groups + 4);
    const torch::Tensor dxs1 = at::empty({n, xs.size(1)}, xs.options());
    const torch::Tensor dxs3 = at::empty({n, xs.size(1)}, xs.options());
    std::vector<MmProblem> problems;
    int64_t start = 0;
    for (size_t g = 0; g < groups; ++g) {
      const int64_t c = counts[g];
      if (c > 0) {
        const at::Tensor dh1_g = dh1.narrow(0, start, c),
                         dh3_g = dh3.narrow(0, start, c),
                         xs_g = xs.narrow(0, start, c);
        at::Tensor& dw1 = out[1 + g];
        at::Tensor& dw3 = out[1 + groups + g];
        at::Tensor& dw2 = out[1 + 2 * groups + g];
        dw1 = at::empty(w1(g).sizes(), w1(g).options());
        dw3 = at::empty(w3(g).sizes(), w3(g).options());
        dw2 = at::empty(w2(g).sizes(), w2(g).options());
        problems.push_back(
            {dw2, dy.narrow(0, start, c).t(), p.narrow(0, start, c)});
        problems.push_back({dxs1.narrow(0, start, c), dh1_g, w1(g)});
        problems.push_back({dxs3.narrow(0, start, c), dh3_g, w3(g)});
        problems.push_back({dw1, dh1_g.t(), xs_g});
        problems.push_back({dw3, dh3_g.t(), xs_g});
      }
      start += c;
    }
    InvariantMmGroup(problems);
    const torch::Tensor dxs = dxs1.add_(dxs3);
    out[0] = has_rows ? at::zeros_like(x).index_add_(0, rows, dxs) : dxs;
    // out[3G + 1]: the counts, then rows: no gradient.
    if (has_gate) out[3 * groups + 3] = dgate;
    return out;
  }
};

}  // namespace

at::Tensor GroupedSwiGLURecomputedAct(
    const at::Tensor& x, const at::Tensor& rows, const at::Tensor& gate,
    const std::vector<int64_t>& counts, const std::vector<at::Tensor>& w1,
    const std::vector<at::Tensor>& w3, const std::vector<at::Tensor>& w2) {
  auto present = [](const at::Tensor& t) {
    return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
  };
  CheckGroups(rows.defined() ? rows.size(0) : x.size(0), counts, {w1, w3, w2});
  return SwiGLUAct::apply(x, at::TensorList(w1), at::TensorList(w3),
                          at::TensorList(w2), counts, present(rows),
                          present(gate));
}

at::Tensor GroupedSwiGLU(const at::Tensor& xs, const at::Tensor& gate,
                         const std::vector<int64_t>& counts,
                         const std::vector<at::Tensor>& w1,
                         const std::vector<at::Tensor>& w3,
                         const std::vector<at::Tensor>& w2) {
  const ExpertWeights w{w1, w3, w2};
  CheckGroups(xs.size(0), counts, w);
  at::Tensor y = RunGroupedForward(xs, counts, w).y;
  return gate.defined() ? y.mul_(gate) : y;
}

at::Tensor SwiGLURecomputedAct(const at::Tensor& x, const at::Tensor& rows,
                               const at::Tensor& gate, const at::Tensor& w1,
                               const at::Tensor& w3, const at::Tensor& w2) {
  if (rows.defined()) {
    return GroupedSwiGLURecomputedAct(x, rows, gate, {rows.size(0)}, {w1}, {w3},
                                      {w2});
  }
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  at::Tensor y = GroupedSwiGLURecomputedAct(flat, at::Tensor(), gate,
                                            {flat.size(0)}, {w1}, {w3}, {w2});
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
