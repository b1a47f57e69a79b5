#include "engine/kernels/attention_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/kernels/kernel_math.h"

// Each (sequence, head) item is copied into scratch with Dh padded to a
// multiple of 8 and the keys also held transposed, so every product is a
// register-blocked loop over 8-float vectors (GCC vector extensions: AVX
// in the AVX2 build, SSE pairs in the generic one) on blocks of kRows
// queries: the scores S = Q K^T vectorised along keys, the weighted sums
// P V and dS K along Dh, and dK += dS^T Q, dV += P^T dO along Dh.
//
// 8-float vectors only travel between always-inline helpers here (see
// kernel_math.h).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace fusionrl::attention_kernels {
namespace {

using kernel_math::ExpAffineInPlace;
using kernel_math::Grain;
using kernel_math::kLanes;
using kernel_math::Load8;
using kernel_math::Store8;
using kernel_math::Sum;
using kernel_math::V8;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kRows = 4;  // queries per block

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

const float* Row(const float* base, const Strides& s, int64_t b, int64_t h,
                 int64_t t) {
  return base + b * s.batch + h * s.head + t * s.pos;
}
float* Row(float* base, const Strides& s, int64_t b, int64_t h, int64_t t) {
  return base + b * s.batch + h * s.head + t * s.pos;
}

// One past the last key query row `allowed` may attend to (0: none).
int64_t KeyEnd(const bool* allowed, int64_t nk) {
  int64_t n = nk;
  while (n > 0 && !allowed[n - 1]) --n;
  return n;
}

// Padded scratch of one item. Rows are dhp floats (Dh rounded up to 8,
// zeros after Dh); transposed tensors are [dhp, kp] (keys rounded up to 8,
// zeros after K).
struct Dims {
  int64_t dh, dhp, nk, kp, t, tp;
};

// dst [rows, dhp] = rows of (b, head) of a [B, heads, n, Dh] tensor, the
// rows after n zero.
void CopyRows(const float* base, const Strides& s, int64_t b, int64_t head,
              int64_t n, int64_t rows, const Dims& d, float* dst) {
  std::fill(dst, dst + rows * d.dhp, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(dst + j * d.dhp, Row(base, s, b, head, j),
                d.dh * sizeof(float));
  }
}

// dst [dhp, kp] = the same rows, transposed.
void CopyTransposed(const float* base, const Strides& s, int64_t b,
                    int64_t head, const Dims& d, float* dst) {
  std::fill(dst, dst + d.dhp * d.kp, 0.0f);
  for (int64_t j = 0; j < d.nk; ++j) {
    const float* row = Row(base, s, b, head, j);
    for (int64_t e = 0; e < d.dh; ++e) dst[e * d.kp + j] = row[e];
  }
}

// s[r][j] = sum_e a[r][e] * bt[e][j] for the kRows rows of a ([kRows, dhp])
// and keys j < n8 (a multiple of 8, <= kp); s is [kRows, kp].
FUSIONRL_KERNEL_BODY void Scores(const float* a, const float* bt, const Dims& d,
                                 int64_t n8, float* s) {
  for (int64_t j = 0; j < n8; j += kLanes) {
    V8 acc[kRows] = {};
    for (int64_t e = 0; e < d.dhp; ++e) {
      const V8 b = Load8(bt + e * d.kp + j);
      for (int64_t r = 0; r < kRows; ++r) acc[r] += a[r * d.dhp + e] * b;
    }
    for (int64_t r = 0; r < kRows; ++r) Store8(s + r * d.kp + j, acc[r]);
  }
}

// out[r] = sum_{j < n} w[r][j] * m[j] for [kRows, kp] weights and [*, dhp]
// rows m; out is [kRows, dhp].
FUSIONRL_KERNEL_BODY void WeightedRows(const float* w, const float* m,
                                       const Dims& d, int64_t n, float* out) {
  for (int64_t e = 0; e < d.dhp; e += kLanes) {
    V8 acc[kRows] = {};
    for (int64_t j = 0; j < n; ++j) {
      const V8 x = Load8(m + j * d.dhp + e);
      for (int64_t r = 0; r < kRows; ++r) acc[r] += w[r * d.kp + j] * x;
    }
    for (int64_t r = 0; r < kRows; ++r) Store8(out + r * d.dhp + e, acc[r]);
  }
}

// m[j] += sum_r w[r][j] * a[r] for j < n: [kRows, kp] weights, [kRows, dhp]
// rows a, [*, dhp] rows m.
FUSIONRL_KERNEL_BODY void AddToKeys(const float* w, const float* a,
                                    const Dims& d, int64_t n, float* m) {
  for (int64_t e = 0; e < d.dhp; e += kLanes) {
    V8 ar[kRows];
    for (int64_t r = 0; r < kRows; ++r) ar[r] = Load8(a + r * d.dhp + e);
    for (int64_t j = 0; j < n; ++j) {
      V8 acc = Load8(m + j * d.dhp + e);
      for (int64_t r = 0; r < kRows; ++r) acc += w[r * d.kp + j] * ar[r];
      Store8(m + j * d.dhp + e, acc);
    }
  }
}

// The key ranges of the block of queries [i0, i0 + kRows): ends[r] (0 for
// rows past T) and their maximum.
int64_t BlockEnds(const CoreInputs& in, int64_t b, int64_t i0,
                  int64_t ends[kRows]) {
  int64_t n = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t i = i0 + r;
    ends[r] = i < in.queries ? KeyEnd(in.mask + b * in.mask_batch_stride +
                                          i * in.mask_query_stride,
                                      in.keys)
                             : 0;
    n = std::max(n, ends[r]);
  }
  return n;
}

