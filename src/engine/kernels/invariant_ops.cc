#include "engine/kernels/invariant_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/autograd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "engine/kernels/intra_op_threads.h"

namespace fusionrl {
namespace {

// Rows per block of a product with `m` rows: at least 8 blocks once there
// are 128 rows, blocks of 16 to 256 rows. A function of m only.
int64_t BlockRows(int64_t m) {
  return std::clamp<int64_t>((m + 7) / 8, 16, 256);
}

int64_t BlockCount(int64_t m) {
  return m == 0 ? 0 : (m + BlockRows(m) - 1) / BlockRows(m);
}

// The Fortran BLAS gemm LibTorch itself calls (sgemm_/dgemm_ of the
// process's libblas), found at run time like omp_set_num_threads in
// intra_op_threads.cc; null where the process has none (a LibTorch with a
// BLAS linked in statically).
template <typename T>
using GemmFn = void (*)(const char*, const char*, const int*, const int*,
                        const int*, const T*, const T*, const int*, const T*,
                        const int*, const T*, T*, const int*);

template <typename T>
GemmFn<T> Gemm() {
  static const GemmFn<T> fn = reinterpret_cast<GemmFn<T>>(
      dlsym(RTLD_DEFAULT, std::is_same_v<T, float> ? "sgemm_" : "dgemm_"));
  return fn;
}

// Rows [r0, r0 + n) of out = a @ b with one BLAS call, made as LibTorch
// 1.13's addmm_impl_cpu_ makes it for a row-major output: the column-major
// product C^T = B^T A^T, each operand's transposition and leading dimension
// read from its strides, then cpublas's normalize_last_dims and
// use_blas_gemm checks. False (nothing done) where that path would not call
// the BLAS with these tensors as they are.
template <typename T>
bool BlasBlock(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
               int64_t r0, int64_t n) {
  const GemmFn<T> gemm = Gemm<T>();
  const int64_t k = b.size(0), m = b.size(1);  // C^T is [m, n]
  if (gemm == nullptr || k < 1 || m < 2) return false;
  if (out.stride(1) != 1 || out.stride(0) < m) return false;
  char ta = 'n', tb = 'n';
  int64_t lda = 0, ldb = 0, ldc = out.stride(0);
  if (b.stride(1) == 1 && b.stride(0) >= m) {
    lda = b.stride(0);
  } else if (b.stride(0) == 1 && b.stride(1) >= k) {
    ta = 't';
    lda = b.stride(1);
  } else {
    return false;
  }
  if (a.stride(1) == 1 && a.stride(0) >= k) {
    ldb = a.stride(0);
  } else if (a.stride(0) == 1 && a.stride(1) >= std::max<int64_t>(1, n)) {
    tb = 't';
    ldb = a.stride(1);
  } else {
    return false;
  }
  if (n == 1) ldc = m;
  if (ta == 't') {
    if (m == 1) lda = k;
  } else if (k == 1) {
    lda = m;
  }
  if (tb == 't') {
    if (k == 1) ldb = n;
  } else if (n == 1) {
    ldb = k;
  }
  const int64_t need_a = ta == 't' ? k : m, need_b = tb == 't' ? n : k;
  if (lda < std::max<int64_t>(1, need_a) ||
      ldb < std::max<int64_t>(1, need_b) || ldc < m) {
    return false;
  }
  for (int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v > INT_MAX) return false;
  }
  const int im = m, in = n, ik = k, ilda = lda, ildb = ldb, ildc = ldc;
  const T one = 1, zero = 0;
  gemm(&ta, &tb, &im, &in, &ik, &one, b.data_ptr<T>(), &ilda,
       a.data_ptr<T>() + r0 * a.stride(0), &ildb, &zero,
       out.data_ptr<T>() + r0 * out.stride(0), &ildc);
  return true;
}

// Rows [r0, r0 + n) of p.out = p.a @ p.b.
void MmBlock(const MmProblem& p, int64_t r0, int64_t n) {
  const at::ScalarType t = p.out.scalar_type();
  if (p.a.scalar_type() == t && p.b.scalar_type() == t) {
    if (t == at::kFloat && BlasBlock<float>(p.out, p.a, p.b, r0, n)) return;
    if (t == at::kDouble && BlasBlock<double>(p.out, p.a, p.b, r0, n)) return;
  }
  at::Tensor block = p.out.narrow(0, r0, n);
  at::mm_out(block, p.a.narrow(0, r0, n), p.b);
}

void CheckOperands(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
              "InvariantMm: [M, K] @ [K, N], got ", a.sizes(), " and ",
              b.sizes());
}

