// The attention sub-block of the policy's decoder layers
// (engine/model/attention.h): RMSNorm, the attention mask, rotary tables and
// grouped-query attention.
#include "engine/model/attention.h"

#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/kernels/attention_kernels.h"
#include "engine/kernels/invariant_ops.h"
#include "engine/model/recompute.h"
#include "engine/model/sub_block_timing.h"

namespace fusionrl {
namespace {

// Rotary inverse frequencies theta^(-2i/Dh), i < Dh/2, in float64, with
// Hugging Face's rope_scaling applied (linear: all / factor; llama3: by
// wavelength, transformers' _compute_llama3_parameters).
torch::Tensor RotaryInverseFrequencies(const ModelConfig& c) {
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads;
  auto inv_freq = torch::pow(
      c.rope_theta, -torch::arange(0, head_dim, 2, torch::kDouble) / head_dim);
  const RopeScalingConfig& r = c.rope_scaling;
  if (r.type == "linear") return inv_freq / r.factor;
  if (r.type != "llama3") return inv_freq;
  const double old_len = r.original_max_position_embeddings;
  const double low_wavelen = old_len / r.low_freq_factor;
  const double high_wavelen = old_len / r.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  auto scaled =
      torch::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (old_len / wavelen - r.low_freq_factor) /
                (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// Rotary embedding, half-split convention (x1, x2) -> (x1 c - x2 s,
// x1 s + x2 c): Hugging Face's rotate_half, not the interleaved pairs.
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos,
                     const torch::Tensor& sin) {
  auto halves = x.chunk(2, -1);
  const auto& x1 = halves[0];
  const auto& x2 = halves[1];
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1)
      .to(x.scalar_type());
}

namespace ak = attention_kernels;

ak::Strides StridesOf(const torch::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2)};
}

// Whether the fused kernels take these operands: float32 on CPU, [B, H, T,
// Dh] / [B, KvH, K, Dh], a bool mask [B or 1, 1, T, K].
bool FusedCoreSupports(const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, const torch::Tensor& mask) {
  for (const torch::Tensor* t : {&q, &k, &v}) {
    if (!t->device().is_cpu() || t->scalar_type() != torch::kFloat ||
        t->dim() != 4) {
      return false;
    }
  }
  return mask.device().is_cpu() && mask.scalar_type() == torch::kBool &&
         mask.dim() == 4 && mask.size(1) == 1 &&
         (mask.size(0) == q.size(0) || mask.size(0) == 1) &&
         mask.size(2) == q.size(2) && mask.size(3) == k.size(2) &&
         k.sizes() == v.sizes() && q.size(1) % k.size(1) == 0;
}

// The last dimension contiguous, as the kernels read it.
torch::Tensor InnerContiguous(const torch::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

ak::CoreInputs CoreInputsOf(const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const torch::Tensor& mask) {
  ak::CoreInputs in;
  in.batch = q.size(0);
  in.heads = q.size(1);
  in.kv_heads = k.size(1);
  in.queries = q.size(2);
  in.keys = k.size(2);
  in.head_dim = q.size(3);
  in.scale = 1.0f / std::sqrt(static_cast<float>(in.head_dim));
  in.q = q.data_ptr<float>();
  in.q_strides = StridesOf(q);
  in.k = k.data_ptr<float>();
  in.k_strides = StridesOf(k);
  in.v = v.data_ptr<float>();
  in.v_strides = StridesOf(v);
  in.mask = mask.data_ptr<bool>();
  in.mask_batch_stride = mask.size(0) == 1 ? 0 : mask.stride(0);
  in.mask_query_stride = mask.stride(2);
  return in;
}

// The attention core as one autograd node over the fused kernels. Saves q,
// k, v, the mask, the output and the log-sum-exp per query.
class FusedCore : public torch::autograd::Function<FusedCore> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& q_in,
                               const torch::Tensor& k_in,
                               const torch::Tensor& v_in,
                               const torch::Tensor& mask_in) {
    const torch::Tensor q = InnerContiguous(q_in), k = InnerContiguous(k_in),
                        v = InnerContiguous(v_in),
                        mask = InnerContiguous(mask_in);
    const int64_t b = q.size(0), h = q.size(1), t = q.size(2);
    // [B, T, H, Dh] storage: the caller's transpose + reshape to [B, T, D]
    // is then a view.
    torch::Tensor out =
        torch::empty({b, t, h, q.size(3)}, q.options()).transpose(1, 2);
    torch::Tensor lse = torch::empty({b, h, t}, q.options());
    ak::CoreForward(CoreInputsOf(q, k, v, mask), out.data_ptr<float>(),
                    StridesOf(out), lse.data_ptr<float>());
    ctx->save_for_backward({q, k, v, mask, out, lse});
    return out;
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2],
                        &mask = saved[3], &out = saved[4], &lse = saved[5];
    const torch::Tensor grad_out = InnerContiguous(grads[0]);
    // Gradients in the [B, T, heads, Dh] layout their producers (views of
    // the q/k/v projections) have.
    auto like = [](const torch::Tensor& x) {
      return torch::empty({x.size(0), x.size(2), x.size(1), x.size(3)},
                          x.options())
          .transpose(1, 2);
    };
    torch::Tensor dq = like(q), dk = like(k), dv = like(v);
    ak::CoreGrads g;
    g.dq = dq.data_ptr<float>();
    g.dq_strides = StridesOf(dq);
    g.dk = dk.data_ptr<float>();
    g.dk_strides = StridesOf(dk);
    g.dv = dv.data_ptr<float>();
    g.dv_strides = StridesOf(dv);
    ak::CoreBackward(CoreInputsOf(q, k, v, mask), out.data_ptr<float>(),
                     StridesOf(out), lse.data_ptr<float>(),
                     grad_out.data_ptr<float>(), StridesOf(grad_out), g);
    return {dq, dk, dv, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor FusedAttentionCore(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v,
                                 const torch::Tensor& mask) {
  if (!FusedCoreSupports(q, k, v, mask)) return torch::Tensor();
  return FusedCore::apply(q, k, v, mask);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto xf = x.to(torch::kFloat);
  auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps_);
  return normed.to(x.scalar_type()) * weight;
}

