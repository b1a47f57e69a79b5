#include "engine/kernels/decode_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/kernels/kernel_math.h"

namespace fusionrl::decode {
namespace {

using kernel_math::Dot;
using kernel_math::Exp;

inline float SumSquares(const float* x, int64_t d) { return Dot(x, x, d); }

FUSIONRL_KERNEL_BODY void RmsNormBody(const float* x, const float* w, float* y,
                                      int64_t r0, int64_t r1, int64_t d,
                                      float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float inv =
        1.0f / std::sqrt(SumSquares(xr, d) / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
  }
}
FUSIONRL_AVX2 void RmsNormRangeAvx2(const float* x, const float* w, float* y,
                                    int64_t r0, int64_t r1, int64_t d,
                                    float eps) {
  RmsNormBody(x, w, y, r0, r1, d, eps);
}
void RmsNormRange(const float* x, const float* w, float* y, int64_t r0,
                  int64_t r1, int64_t d, float eps) {
  if (kernel_math::CpuHasAvx2Fma()) {
    RmsNormRangeAvx2(x, w, y, r0, r1, d, eps);
  } else {
    RmsNormBody(x, w, y, r0, r1, d, eps);
  }
}

// RMSNorm of one head vector in place (qk_norm).
inline void NormHead(float* x, const float* w, int64_t d, float eps) {
  const float inv =
      1.0f / std::sqrt(SumSquares(x, d) / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) x[i] = x[i] * inv * w[i];
}

// Half-split rotation of one head vector in place.
inline void RotateHead(float* x, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x1 * s[i] + x2 * c[i];
  }
}

FUSIONRL_KERNEL_BODY void RotaryBody(float* q, float* k, const float* v,
                                     const float* cos, const float* sin,
                                     const int64_t* pos, const int64_t* len,
                                     const float* q_norm, const float* k_norm,
                                     float eps, const KvLayout& lo,
                                     float* cache_k, float* cache_v, int64_t r0,
                                     int64_t r1) {
  const int64_t dh = lo.head_dim, half = dh / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* c = cos + pos[r] * half;
    const float* s = sin + pos[r] * half;
    for (int64_t h = 0; h < lo.heads; ++h) {
      float* qh = q + (r * lo.heads + h) * dh;
      if (q_norm != nullptr) NormHead(qh, q_norm, dh, eps);
      RotateHead(qh, c, s, half);
    }
    for (int64_t h = 0; h < lo.kv_heads; ++h) {
      float* kh = k + (r * lo.kv_heads + h) * dh;
      if (k_norm != nullptr) NormHead(kh, k_norm, dh, eps);
      RotateHead(kh, c, s, half);
      const int64_t slot = ((r * lo.kv_heads + h) * lo.capacity + len[r]) * dh;
      std::memcpy(cache_k + slot, kh, dh * sizeof(float));
      std::memcpy(cache_v + slot, v + (r * lo.kv_heads + h) * dh,
                  dh * sizeof(float));
    }
  }
}
FUSIONRL_AVX2 void RotaryRangeAvx2(float* q, float* k, const float* v,
                                   const float* cos, const float* sin,
                                   const int64_t* pos, const int64_t* len,
                                   const float* q_norm, const float* k_norm,
                                   float eps, const KvLayout& lo,
                                   float* cache_k, float* cache_v, int64_t r0,
                                   int64_t r1) {
  RotaryBody(q, k, v, cos, sin, pos, len, q_norm, k_norm, eps, lo, cache_k,
             cache_v, r0, r1);
}
void RotaryRange(float* q, float* k, const float* v, const float* cos,
                 const float* sin, const int64_t* pos, const int64_t* len,
                 const float* q_norm, const float* k_norm, float eps,
                 const KvLayout& lo, float* cache_k, float* cache_v, int64_t r0,
                 int64_t r1) {
  if (kernel_math::CpuHasAvx2Fma()) {
    RotaryRangeAvx2(q, k, v, cos, sin, pos, len, q_norm, k_norm, eps, lo,
                    cache_k, cache_v, r0, r1);
  } else {
    RotaryBody(q, k, v, cos, sin, pos, len, q_norm, k_norm, eps, lo, cache_k,
               cache_v, r0, r1);
  }
}

