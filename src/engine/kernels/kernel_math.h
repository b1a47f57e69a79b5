// Scalar helpers shared by the engine's fused CPU kernels
// (engine/kernels/decode_kernels.cc, engine/kernels/attention_kernels.cc): a
// vectorisable exp, a dot product in independent partial sums, a work-sized
// grain for at::parallel_for, and the run-time choice between an AVX2 + FMA
// build of a hot loop and a generic one. Internal to those .cc files.
#ifndef FUSIONRL_ENGINE_KERNELS_KERNEL_MATH_H_
#define FUSIONRL_ENGINE_KERNELS_KERNEL_MATH_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

// The hot loops are compiled twice: for AVX2 + FMA (x86-64-v3: every x86
// server of the last decade) and generic, and each kernel picks one at run
// time from the CPU's feature bits. A kernel's body is an always-inline
// function (FUSIONRL_KERNEL_BODY) called from a FUSIONRL_AVX2 wrapper and
// from a generic one. (GCC's target_clones("arch=haswell") was used first:
// its resolver asks __builtin_cpu_is("haswell"), which is false on every
// other AVX2 CPU, AMD EPYC included, so the generic clone ran.)
#if defined(__x86_64__) && defined(__GNUC__)
#define FUSIONRL_AVX2 __attribute__((target("avx2,fma")))
#else
#define FUSIONRL_AVX2
#endif
#define FUSIONRL_KERNEL_BODY inline __attribute__((always_inline))

// The generic build's note on passing 8-float vectors without AVX does
// not apply: they only travel between always-inline helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace fusionrl::kernel_math {

// Whether this CPU runs the FUSIONRL_AVX2 builds.
inline bool CpuHasAvx2Fma() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

constexpr int kLanes = 8;  // independent partial sums: lets loops vectorise

// exp(x) for |x| <= ln(2) / 2 (Cephes' degree-6 polynomial), for a float
// or 8 lanes of them.
template <class T>
FUSIONRL_KERNEL_BODY T ExpReduced(T x) {
  const T z = x * x;
  T y = T{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  return y * z + x + 1.0f;
}

// exp(x) for float, to ~2 ulp (Cephes' expf: range reduction by ln 2 in two
// parts and a degree-6 polynomial), written so that a loop over it
// vectorises; glibc's expf does not. Inputs are clamped to [-87.3, 88.3]
// (exp(-87.3) ~ 1e-38: 0 for a softmax or a sigmoid).
FUSIONRL_KERNEL_BODY float Exp(float x) {
  const float kMax = 88.3762626647949f, kMin = -87.3365478515625f;
  x = std::max(std::min(x, kMax), kMin);
  const float t = x * 1.44269504088896341f + 0.5f;
  int32_t i = static_cast<int32_t>(t);
  i -= t < static_cast<float>(i) ? 1 : 0;  // floor
  const float fx = static_cast<float>(i);
  x -= fx * 0.693359375f;
  x -= fx * -2.12194440e-4f;
  const float y = ExpReduced(x);
  const int32_t bits = (i + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// sum_i a[i] b[i] in kLanes partial sums.
FUSIONRL_KERNEL_BODY float Dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// 8 floats (or int32s) as one value: one AVX register in the AVX2 build,
// two SSE registers in the generic one (GCC vector extensions).
typedef float V8 __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t V8i __attribute__((vector_size(kLanes * sizeof(int32_t))));

FUSIONRL_KERNEL_BODY V8 Load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
FUSIONRL_KERNEL_BODY void Store8(float* p, V8 v) {
  std::memcpy(p, &v, sizeof(v));
}

// Exp on 8 lanes: the same range reduction as Exp above.
FUSIONRL_KERNEL_BODY V8 Exp8(V8 x) {
  const V8 hi = V8{} + 88.3762626647949f, lo = V8{} - 87.3365478515625f;
  x = x < hi ? x : hi;
  x = x > lo ? x : lo;
  const V8 t = x * 1.44269504088896341f + 0.5f;
  V8i i = __builtin_convertvector(t, V8i);
  i += t < __builtin_convertvector(i, V8);  // floor: true is -1
  const V8 fx = __builtin_convertvector(i, V8);
  x -= fx * 0.693359375f;
  x -= fx * -2.12194440e-4f;
  return ExpReduced(x) * reinterpret_cast<V8>((i + 127) << 23);
}

// p[i] = exp(a * p[i] - c), i < n.
FUSIONRL_KERNEL_BODY void ExpAffineInPlace(float* p, int64_t n, float a,
                                           float c) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store8(p + i, Exp8(Load8(p + i) * a - c));
  }
  for (; i < n; ++i) p[i] = Exp(a * p[i] - c);
}

// sum_i a[i] in kLanes partial sums.
FUSIONRL_KERNEL_BODY float Sum(const float* a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i];
  return s;
}

// Items per at::parallel_for task so that each carries about 32k
// multiply-adds.
inline int64_t Grain(int64_t work_per_item) {
  constexpr int64_t kWork = 1 << 15;
  return std::max<int64_t>(1, kWork / std::max<int64_t>(1, work_per_item));
}

}  // namespace fusionrl::kernel_math

#pragma GCC diagnostic pop

#endif  // FUSIONRL_ENGINE_KERNELS_KERNEL_MATH_H_