torch::Tensor AttentionMask(const torch::Tensor& key_valid, int64_t start,
                            int64_t t) {
  const int64_t k = key_valid.size(1);
  auto opts =
      torch::TensorOptions().dtype(torch::kLong).device(key_valid.device());
  auto key_idx = torch::arange(k, opts).unsqueeze(0);              // [1, K]
  auto query_idx = (torch::arange(t, opts) + start).unsqueeze(1);  // [t, 1]
  auto causal = key_idx <= query_idx;                              // [t, K]
  auto self = key_idx == query_idx;                                // [t, K]
  auto allowed = causal.unsqueeze(0) &
                 (key_valid.unsqueeze(1) | self.unsqueeze(0));  // [B, t, K]
  return allowed.unsqueeze(1);
}

std::pair<torch::Tensor, torch::Tensor> RotaryTables(const ModelConfig& c) {
  auto inv_freq = RotaryInverseFrequencies(c);
  auto angles =
      torch::outer(torch::arange(c.max_seq_len, torch::kDouble), inv_freq);
  return {torch::cos(angles).to(torch::kFloat),
          torch::sin(angles).to(torch::kFloat)};
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : fused_core(c.attention_kernel == AttentionKernel::kFused),
      n_heads_(c.n_heads),
      n_kv_heads_(KvHeads(c)),
      head_dim_(HeadDim(c)) {
  auto linear = [&](const char* name, int64_t in, int64_t out, bool bias) {
    return register_module(
        name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
  };
  wq = linear("wq", c.d_model, n_heads_ * head_dim_, c.qkv_bias);
  wk = linear("wk", c.d_model, n_kv_heads_ * head_dim_, c.qkv_bias);
  wv = linear("wv", c.d_model, n_kv_heads_ * head_dim_, c.qkv_bias);
  wo = linear("wo", n_heads_ * head_dim_, c.d_model, false);
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.norm_eps));
  }
}

torch::Tensor AttentionImpl::forward(
    const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
    const torch::Tensor& mask, torch::Tensor* cache_k, torch::Tensor* cache_v,
    int64_t cache_start, int64_t first_query) {
  TORCH_CHECK(first_query == 0 || cache_k == nullptr,
              "attention: first_query needs a forward without a cache");
  const int64_t b = x.size(0), t = x.size(1), tq = t - first_query;
  auto split = [&](const torch::Tensor& y, int64_t len, int64_t heads) {
    return y.view({b, len, heads, head_dim_});
  };
  auto proj = [this](const torch::nn::Linear& l, int i,
                     const torch::Tensor& in) {
    return LoraLinear(in, l->weight, l->bias, lora[i], is_training());
  };
  auto q =
      split(proj(wq, 0, first_query > 0 ? x.narrow(1, first_query, tq) : x), tq,
            n_heads_);
  auto k = split(proj(wk, 1, x), t, n_kv_heads_);
  if (!q_norm.is_empty()) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = Rotate(q.transpose(1, 2), cos.narrow(2, first_query, tq),
             sin.narrow(2, first_query, tq));
  k = Rotate(k.transpose(1, 2), cos, sin);
  auto v = split(proj(wv, 2, x), t, n_kv_heads_).transpose(1, 2);
  if (cache_k != nullptr) {
    cache_k->narrow(2, cache_start, t).copy_(k);
    cache_v->narrow(2, cache_start, t).copy_(v);
    k = cache_k->narrow(2, 0, cache_start + t);
    v = cache_v->narrow(2, 0, cache_start + t);
  }
  const bool training = cache_k == nullptr;
  const torch::Tensor out =
      TimeSubBlock(training ? timer : nullptr, layer, kAttentionCoreSlot, [&] {
        if (recompute_core && training && at::GradMode::is_enabled()) {
          return RunRecomputed(
              [this, mask](const std::vector<torch::Tensor>& in) {
                return std::vector<torch::Tensor>{
                    Core(in[0], in[1], in[2], mask)};
              },
              {q, k, v}, {})[0];
        }
        return Core(q, k, v, mask);
      });
  return proj(wo, 3,
              out.transpose(1, 2).reshape({b, tq, n_heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::Core(const torch::Tensor& q,
                                  const torch::Tensor& k_in,
                                  const torch::Tensor& v_in,
                                  const torch::Tensor& mask) const {
  if (fused_core) {
    torch::Tensor out = FusedAttentionCore(q, k_in, v_in, mask);
    if (out.defined()) return out;
  }
  torch::Tensor k = k_in, v = v_in;
  if (n_kv_heads_ != n_heads_) {
    const int64_t rep = n_heads_ / n_kv_heads_;
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
  }
  auto scores = torch::matmul(q, k.transpose(-2, -1)) /
                std::sqrt(static_cast<double>(head_dim_));
  scores = scores.masked_fill(mask.logical_not(),
                              -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1, torch::kFloat).to(v.scalar_type());
  return torch::matmul(probs, v);
}

}  // namespace fusionrl