const bool* MaskRow(const CoreInputs& in, int64_t b, int64_t i) {
  return in.mask + b * in.mask_batch_stride + i * in.mask_query_stride;
}

Dims DimsOf(const CoreInputs& in) {
  Dims d;
  d.dh = in.head_dim;
  d.dhp = RoundUp(in.head_dim, kLanes);
  d.nk = in.keys;
  d.kp = RoundUp(in.keys, kLanes);
  d.t = in.queries;
  d.tp = RoundUp(in.queries, kRows);
  return d;
}

// Items [i0, i1) of batch x query heads.
FUSIONRL_KERNEL_BODY void ForwardBody(const CoreInputs& in, float* out,
                                      const Strides& os, float* lse, int64_t i0,
                                      int64_t i1) {
  const Dims d = DimsOf(in);
  const int64_t rep = in.heads / in.kv_heads;
  std::vector<float> q(d.tp * d.dhp), kt(d.dhp * d.kp), v(d.kp * d.dhp),
      s(kRows * d.kp), o(kRows * d.dhp);
  int64_t loaded = -1;  // the (b, kv head) in kt and v
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t b = item / in.heads, h = item % in.heads, g = h / rep;
    if (loaded != b * in.kv_heads + g) {
      CopyTransposed(in.k, in.k_strides, b, g, d, kt.data());
      CopyRows(in.v, in.v_strides, b, g, d.nk, d.kp, d, v.data());
      loaded = b * in.kv_heads + g;
    }
    CopyRows(in.q, in.q_strides, b, h, d.t, d.tp, d, q.data());
    for (int64_t q0 = 0; q0 < d.tp; q0 += kRows) {
      int64_t ends[kRows];
      const int64_t n = BlockEnds(in, b, q0, ends);
      if (n > 0) {
        Scores(q.data() + q0 * d.dhp, kt.data(), d, RoundUp(n, kLanes),
               s.data());
      }
      for (int64_t r = 0; r < kRows && q0 + r < d.t; ++r) {
        float* p = s.data() + r * d.kp;
        float* lse_i = lse + item * d.t + q0 + r;
        if (ends[r] == 0) {
          std::fill(p, p + n, 0.0f);
          *lse_i = kNegInf;
          continue;
        }
        const bool* allowed = MaskRow(in, b, q0 + r);
        const int64_t e = ends[r];
        // Branch-free passes over [0, e) so that each vectorises; keys
        // past e, and masked ones inside, get exactly 0.
        float m = kNegInf;
        for (int64_t j = 0; j < e; ++j) {
          if (allowed[j]) m = std::max(m, p[j] * in.scale);
        }
        ExpAffineInPlace(p, e, in.scale, m);
        for (int64_t j = 0; j < e; ++j) p[j] *= static_cast<float>(allowed[j]);
        std::fill(p + e, p + n, 0.0f);
        const float total = Sum(p, e);
        const float inv = 1.0f / total;
        for (int64_t j = 0; j < e; ++j) p[j] *= inv;
        *lse_i = m + std::log(total);
      }
      if (n > 0) {
        WeightedRows(s.data(), v.data(), d, n, o.data());
      } else {
        std::fill(o.begin(), o.end(), 0.0f);
      }
      for (int64_t r = 0; r < kRows && q0 + r < d.t; ++r) {
        std::memcpy(Row(out, os, b, h, q0 + r), o.data() + r * d.dhp,
                    d.dh * sizeof(float));
      }
    }
  }
}
FUSIONRL_AVX2 void ForwardRangeAvx2(const CoreInputs& in, float* out,
                                    const Strides& os, float* lse, int64_t i0,
                                    int64_t i1) {
  ForwardBody(in, out, os, lse, i0, i1);
}
void ForwardRange(const CoreInputs& in, float* out, const Strides& os,
                  float* lse, int64_t i0, int64_t i1) {
  if (kernel_math::CpuHasAvx2Fma()) {
    ForwardRangeAvx2(in, out, os, lse, i0, i1);
  } else {
    ForwardBody(in, out, os, lse, i0, i1);
  }
}

