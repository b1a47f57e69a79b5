#include "engine/kernels/vocab_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/invariant_ops.h"

namespace fusionrl {
namespace {

using torch::autograd::variable_list;

float RowMax(const float* z, int64_t v) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < v; ++j) m = std::max(m, z[j]);
  return m;
}

int64_t RowArgmax(const float* z, int64_t v) {
  int64_t best = 0;
  for (int64_t j = 1; j < v; ++j) {
    if (z[j] > z[best]) best = j;  // the first of equal maxima, as argmax
  }
  return best;
}

// log sum_j exp(z_j * inv_t), given m = max_j z_j.
double RowLogSumExp(const float* z, int64_t v, float m, double inv_t) {
  const float inv_tf = static_cast<float>(inv_t);
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp((z[j] - m) * inv_tf);
  return m * inv_t + std::log(s);
}

// z = h W^T as float32 [N, V].
at::Tensor Logits(const at::Tensor& h, const at::Tensor& w) {
  if (h.dim() != 2) return at::matmul(h, w.t()).to(at::kFloat).contiguous();
  return InvariantMm(h, w.t()).to(at::kFloat).contiguous();
}

// The autograd node of HeadLogProbs. Inputs (h, weight, targets, temperature
// as a 0-dim double tensor); outputs (logp, entropy). Saves h, weight,
// targets and per row logsumexp and E[z / T].
struct HeadLogProbFunction : torch::autograd::Function<HeadLogProbFunction> {
  static variable_list forward(torch::autograd::AutogradContext* ctx,
                               const at::Tensor& h, const at::Tensor& weight,
                               const at::Tensor& targets, double temperature) {
    const at::Tensor z = Logits(h, weight);
    const int64_t n = z.size(0), v = z.size(1);
    const double inv_t = 1.0 / temperature;
    const float inv_tf = static_cast<float>(inv_t);
    auto logp = at::empty({n}, z.options());
    auto entropy = at::empty({n}, z.options());
    auto lse = at::empty({n}, z.options().dtype(at::kDouble));
    auto mean = at::empty({n}, z.options().dtype(at::kDouble));
    const at::Tensor t = targets.to(at::kLong).contiguous();
    const float* zp = z.data_ptr<float>();
    const int64_t* tp = t.data_ptr<int64_t>();
    float* lp = logp.data_ptr<float>();
    float* ep = entropy.data_ptr<float>();
    double* lsep = lse.data_ptr<double>();
    double* meanp = mean.data_ptr<double>();
    at::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = zp + r * v;
        const float m = RowMax(row, v);
        // exp in float (glibc's expf: ~1 ulp, twice as fast as exp),
        // sums in double.
        double s = 0, sz = 0;
        for (int64_t j = 0; j < v; ++j) {
          const float e = std::exp((row[j] - m) * inv_tf);
          s += e;
          sz += static_cast<double>(e) * row[j];
        }
        const double l = m * inv_t + std::log(s);
        const double ez = sz / s * inv_t;  // E[z / T]
        lsep[r] = l;
        meanp[r] = ez;
        lp[r] = static_cast<float>(row[tp[r]] * inv_t - l);
        ep[r] = static_cast<float>(l - ez);
      }
    });
    ctx->save_for_backward({h, weight, t, lse, mean});
    ctx->saved_data["inv_t"] = inv_t;
    return {logp, entropy};
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx,
                                variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& t = saved[2];
    const at::Tensor& lse = saved[3];
    const at::Tensor& mean = saved[4];
    const double inv_t = ctx->saved_data["inv_t"].toDouble();
    const bool has_lp = grads[0].defined();
    const bool has_ent = grads[1].defined();
    variable_list out(4);
    if (!has_lp && !has_ent) return out;
    // dL/dz_j / (1/T) = g_lp (1[j = t] - p_j) - g_ent p_j (z_j / T - E[z/T]),
    // formed in place over the recomputed logits.
    at::Tensor dz = Logits(h, weight);
    const int64_t n = dz.size(0), v = dz.size(1);
    const at::Tensor glp =
        has_lp ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    const at::Tensor gent =
        has_ent ? grads[1].to(at::kFloat).contiguous() : at::Tensor();
    float* zp = dz.data_ptr<float>();
    const int64_t* tp = t.data_ptr<int64_t>();
    const double* lsep = lse.data_ptr<double>();
    const double* meanp = mean.data_ptr<double>();
    const float* glpp = has_lp ? glp.data_ptr<float>() : nullptr;
    const float* gentp = has_ent ? gent.data_ptr<float>() : nullptr;
    at::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* row = zp + r * v;
        const double l = lsep[r], ez = meanp[r];
        const double a = has_lp ? glpp[r] : 0.0;
        const double b = has_ent ? gentp[r] : 0.0;
        const float lf = static_cast<float>(l);
        const float inv_tf = static_cast<float>(inv_t);
        const float af = static_cast<float>(a * inv_t);
        const float bf = static_cast<float>(b * inv_t);
        const float ezf = static_cast<float>(ez);
        for (int64_t j = 0; j < v; ++j) {
          const float zt = row[j] * inv_tf;
          const float p = std::exp(zt - lf);
          row[j] = -af * p - bf * p * (zt - ezf);
        }
        row[tp[r]] += static_cast<float>(a * inv_t);
      }
    });
    const at::Tensor dzc = dz.to(weight.scalar_type());
    if (h.requires_grad())
      out[0] = InvariantMm(dzc, weight).to(h.scalar_type());
    if (weight.requires_grad()) {
      out[1] = InvariantMm(dzc.t(), h.to(weight.scalar_type()));
    }
    return out;
  }
};

}  // namespace