// Items [i0, i1) of rows x query heads: each query head of a row over the
// row's cache entries of its key/value head.
FUSIONRL_KERNEL_BODY void AttendBody(const float* q, const float* cache_k,
                                     const float* cache_v, const int64_t* len,
                                     const KvLayout& lo, float* out, int64_t i0,
                                     int64_t i1) {
  const int64_t dh = lo.head_dim;
  const int64_t rep = lo.heads / lo.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  std::vector<float> scores(lo.capacity);
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t r = item / lo.heads, h = item % lo.heads;
    const int64_t n = len[r];
    const float* qh = q + item * dh;
    const int64_t base = (r * lo.kv_heads + h / rep) * lo.capacity * dh;
    const float* keys = cache_k + base;
    const float* values = cache_v + base;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      scores[j] = Dot(qh, keys + j * dh, dh) * scale;
      m = std::max(m, scores[j]);
    }
    float total = 0;
    for (int64_t j = 0; j < n; ++j) {
      scores[j] = Exp(scores[j] - m);
      total += scores[j];
    }
    const float inv = 1.0f / total;
    float* o = out + item * dh;
    std::fill(o, o + dh, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float p = scores[j] * inv;
      const float* vj = values + j * dh;
      for (int64_t i = 0; i < dh; ++i) o[i] += p * vj[i];
    }
  }
}
FUSIONRL_AVX2 void AttendRangeAvx2(const float* q, const float* cache_k,
                                   const float* cache_v, const int64_t* len,
                                   const KvLayout& lo, float* out, int64_t i0,
                                   int64_t i1) {
  AttendBody(q, cache_k, cache_v, len, lo, out, i0, i1);
}
void AttendRange(const float* q, const float* cache_k, const float* cache_v,
                 const int64_t* len, const KvLayout& lo, float* out, int64_t i0,
                 int64_t i1) {
  if (kernel_math::CpuHasAvx2Fma()) {
    AttendRangeAvx2(q, cache_k, cache_v, len, lo, out, i0, i1);
  } else {
    AttendBody(q, cache_k, cache_v, len, lo, out, i0, i1);
  }
}

FUSIONRL_KERNEL_BODY void SwiGluBody(float* g, const float* u, int64_t i0,
                                     int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float x = g[i];
    g[i] = x / (1.0f + Exp(-x)) * u[i];
  }
}
FUSIONRL_AVX2 void SwiGluRangeAvx2(float* g, const float* u, int64_t i0,
                                   int64_t i1) {
  SwiGluBody(g, u, i0, i1);
}
void SwiGluRange(float* g, const float* u, int64_t i0, int64_t i1) {
  if (kernel_math::CpuHasAvx2Fma()) {
    SwiGluRangeAvx2(g, u, i0, i1);
  } else {
    SwiGluBody(g, u, i0, i1);
  }
}

using kernel_math::Grain;

}  // namespace

void RmsNormRows(const float* x, const float* w, float* y, int64_t n, int64_t d,
                 float eps) {
  at::parallel_for(0, n, Grain(2 * d), [&](int64_t r0, int64_t r1) {
    RmsNormRange(x, w, y, r0, r1, d, eps);
  });
}

void RotaryAppendKv(float* q, float* k, const float* v, const float* cos,
                    const float* sin, const int64_t* pos, const int64_t* len,
                    const float* q_norm, const float* k_norm, float norm_eps,
                    const KvLayout& layout, float* cache_k, float* cache_v,
                    int64_t n) {
  const int64_t per_row = (layout.heads + 2 * layout.kv_heads) *
                          layout.head_dim * (q_norm != nullptr ? 3 : 2);
  at::parallel_for(0, n, Grain(per_row), [&](int64_t r0, int64_t r1) {
    RotaryRange(q, k, v, cos, sin, pos, len, q_norm, k_norm, norm_eps, layout,
                cache_k, cache_v, r0, r1);
  });
}

void DecodeAttention(const float* q, const float* cache_k, const float* cache_v,
                     const int64_t* len, const KvLayout& layout, float* out,
                     int64_t n) {
  int64_t longest = 1;
  for (int64_t r = 0; r < n; ++r) longest = std::max(longest, len[r]);
  at::parallel_for(0, n * layout.heads, Grain(2 * longest * layout.head_dim),
                   [&](int64_t i0, int64_t i1) {
                     AttendRange(q, cache_k, cache_v, len, layout, out, i0, i1);
                   });
}

void SwiGluInPlace(float* g, const float* u, int64_t count) {
  at::parallel_for(0, count, Grain(8),
                   [&](int64_t i0, int64_t i1) { SwiGluRange(g, u, i0, i1); });
}

}  // namespace fusionrl::decode
