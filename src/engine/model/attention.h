// The attention sub-block of the policy's decoder layers: grouped-query
// causal attention with rotary positions (rope scaling included), the mask
// it reads, and the RMSNorm it and the layers normalise with. Internal to
// the engine: include only from .cc files (it pulls in LibTorch's nn
// headers, which the engine's public headers keep out).
//
// Layout conventions are engine/model/model.h's. Not thread-safe: modules are
// used by one thread at a time (the model's contract).
#ifndef FUSIONRL_ENGINE_MODEL_ATTENTION_H_
#define FUSIONRL_ENGINE_MODEL_ATTENTION_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <utility>

#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "fusionrl/config.h"

namespace fusionrl {

// x * rsqrt(mean(x^2) + eps) * weight, computed in float32.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Attention mask for queries at slots [start, start + t) over keys
// [0, start + t): causal, valid keys only, and always the query's own slot.
// key_valid [B, K] bool -> [B, 1, t, K] bool.
torch::Tensor AttentionMask(const torch::Tensor& key_valid, int64_t start,
                            int64_t t);

// Rotary tables (cos, sin) for every position, [max_seq_len, Dh/2] float32,
// from the inverse frequencies theta^(-2i/Dh), i < Dh/2, computed in float64
// with Hugging Face's rope_scaling applied (linear: all / factor; llama3: by
// wavelength, transformers' _compute_llama3_parameters).
std::pair<torch::Tensor, torch::Tensor> RotaryTables(const ModelConfig& c);

// softmax(q k^T / sqrt(Dh), masked) v through the fused CPU kernels
// (engine/kernels/attention_kernels.h) as one autograd node, for q [B, H, T,
// Dh], k and v [B, KvH, K, Dh] and a bool mask [B or 1, 1, T, K]; an undefined
// tensor where they do not apply (not float32 on CPU).
torch::Tensor FusedAttentionCore(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v,
                                 const torch::Tensor& mask);

// Grouped-query attention: n_heads query heads share n_kv_heads key/value
// heads (query head h reads kv head h / (n_heads / n_kv_heads), as Hugging
// Face's repeat_kv), each of head_dim. Qwen2 adds biases to q/k/v; Qwen3
// normalises each head's q and k (RMSNorm over head_dim) before rotary.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c);

  // x [B, T, D]; cos/sin [B, 1, T, Dh/2]; mask [B, 1, T, K].
  // With a cache, k/v are written at slots [cache_start, cache_start + T) of
  // cache_k/cache_v and attention runs over slots [0, cache_start + T).
  // Without one, `first_query` > 0 computes the outputs of positions
  // [first_query, T) only, over the keys of every position: [B, T -
  // first_query, D], with mask [B, 1, T - first_query, T].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask,
                        torch::Tensor* cache_k, torch::Tensor* cache_v,
                        int64_t cache_start, int64_t first_query = 0);

  static int64_t KvHeads(const ModelConfig& c) {
    return c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads;
  }
  static int64_t HeadDim(const ModelConfig& c) {
    return c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads;
  }

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only
  // LoRA adapters of wq, wk, wv, wo (owned by the model; null: none, or
  // merged into the weight).
  std::array<const LoraAdapter*, 4> lora{};

  // The core through FusedAttentionCore where it applies
  // (model.attention_kernel: fused), else the composite ATen ops.
  bool fused_core = true;
  // Selective recompute of the core (model.activations.attention_core): in a
  // forward with autograd on and no cache, the scores, mask, softmax and
  // weighted sum run as one recompute node that saves only q, k and v.
  bool recompute_core = false;
  // Profiling (PolicyModel::set_sub_block_timer): the core's forward time
  // goes to timer->seconds[layer][kAttentionCoreSlot].
  SubBlockTimer* timer = nullptr;
  int layer = 0;

 private:
  // softmax(q k^T / sqrt(Dh), masked) v for q [B, H, T, Dh] and k, v
  // [B, KvH, K, Dh] -> [B, H, T, Dh]: fused or composite (fused_core).
  torch::Tensor Core(const torch::Tensor& q, const torch::Tensor& k,
                     const torch::Tensor& v, const torch::Tensor& mask) const;

  int64_t n_heads_;
  int64_t n_kv_heads_;
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_ATTENTION_H_