SampledRows SampleRows(const at::Tensor& logits, const at::Tensor& u,
                       double temperature) {
  const at::Tensor z = logits.to(at::kFloat).contiguous();
  const bool greedy = temperature <= 0;
  const at::Tensor uu = greedy ? at::Tensor() : u.to(at::kFloat).contiguous();
  const int64_t b = z.size(0), v = z.size(1);
  SampledRows out;
  out.tokens = at::empty({b}, z.options().dtype(at::kLong));
  out.logp = at::empty({b}, z.options());
  const float* zp = z.data_ptr<float>();
  const float* up = greedy ? nullptr : uu.data_ptr<float>();
  int64_t* tok = out.tokens.data_ptr<int64_t>();
  float* lp = out.logp.data_ptr<float>();
  const double inv_t = greedy ? 1.0 : 1.0 / temperature;
  at::parallel_for(0, b, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> cdf;  // one row's running sums, reused
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = zp + r * v;
      const float m = RowMax(row, v);
      if (greedy) {
        const int64_t t = RowArgmax(row, v);
        tok[r] = t;
        lp[r] = static_cast<float>(row[t] - RowLogSumExp(row, v, m, 1.0));
        continue;
      }
      cdf.resize(v);
      const float inv_tf = static_cast<float>(inv_t);
      double s = 0;
      for (int64_t j = 0; j < v; ++j) {
        s += std::exp((row[j] - m) * inv_tf);
        cdf[j] = s;
      }
      // The first token whose cumulative mass reaches u * total (u > 0):
      // a token of zero probability leaves the running sum unchanged, so
      // the first index to reach the target never is one.
      const double target = static_cast<double>(up[r]) * s;
      int64_t t =
          std::lower_bound(cdf.begin(), cdf.end(), target) - cdf.begin();
      t = std::min(t, v - 1);
      tok[r] = t;
      lp[r] = static_cast<float>((row[t] - m) * inv_t - std::log(s));
    }
  });
  return out;
}

HeadStats HeadLogProbs(const at::Tensor& h, const at::Tensor& weight,
                       const at::Tensor& targets, double temperature) {
  const double t = temperature > 0 ? temperature : 1.0;
  variable_list r = HeadLogProbFunction::apply(h, weight, targets, t);
  return {r[0], r[1]};
}

}  // namespace fusionrl