void CheckProblem(const MmProblem& p) {
  CheckOperands(p.a, p.b);
  TORCH_CHECK(p.out.dim() == 2 && p.out.size(0) == p.a.size(0) &&
                  p.out.size(1) == p.b.size(1) &&
                  (p.out.stride(1) == 1 || p.out.size(1) <= 1),
              "InvariantMm: the output must be [", p.a.size(0), ", ",
              p.b.size(1), "] with contiguous rows, got ", p.out.sizes(),
              " strides ", p.out.strides());
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

// Inputs: x, then the G weights, then the counts (not a tensor).
class GroupedLinearFunction
    : public torch::autograd::Function<GroupedLinearFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& x, at::TensorList weights,
                            const std::vector<int64_t>& counts) {
    torch::autograd::variable_list saved = {x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["counts"] = counts;
    at::Tensor y = at::empty({x.size(0), weights[0].size(0)}, x.options());
    std::vector<MmProblem> problems;
    int64_t start = 0;
    for (size_t g = 0; g < weights.size(); ++g) {
      const int64_t n = counts[g];
      if (n > 0) {
        problems.push_back(
            {y.narrow(0, start, n), x.narrow(0, start, n), weights[g].t()});
      }
      start += n;
    }
    InvariantMmGroup(problems);
    return y;
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const at::Tensor& x = saved[0];
    const at::Tensor dy = grads[0];
    const size_t groups = counts.size();
    torch::autograd::tensor_list out(groups + 2);
    std::vector<MmProblem> problems;
    if (ctx->needs_input_grad(0)) out[0] = at::empty(x.sizes(), x.options());
    int64_t start = 0;
    for (size_t g = 0; g < groups; ++g) {
      const int64_t n = counts[g];
      const at::Tensor& w = saved[1 + g];
      if (n > 0) {
        const at::Tensor dy_g = dy.narrow(0, start, n);
        if (out[0].defined()) {
          problems.push_back({out[0].narrow(0, start, n), dy_g, w});
        }
        if (ctx->needs_input_grad(1 + g)) {
          out[1 + g] = at::empty(w.sizes(), w.options());
          problems.push_back({out[1 + g], dy_g.t(), x.narrow(0, start, n)});
        }
      }
      start += n;
    }
    InvariantMmGroup(problems);
    return out;
  }
};

}  // namespace

void InvariantMmGroup(const std::vector<MmProblem>& problems) {
  for (const MmProblem& p : problems) CheckProblem(p);
  if (problems.empty()) return;
  if (!problems[0].a.device().is_cpu()) {
    for (const MmProblem& p : problems) {
      at::Tensor out = p.out;
      at::mm_out(out, p.a, p.b);
    }
    return;
  }
  // first[i]: the index of problem i's first block among all of them.
  std::vector<int64_t> first(problems.size() + 1, 0);
  for (size_t i = 0; i < problems.size(); ++i) {
    first[i + 1] = first[i] + BlockCount(problems[i].a.size(0));
  }
  RunBlocksAlone(first.back(), [&](int64_t b0, int64_t b1) {
    size_t i =
        std::upper_bound(first.begin(), first.end(), b0) - first.begin() - 1;
    for (int64_t b = b0; b < b1; ++b) {
      while (first[i + 1] <= b) ++i;
      const MmProblem& p = problems[i];
      const int64_t m = p.a.size(0), rows = BlockRows(m);
      const int64_t r0 = (b - first[i]) * rows;
      MmBlock(p, r0, std::min(rows, m - r0));
    }
  });
}

at::Tensor InvariantMm(const at::Tensor& a, const at::Tensor& b) {
  CheckOperands(a, b);
  if (!a.device().is_cpu()) return at::mm(a, b);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  InvariantMmGroup({{out, a, b}});
  return out;
}

at::Tensor InvariantGroupedLinear(const at::Tensor& x,
                                  const std::vector<int64_t>& counts,
                                  const std::vector<at::Tensor>& weights) {
  TORCH_CHECK(
      x.dim() == 2 && !weights.empty() && counts.size() == weights.size(),
      "InvariantGroupedLinear: x [M, in] with one count per weight, "
      "got x ",
      x.sizes(), ", ", counts.size(), " counts and ", weights.size(),
      " weights");
  int64_t rows = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    TORCH_CHECK(counts[g] >= 0 && weights[g].dim() == 2 &&
                    weights[g].sizes() == weights[0].sizes() &&
                    weights[g].size(1) == x.size(1),
                "InvariantGroupedLinear: group ", g, " has ", counts[g],
                " rows and weight ", weights[g].sizes(), " for x ", x.sizes());
    rows += counts[g];
  }
  TORCH_CHECK(rows == x.size(0), "InvariantGroupedLinear: the counts sum to ",
              rows, ", x has ", x.size(0), " rows");
  if (!x.device().is_cpu()) {
    std::vector<at::Tensor> ys;
    int64_t start = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      if (counts[g] > 0) {
        ys.push_back(at::linear(x.narrow(0, start, counts[g]), weights[g]));
      }
      start += counts[g];
    }
    return ys.empty() ? x.new_empty({0, weights[0].size(0)}) : at::cat(ys);
  }
  return GroupedLinearFunction::apply(x, at::TensorList(weights), counts);
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
