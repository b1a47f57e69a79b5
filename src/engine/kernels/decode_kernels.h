// Fused CPU kernels of one decode step (engine/rollout/cpu_decoder.h): the
// small ops between the matmuls of a decoder layer, each one pass over raw
// float32 buffers with no tensor created, where the composite ATen path
// dispatches four to twelve ops and allocates their temporaries. Rows are the
// batch's live sequences (one new token each); every pointer is to contiguous
// row-major float32 data.
//
//  * RmsNormRows: y = x * rsqrt(mean(x^2) + eps) * w, row by row.
//  * RotaryAppendKv: optional per-head RMSNorm of q and k (qk_norm), the
//    half-split rotary rotation of q and k at each row's position, and the
//    append of k and v to the row's slot of the KV cache.
//  * DecodeAttention: single-query attention of each row over its own cache
//    slots [0, length) with grouped-query heads: scores, softmax, the
//    weighted sum of values. Rows have their own lengths (no padding, no
//    mask): what continuous batching and prefix sharing need.
//  * SwiGluInPlace: g = silu(g) * u.
//
// The maths is the composite path's (engine/model/attention.cc, model.cc),
// summed in another order: results agree to float rounding (tests in
// cpu_decoder_test.cc). The inner loops are compiled for AVX2+FMA next to a
// generic version and chosen at run time (engine/kernels/kernel_math.h).
//
// Thread safety: pure functions of their arguments; each parallelises over
// rows (and heads) with at::parallel_for.
#ifndef FUSIONRL_ENGINE_KERNELS_DECODE_KERNELS_H_
#define FUSIONRL_ENGINE_KERNELS_DECODE_KERNELS_H_

#include <cstdint>

namespace fusionrl::decode {

// x, y [n, d]; w [d]. y may equal x.
void RmsNormRows(const float* x, const float* w, float* y, int64_t n, int64_t d,
                 float eps);

struct KvLayout {
  int64_t heads = 0;     // query heads H
  int64_t kv_heads = 0;  // key/value heads (H % kv_heads == 0)
  int64_t head_dim = 0;  // Dh, even
  int64_t capacity = 0;  // cache slots per row
};

// q [n, H*Dh] (rotated in place), k and v [n, KvH*Dh] (k rotated in place);
// cos/sin tables [max_pos, Dh/2]; pos[r] the rotary position of row r, and
// len[r] the cache slot its key and value go to, in cache_k/cache_v
// [rows, KvH, capacity, Dh] (row r is cache row r). q_norm/k_norm [Dh] or
// null (no qk_norm).
void RotaryAppendKv(float* q, float* k, const float* v, const float* cos,
                    const float* sin, const int64_t* pos, const int64_t* len,
                    const float* q_norm, const float* k_norm, float norm_eps,
                    const KvLayout& layout, float* cache_k, float* cache_v,
                    int64_t n);

// out [n, H*Dh] = softmax(q k^T / sqrt(Dh)) v per row and head over the
// row's cache slots [0, len[r]) (len[r] >= 1, the new token included).
void DecodeAttention(const float* q, const float* cache_k, const float* cache_v,
                     const int64_t* len, const KvLayout& layout, float* out,
                     int64_t n);

// g[i] = silu(g[i]) * u[i], i < count.
void SwiGluInPlace(float* g, const float* u, int64_t count);

}  // namespace fusionrl::decode

#endif  // FUSIONRL_ENGINE_KERNELS_DECODE_KERNELS_H_
