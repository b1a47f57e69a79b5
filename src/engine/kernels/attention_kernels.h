// Fused CPU kernels of the attention core over whole sequences (training
// forward and backward, prompt prefill): softmax(q k^T * scale, masked) v
// with grouped-query heads, in one pass per (sequence, head) and no
// [B, H, T, K] tensor of scores or probabilities.
//
//  * CoreForward: the output and each query's log-sum-exp of its scores.
//  * CoreBackward: dq, dk, dv from the output's gradient, recomputing the
//    probabilities from q, k and the log-sum-exp (FlashAttention's
//    backward: dV = P^T dO; dS = P * (dO V^T - rowsum(dO * O)); dQ = dS K
//    * scale; dK = dS^T Q * scale), so what the forward keeps for backward
//    is q, k, v, the output and one float per query.
//
// The composite ATen path (engine/model/attention.cc, AttentionImpl::Core) is
// the reference: matmul over batch x heads (which LibTorch's CPU bmm runs as
// one select + addmm per matrix), masked_fill, softmax, matmul, and autograd
// saving the probabilities. Results agree to float rounding
// (attention_kernels_test in engine_test).
//
// Tensors are float32 with a contiguous last dimension (Dh) and any strides
// elsewhere, described by Strides. Query head h reads key/value head
// h / (heads / kv_heads). The mask is a row-major bool [B, T, K] (batch
// stride 0 broadcasts one mask): true = attend. A query with no key allowed
// gets a zero output, a log-sum-exp of -inf and zero gradients.
//
// Thread safety: pure functions of their arguments; each parallelises over
// (sequence, head) items with at::parallel_for.
#ifndef FUSIONRL_ENGINE_KERNELS_ATTENTION_KERNELS_H_
#define FUSIONRL_ENGINE_KERNELS_ATTENTION_KERNELS_H_

#include <cstdint>

namespace fusionrl::attention_kernels {

// Element strides of a [B, heads, T, Dh] tensor whose Dh is contiguous.
struct Strides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t pos = 0;
};

struct CoreInputs {
  int64_t batch = 0;
  int64_t heads = 0;         // query heads H
  int64_t kv_heads = 0;      // key/value heads, H % kv_heads == 0
  int64_t queries = 0;       // T
  int64_t keys = 0;          // K
  int64_t head_dim = 0;      // Dh
  float scale = 1.0f;        // usually 1 / sqrt(Dh)
  const float* q = nullptr;  // [B, H, T, Dh]
  Strides q_strides;
  const float* k = nullptr;  // [B, KvH, K, Dh]
  Strides k_strides;
  const float* v = nullptr;  // [B, KvH, K, Dh]
  Strides v_strides;
  const bool* mask = nullptr;  // [B, T, K]
  int64_t mask_batch_stride = 0;
  int64_t mask_query_stride = 0;
};

// out [B, H, T, Dh] (out_strides); lse [B, H, T] contiguous.
void CoreForward(const CoreInputs& in, float* out, const Strides& out_strides,
                 float* lse);

// From the forward's out and lse and grad_out (all [B, H, T, Dh] but lse):
// dq [B, H, T, Dh], dk and dv [B, KvH, K, Dh], each overwritten.
struct CoreGrads {
  float* dq = nullptr;
  Strides dq_strides;
  float* dk = nullptr;
  Strides dk_strides;
  float* dv = nullptr;
  Strides dv_strides;
};
void CoreBackward(const CoreInputs& in, const float* out,
                  const Strides& out_strides, const float* lse,
                  const float* grad_out, const Strides& grad_out_strides,
                  const CoreGrads& grads);

}  // namespace fusionrl::attention_kernels

#endif  // FUSIONRL_ENGINE_KERNELS_ATTENTION_KERNELS_H_