// Items [i0, i1) of batch x key/value heads: each owns its dk and dv rows
// and sums into them over the query heads that read it.
FUSIONRL_KERNEL_BODY void BackwardBody(const CoreInputs& in, const float* out,
                                       const Strides& os, const float* lse,
                                       const float* go, const Strides& gs,
                                       const CoreGrads& gr, int64_t i0,
                                       int64_t i1) {
  const Dims d = DimsOf(in);
  const int64_t rep = in.heads / in.kv_heads;
  std::vector<float> q(d.tp * d.dhp), dout(d.tp * d.dhp), kt(d.dhp * d.kp),
      vt(d.dhp * d.kp), k(d.kp * d.dhp), dk(d.kp * d.dhp), dv(d.kp * d.dhp),
      p(kRows * d.kp), ds(kRows * d.kp), dq(kRows * d.dhp), delta(d.tp);
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t b = item / in.kv_heads, g = item % in.kv_heads;
    CopyTransposed(in.k, in.k_strides, b, g, d, kt.data());
    CopyTransposed(in.v, in.v_strides, b, g, d, vt.data());
    CopyRows(in.k, in.k_strides, b, g, d.nk, d.kp, d, k.data());
    std::fill(dk.begin(), dk.end(), 0.0f);
    std::fill(dv.begin(), dv.end(), 0.0f);
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      CopyRows(in.q, in.q_strides, b, h, d.t, d.tp, d, q.data());
      CopyRows(go, gs, b, h, d.t, d.tp, d, dout.data());
      for (int64_t i = 0; i < d.t; ++i) {
        const float* o = Row(out, os, b, h, i);
        const float* g_i = dout.data() + i * d.dhp;
        float sum = 0;
        for (int64_t e = 0; e < d.dh; ++e) sum += g_i[e] * o[e];
        delta[i] = sum;
      }
      const float* lse_h = lse + (b * in.heads + h) * d.t;
      for (int64_t q0 = 0; q0 < d.tp; q0 += kRows) {
        int64_t ends[kRows];
        const int64_t n = BlockEnds(in, b, q0, ends);
        if (n == 0) {
          for (int64_t r = 0; r < kRows && q0 + r < d.t; ++r) {
            float* dqi = Row(gr.dq, gr.dq_strides, b, h, q0 + r);
            std::fill(dqi, dqi + d.dh, 0.0f);
          }
          continue;
        }
        const int64_t n8 = RoundUp(n, kLanes);
        Scores(q.data() + q0 * d.dhp, kt.data(), d, n8, p.data());
        Scores(dout.data() + q0 * d.dhp, vt.data(), d, n8, ds.data());
        for (int64_t r = 0; r < kRows; ++r) {
          float* pr = p.data() + r * d.kp;
          float* dsr = ds.data() + r * d.kp;
          const bool live =
              q0 + r < d.t && ends[r] > 0 && lse_h[q0 + r] != kNegInf;
          if (!live) {
            std::fill(pr, pr + n, 0.0f);
            std::fill(dsr, dsr + n, 0.0f);
            continue;
          }
          const bool* allowed = MaskRow(in, b, q0 + r);
          const float l = lse_h[q0 + r], dl = delta[q0 + r];
          const int64_t e = ends[r];
          ExpAffineInPlace(pr, e, in.scale, l);
          for (int64_t j = 0; j < e; ++j) {
            pr[j] *= static_cast<float>(allowed[j]);
            dsr[j] = pr[j] * (dsr[j] - dl) * in.scale;
          }
          std::fill(pr + e, pr + n, 0.0f);
          std::fill(dsr + e, dsr + n, 0.0f);
        }
        WeightedRows(ds.data(), k.data(), d, n, dq.data());
        for (int64_t r = 0; r < kRows && q0 + r < d.t; ++r) {
          std::memcpy(Row(gr.dq, gr.dq_strides, b, h, q0 + r),
                      dq.data() + r * d.dhp, d.dh * sizeof(float));
        }
        AddToKeys(ds.data(), q.data() + q0 * d.dhp, d, n, dk.data());
        AddToKeys(p.data(), dout.data() + q0 * d.dhp, d, n, dv.data());
      }
    }
    for (int64_t j = 0; j < d.nk; ++j) {
      std::memcpy(Row(gr.dk, gr.dk_strides, b, g, j), dk.data() + j * d.dhp,
                  d.dh * sizeof(float));
      std::memcpy(Row(gr.dv, gr.dv_strides, b, g, j), dv.data() + j * d.dhp,
                  d.dh * sizeof(float));
    }
  }
}
FUSIONRL_AVX2 void BackwardRangeAvx2(const CoreInputs& in, const float* out,
                                     const Strides& os, const float* lse,
                                     const float* go, const Strides& gs,
                                     const CoreGrads& gr, int64_t i0,
                                     int64_t i1) {
  BackwardBody(in, out, os, lse, go, gs, gr, i0, i1);
}
void BackwardRange(const CoreInputs& in, const float* out, const Strides& os,
                   const float* lse, const float* go, const Strides& gs,
                   const CoreGrads& gr, int64_t i0, int64_t i1) {
  if (kernel_math::CpuHasAvx2Fma()) {
    BackwardRangeAvx2(in, out, os, lse, go, gs, gr, i0, i1);
  } else {
    BackwardBody(in, out, os, lse, go, gs, gr, i0, i1);
  }
}

}  // namespace

void CoreForward(const CoreInputs& in, float* out, const Strides& out_strides,
                 float* lse) {
  // About half the (query, key) pairs of a causal mask: 2 Dh each.
  const int64_t work = in.queries * in.keys * in.head_dim;
  at::parallel_for(0, in.batch * in.heads, Grain(work),
                   [&](int64_t i0, int64_t i1) {
                     ForwardRange(in, out, out_strides, lse, i0, i1);
                   });
}

void CoreBackward(const CoreInputs& in, const float* out,
                  const Strides& out_strides, const float* lse,
                  const float* grad_out, const Strides& grad_out_strides,
                  const CoreGrads& grads) {
  const int64_t rep = in.heads / in.kv_heads;
  const int64_t work = 3 * rep * in.queries * in.keys * in.head_dim;
  at::parallel_for(0, in.batch * in.kv_heads, Grain(work),
                   [&](int64_t i0, int64_t i1) {
                     BackwardRange(in, out, out_strides, lse, grad_out,
                                   grad_out_strides, grads, i0, i1);
                   });
}

}  // namespace fusionrl::attention_kernels
