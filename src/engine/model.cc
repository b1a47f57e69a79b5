#include "engine/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/activation_memory.h"
#include "engine/moe_module.h"
#include "engine/recompute.h"

namespace fusionrl {
namespace {

// x * rsqrt(mean(x^2) + eps) * weight, computed in float32.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto xf = x.to(torch::kFloat);
    auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps_);
    return normed.to(x.scalar_type()) * weight;
  }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Attention mask for queries at slots [start, start + t) over keys
// [0, start + t): causal, valid keys only, and always the query's own slot.
// key_valid [B, K] bool -> [B, 1, t, K] bool.
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

using torch::autograd::variable_list;
using SubBlockFn = RecomputeFn;

class AttentionImpl : public torch::nn::Module {
 public:
  // Grouped-query attention: n_heads query heads share n_kv_heads key/value
  // heads (query head h reads kv head h / (n_heads / n_kv_heads), as Hugging
  // Face's repeat_kv), each of head_dim. Qwen2 adds biases to q/k/v; Qwen3
  // normalises each head's q and k (RMSNorm over head_dim) before rotary.
  explicit AttentionImpl(const ModelConfig& c)
      : n_heads_(c.n_heads), n_kv_heads_(KvHeads(c)), head_dim_(HeadDim(c)) {
    auto linear = [&](const char* name, int64_t in, int64_t out, bool bias) {
      return register_module(
          name,
          torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
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

  // x [B, T, D]; cos/sin [B, 1, T, Dh/2]; mask [B, 1, T, K].
  // With a cache, k/v are written at slots [cache_start, cache_start + T) of
  // cache_k/cache_v and attention runs over slots [0, cache_start + T).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask,
                        torch::Tensor* cache_k, torch::Tensor* cache_v,
                        int64_t cache_start) {
    const int64_t b = x.size(0), t = x.size(1);
    auto split = [&](const torch::Tensor& y, int64_t heads) {
      return y.view({b, t, heads, head_dim_});
    };
    auto q = split(wq(x), n_heads_);
    auto k = split(wk(x), n_kv_heads_);
    if (!q_norm.is_empty()) {
      q = q_norm(q);
      k = k_norm(k);
    }
    q = Rotate(q.transpose(1, 2), cos, sin);
    k = Rotate(k.transpose(1, 2), cos, sin);
    auto v = split(wv(x), n_kv_heads_).transpose(1, 2);
    if (cache_k != nullptr) {
      cache_k->narrow(2, cache_start, t).copy_(k);
      cache_v->narrow(2, cache_start, t).copy_(v);
      k = cache_k->narrow(2, 0, cache_start + t);
      v = cache_v->narrow(2, 0, cache_start + t);
    }
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
    auto out = torch::matmul(probs, v);
    return wo(out.transpose(1, 2).reshape({b, t, n_heads_ * head_dim_}));
  }

  static int64_t KvHeads(const ModelConfig& c) {
    return c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads;
  }
  static int64_t HeadDim(const ModelConfig& c) {
    return c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads;
  }

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only

 private:
  // Rotary embedding, half-split convention (x1, x2) -> (x1 c - x2 s,
  // x1 s + x2 c): Hugging Face's rotate_half, not the interleaved pairs.
  static torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin) {
    auto halves = x.chunk(2, -1);
    const auto& x1 = halves[0];
    const auto& x2 = halves[1];
    return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1)
        .to(x.scalar_type());
  }
  int64_t n_heads_;
  int64_t n_kv_heads_;
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

// The feed-forward of a block: one dense SwiGLU, or (model.moe_experts > 0)
// the routed MoE block; either way registered as "mlp".
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& c) {
    attn_norm = register_module("attn_norm", RMSNorm(c.d_model, c.norm_eps));
    attn = register_module("attn", Attention(c));
    mlp_norm = register_module("mlp_norm", RMSNorm(c.d_model, c.norm_eps));
    if (c.moe_experts > 0) {
      moe = register_module(
          "mlp", MoeFeedForward(c.d_model, c.moe_d_ff > 0 ? c.moe_d_ff : c.d_ff,
                                c.moe_experts, c.moe_top_k,
                                c.moe_capacity_factor, c.moe_shared_expert));
    } else {
      mlp = register_module("mlp", SwiGLU(c.d_model, c.d_ff));
    }
    SetPlan(LayerActivationPlan{});
  }
  // token_valid [B, T] (MoE only): which tokens are routed. apply_capacity
  // (MoE only): drop assignments past the experts' capacity. Without a cache
  // and with autograd on, each sub-block follows `plan`.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask,
                        torch::Tensor* cache_k, torch::Tensor* cache_v,
                        int64_t cache_start, const torch::Tensor& token_valid,
                        bool apply_capacity) {
    aux_loss = torch::Tensor();
    z_loss = torch::Tensor();
    if (cache_k == nullptr && at::GradMode::is_enabled() &&
        (!AllKeep() || timer != nullptr)) {
      return PlannedForward(x, cos, sin, mask, token_valid, apply_capacity);
    }
    auto h =
        x + attn(attn_norm(x), cos, sin, mask, cache_k, cache_v, cache_start);
    if (!moe.is_empty()) {
      return h + moe(mlp_norm(h), token_valid, apply_capacity);
    }
    return h + mlp(mlp_norm(h));
  }

  bool AllKeep() const {
    return plan.attention == ActivationAction::kKeep &&
           plan.mlp == ActivationAction::kKeep &&
           plan.norm == ActivationAction::kKeep;
  }

  // The block as four steps, each run as the plan says:
  //   0: n1 = attn_norm(x)          (norm)
  //   1: h  = x + attn(n1)          (attention)
  //   2: n2 = mlp_norm(h)           (norm)
  //   3: y  = h + mlp(n2) [+ aux]   (mlp)
  // Consecutive steps under recompute run as one recompute node, which keeps
  // only the values the run reads from before it: all of a layer under
  // recompute keeps just its input x (as whole-layer checkpointing does).
  enum Value { kX, kN1, kH, kN2, kY, kAux, kZ, kNumValues };
  using Values = std::array<torch::Tensor, kNumValues>;

  void Apply(int step, Values& v, const torch::Tensor& cos,
             const torch::Tensor& sin, const torch::Tensor& mask,
             const torch::Tensor& token_valid, bool apply_capacity) {
    switch (step) {
      case 0:
        v[kN1] = attn_norm(v[kX]);
        return;
      case 1:
        v[kH] = v[kX] + attn(v[kN1], cos, sin, mask, nullptr, nullptr, 0);
        return;
      case 2:
        v[kN2] = mlp_norm(v[kH]);
        return;
      default:
        if (moe.is_empty()) {
          v[kY] = v[kH] + mlp(v[kN2]);
          return;
        }
        v[kY] = v[kH] + moe(v[kN2], token_valid, apply_capacity);
        // The router's losses are outputs of the step, so under recompute
        // they are outputs of the recompute node and their gradient flows
        // through the recomputed graph, exactly as without it.
        v[kAux] = moe->last_stats().aux_loss;
        v[kZ] = moe->last_stats().z_loss;
    }
  }

  // A run of steps executed together: one step kept or swapped, or
  // consecutive steps under recompute. in: the values it reads from before
  // it; out: the values it writes that later steps read, and the results.
  struct Segment {
    int first = 0, last = 0;
    ActivationAction action = ActivationAction::kKeep;
    std::vector<int> in, out;
  };

  void SetPlan(const LayerActivationPlan& p) {
    static const std::vector<int> kReads[4] = {
        {kX}, {kX, kN1}, {kH}, {kH, kN2}};
    static const std::vector<int> kWrites[4] = {
        {kN1}, {kH}, {kN2}, {kY, kAux, kZ}};
    plan = p;
    const ActivationAction action[4] = {p.norm, p.attention, p.norm, p.mlp};
    segments.clear();
    for (int i = 0; i < 4;) {
      Segment seg;
      seg.first = seg.last = i;
      seg.action = action[i];
      if (action[i] == ActivationAction::kRecompute) {
        while (seg.last + 1 < 4 &&
               action[seg.last + 1] == ActivationAction::kRecompute) {
          ++seg.last;
        }
      }
      for (int s = seg.first; s <= seg.last; ++s) {
        for (int r : kReads[s]) {
          bool inside = false;
          for (int w = seg.first; w < s; ++w) {
            for (int written : kWrites[w]) inside = inside || written == r;
          }
          if (!inside &&
              std::find(seg.in.begin(), seg.in.end(), r) == seg.in.end()) {
            seg.in.push_back(r);
          }
        }
        for (int w : kWrites[s]) {
          if ((w == kAux || w == kZ) && moe.is_empty()) continue;
          bool read_after = w == kY || w == kAux || w == kZ;
          for (int t = seg.last + 1; t < 4; ++t) {
            for (int r : kReads[t]) read_after = read_after || r == w;
          }
          if (read_after) seg.out.push_back(w);
        }
      }
      i = seg.last + 1;
      segments.push_back(std::move(seg));
    }
  }

  torch::Tensor PlannedForward(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin,
                               const torch::Tensor& mask,
                               const torch::Tensor& token_valid,
                               bool apply_capacity) {
    const int kind[4] = {2, 0, 2, 1};  // timer slot of each step
    torch::nn::Module* module[4] = {
        attn_norm.ptr().get(), attn.ptr().get(), mlp_norm.ptr().get(),
        moe.is_empty() ? static_cast<torch::nn::Module*>(mlp.ptr().get())
                       : moe.ptr().get()};
    Values v;
    v[kX] = x;
    for (const Segment& seg : segments) {
      const int i = seg.first, j = seg.last;
      const std::vector<int>& in = seg.in;
      const std::vector<int>& out = seg.out;
      SubBlockFn fn = [this, i, j, in, out, cos, sin, mask, token_valid,
                       apply_capacity](const variable_list& inputs) {
        Values local;
        for (size_t k = 0; k < in.size(); ++k) local[in[k]] = inputs[k];
        for (int s = i; s <= j; ++s) {
          Apply(s, local, cos, sin, mask, token_valid, apply_capacity);
        }
        variable_list result;
        for (int w : out) result.push_back(local[w]);
        return result;
      };
      variable_list inputs;
      for (int r : in) inputs.push_back(v[r]);
      std::vector<at::Tensor> params;
      for (int s = i; s <= j; ++s) {
        for (const auto& p : module[s]->parameters()) params.push_back(p);
      }
      // A fused run's time goes to its first step's slot (the planner times
      // only plans without recompute, where every run is one step).
      variable_list outs =
          Run(kind[i], seg.action, std::move(fn), inputs, std::move(params));
      for (size_t k = 0; k < out.size(); ++k) v[out[k]] = outs[k];
    }
    if (!moe.is_empty() && plan.mlp == ActivationAction::kRecompute) {
      aux_loss = v[kAux];
      z_loss = v[kZ];
    }
    return v[kY];
  }

  // Runs one sub-block (kind: 0 attention, 1 mlp, 2 norm) as `action` says,
  // adding its wall time to the timer when one is set.
  variable_list Run(int kind, ActivationAction action, SubBlockFn fn,
                    const variable_list& inputs,
                    std::vector<at::Tensor> params) {
    if (timer == nullptr) {
      return RunAs(action, std::move(fn), inputs, std::move(params));
    }
    if (timer->sync) timer->sync();
    const auto start = std::chrono::steady_clock::now();
    variable_list out = RunAs(action, std::move(fn), inputs, std::move(params));
    if (timer->sync) timer->sync();
    timer->seconds[layer][kind] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return out;
  }

  variable_list RunAs(ActivationAction action, SubBlockFn fn,
                      const variable_list& inputs,
                      std::vector<at::Tensor> params) {
    switch (action) {
      case ActivationAction::kKeep:
        return fn(inputs);
      case ActivationAction::kSwap: {
        SwapScope scope(pool, exclude);
        return fn(inputs);
      }
      case ActivationAction::kRecompute:
        break;
    }
    return RunRecomputed(std::move(fn), inputs, std::move(params));
  }

  LayerActivationPlan plan;                  // set with SetPlan
  std::vector<Segment> segments;             // derived from plan by SetPlan
  int layer = 0;                             // index in the decoder
  SubBlockTimer* timer = nullptr;            // profiling, when set
  std::shared_ptr<ActivationHostPool> pool;  // swap target
  const std::unordered_set<const void*>* exclude = nullptr;  // not swapped
  // MoE under recompute: the last forward's auxiliary losses, outputs of the
  // recompute node (the module's own last_stats() is overwritten by the
  // recomputation in backward: equal values, but another graph).
  torch::Tensor aux_loss, z_loss;
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  Attention attn{nullptr};
  SwiGLU mlp{nullptr};          // dense
  MoeFeedForward moe{nullptr};  // MoE
};
TORCH_MODULE(Block);

c10::ScalarType ModelDtype(const ModelConfig& c) {
  return c.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
}

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

class DecoderImpl : public torch::nn::Module {
 public:
  DecoderImpl(const ModelConfig& c, int vocab) : config_(c) {
    embed = register_module("embed", torch::nn::Embedding(vocab, c.d_model));
    for (int i = 0; i < c.n_layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Block(c)));
      blocks.back()->layer = i;
    }
    norm = register_module("norm", RMSNorm(c.d_model, c.norm_eps));
    // Tied embeddings: the head is the embedding matrix (no parameter of
    // its own).
    if (!c.tie_embeddings) {
      lm_head = register_module(
          "lm_head",
          torch::nn::Linear(
              torch::nn::LinearOptions(c.d_model, vocab).bias(false)));
    }
    // Rotary tables for every position, [max_seq_len, Dh/2]; buffers so they
    // follow .to(device) but are not parameters.
    auto inv_freq = RotaryInverseFrequencies(c);
    auto angles =
        torch::outer(torch::arange(c.max_seq_len, torch::kDouble), inv_freq);
    rope_cos =
        register_buffer("rope_cos", torch::cos(angles).to(torch::kFloat));
    rope_sin =
        register_buffer("rope_sin", torch::sin(angles).to(torch::kFloat));
  }

  torch::Tensor forward(const torch::Tensor& tokens,
                        const torch::Tensor& positions,
                        const torch::Tensor& key_valid, KvCache* cache) {
    const int64_t start = cache ? cache->length : 0;
    const int64_t t = tokens.size(1);
    auto pos = positions.clamp(0, config_.max_seq_len - 1);
    auto cos = rope_cos.index({pos}).unsqueeze(1);  // [B, 1, T, Dh/2]
    auto sin = rope_sin.index({pos}).unsqueeze(1);
    auto mask = AttentionMask(key_valid, start, t);
    // MoE: the new tokens' validity (the last t key slots) says which tokens
    // are routed; capacity applies in the training forward only (training
    // mode, autograd on, no cache): rollout and evaluation are dropless, so
    // routing there never depends on which tokens share a call.
    torch::Tensor token_valid;
    bool apply_capacity = false;
    if (config_.moe_experts > 0) {
      token_valid = key_valid.narrow(1, key_valid.size(1) - t, t);
      apply_capacity = cache == nullptr && is_training() &&
                       at::GradMode::is_enabled() &&
                       config_.moe_capacity_factor > 0;
    }
    auto x = embed(tokens);
    for (size_t i = 0; i < blocks.size(); ++i) {
      torch::Tensor* ck = cache ? &cache->keys[i] : nullptr;
      torch::Tensor* cv = cache ? &cache->values[i] : nullptr;
      x = blocks[i]->forward(x, cos, sin, mask, ck, cv, start, token_valid,
                             apply_capacity);
    }
    if (cache) cache->length += t;
    if (hidden_only_) return norm(x);
    return Head(norm(x));
  }

  // Logits of final hidden states [..., D] -> [..., V].
  torch::Tensor Head(const torch::Tensor& h) {
    return lm_head.is_empty() ? torch::linear(h, embed->weight) : lm_head(h);
  }

  // Final hidden states [B, T, D] (after the last norm): forward() without
  // the head, for callers that need logits at a few positions only.
  torch::Tensor Hidden(const torch::Tensor& tokens,
                       const torch::Tensor& positions,
                       const torch::Tensor& key_valid) {
    hidden_only_ = true;
    auto h = forward(tokens, positions, key_valid, nullptr);
    hidden_only_ = false;
    return h;
  }

  void Init(uint64_t seed) {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double std = config_.init_std;
    // Residual output projections are scaled down with depth (GPT-2 style)
    // so the residual stream's variance does not grow with n_layers.
    const double out_std = std / std::sqrt(2.0 * config_.n_layers);
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      auto& p = item.value();
      if (p.dim() < 2) {  // norm weights stay 1, biases start at 0
        if (name.find(".bias") != std::string::npos) p.zero_();
        continue;
      }
      const bool residual_out = name.find("wo.") != std::string::npos ||
                                name.find("w2.") != std::string::npos;
      auto init = at::normal(0.0, residual_out ? out_std : std, p.sizes(), gen,
                             p.options().device(torch::kCPU));
      p.copy_(init);
    }
  }

  ModelConfig config_;
  bool hidden_only_ = false;  // set by Hidden() around forward()
  torch::nn::Embedding embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
  torch::Tensor rope_cos, rope_sin;
};
TORCH_MODULE(Decoder);

}  // namespace

struct PolicyModel::Impl {
  Impl(const ModelConfig& c, int vocab, c10::Device d, Decoder dec)
      : config(c), vocab_size(vocab), device(d), decoder(std::move(dec)) {}
  ModelConfig config;
  int vocab_size;
  c10::Device device;
  Decoder decoder{nullptr};
  std::vector<LayerActivationPlan> plan;
  std::shared_ptr<ActivationHostPool> pool =
      std::make_shared<ActivationHostPool>();
  // Storages of the parameters and buffers: saved as they are under swap.
  std::unordered_set<const void*> no_swap;
};

PolicyModel::PolicyModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PolicyModel::~PolicyModel() = default;

absl::StatusOr<std::unique_ptr<PolicyModel>> PolicyModel::Create(
    const ModelConfig& config, int vocab_size, c10::Device device,
    uint64_t seed) {
  const int64_t head_dim = config.head_dim > 0
                               ? config.head_dim
                               : (config.d_model % config.n_heads == 0
                                      ? config.d_model / config.n_heads
                                      : 1);
  const int64_t kv_heads =
      config.n_kv_heads > 0 ? config.n_kv_heads : config.n_heads;
  if (vocab_size < 1 || head_dim % 2 != 0 || config.n_heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: invalid shape (vocab ", vocab_size, ", d_model ",
                     config.d_model, ", n_heads ", config.n_heads,
                     ", n_kv_heads ", kv_heads, ", head_dim ", head_dim, ")"));
  }
  if (config.dtype != "float32" && config.dtype != "bfloat16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.dtype: '", config.dtype, "' (float32 or bfloat16)"));
  }
  if (config.moe_experts != 0 &&
      (config.moe_experts < 2 || config.moe_top_k < 1 || config.moe_top_k > 2 ||
       config.moe_top_k > config.moe_experts ||
       config.moe_capacity_factor < 0 || config.moe_d_ff < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: invalid mixture of experts (moe_experts ", config.moe_experts,
        ", moe_top_k ", config.moe_top_k, ", moe_capacity_factor ",
        config.moe_capacity_factor, ", moe_d_ff ", config.moe_d_ff, ")"));
  }
  auto impl = std::make_unique<Impl>(config, vocab_size, device, nullptr);
  try {
    impl->decoder = Decoder(config, vocab_size);
    impl->decoder->Init(seed);
    impl->decoder->to(device, ModelDtype(config));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("model: cannot create on ",
                                            device.str(), ": ",
                                            e.what_without_backtrace()));
  }
  std::unique_ptr<PolicyModel> model(new PolicyModel(std::move(impl)));
  auto plan = ResolveActivationPlan(config.activations, config.n_layers);
  if (!plan.ok()) {
    return absl::Status(
        plan.status().code(),
        absl::StrCat("model.activations: ", plan.status().message()));
  }
  if (auto status = model->SetActivationPlan(*std::move(plan)); !status.ok()) {
    return status;
  }
  return model;
}

absl::Status PolicyModel::SetActivationPlan(
    std::vector<LayerActivationPlan> plan) {
  auto& blocks = impl_->decoder->blocks;
  if (plan.size() != blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation plan has ", plan.size(), " layers, the model ",
                     blocks.size()));
  }
  bool swap = false;
  impl_->no_swap.clear();
  for (const auto& p : impl_->decoder->parameters()) {
    impl_->no_swap.insert(p.storage().unsafeGetStorageImpl());
  }
  for (const auto& b : impl_->decoder->buffers()) {
    impl_->no_swap.insert(b.storage().unsafeGetStorageImpl());
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i]->SetPlan(plan[i]);
    blocks[i]->pool = impl_->pool;
    blocks[i]->exclude = &impl_->no_swap;
    swap = swap || plan[i].attention == ActivationAction::kSwap ||
           plan[i].mlp == ActivationAction::kSwap ||
           plan[i].norm == ActivationAction::kSwap;
  }
  // Before any backward of this model can use swapped tensors.
  if (swap) InstallSwapEngine();
  impl_->plan = std::move(plan);
  return absl::OkStatus();
}

void PolicyModel::set_sub_block_timer(SubBlockTimer* timer) {
  auto& blocks = impl_->decoder->blocks;
  if (timer != nullptr) {
    timer->seconds.assign(blocks.size(), {0.0, 0.0, 0.0});
  }
  for (auto& b : blocks) b->timer = timer;
}

const std::vector<LayerActivationPlan>& PolicyModel::activation_plan() const {
  return impl_->plan;
}

ActivationHostPool& PolicyModel::activation_host_pool() const {
  return *impl_->pool;
}

at::Tensor PolicyModel::Forward(const at::Tensor& tokens,
                                const at::Tensor& positions,
                                const at::Tensor& key_valid) {
  return impl_->decoder->forward(tokens, positions, key_valid, nullptr);
}

at::Tensor PolicyModel::ForwardHidden(const at::Tensor& tokens,
                                      const at::Tensor& positions,
                                      const at::Tensor& key_valid) {
  return impl_->decoder->Hidden(tokens, positions, key_valid);
}

at::Tensor PolicyModel::Logits(const at::Tensor& hidden) {
  return impl_->decoder->Head(hidden);
}

std::vector<at::Tensor> PolicyModel::head_parameters() const {
  const auto& d = impl_->decoder;
  return {d->lm_head.is_empty() ? d->embed->weight : d->lm_head->weight};
}

std::vector<std::pair<std::string, at::Tensor>> PolicyModel::named_parameters()
    const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : impl_->decoder->named_parameters()) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

KvCache PolicyModel::NewCache(int64_t batch, int64_t capacity) const {
  const auto& c = impl_->config;
  KvCache cache;
  cache.capacity = capacity;
  auto opts = torch::TensorOptions().dtype(ModelDtype(c)).device(impl_->device);
  for (int i = 0; i < c.n_layers; ++i) {
    cache.keys.push_back(torch::empty(
        {batch, AttentionImpl::KvHeads(c), capacity, AttentionImpl::HeadDim(c)},
        opts));
    cache.values.push_back(torch::empty_like(cache.keys.back()));
  }
  return cache;
}

at::Tensor PolicyModel::ForwardCached(const at::Tensor& tokens,
                                      const at::Tensor& positions,
                                      const at::Tensor& key_valid,
                                      KvCache& cache, bool last_only) {
  TORCH_CHECK(cache.length + tokens.size(1) <= cache.capacity,
              "KV cache overflow: ", cache.length, " + ", tokens.size(1), " > ",
              cache.capacity);
  if (!last_only || tokens.size(1) == 1) {
    return impl_->decoder->forward(tokens, positions, key_valid, &cache);
  }
  impl_->decoder->hidden_only_ = true;
  at::Tensor hidden =
      impl_->decoder->forward(tokens, positions, key_valid, &cache);
  impl_->decoder->hidden_only_ = false;
  return impl_->decoder->Head(hidden.narrow(1, hidden.size(1) - 1, 1));
}

void PolicyModel::CopyWeightsFrom(const PolicyModel& other) {
  torch::NoGradGuard no_grad;
  auto dst = impl_->decoder->parameters();
  auto src = other.impl_->decoder->parameters();
  TORCH_CHECK(dst.size() == src.size(), "CopyWeightsFrom: different models");
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
}

std::unique_ptr<PolicyModel> PolicyModel::CloneFrozen() const {
  return CloneFrozen(impl_->device);
}

std::unique_ptr<PolicyModel> PolicyModel::CloneFrozen(
    c10::Device device) const {
  auto impl =
      std::make_unique<Impl>(impl_->config, impl_->vocab_size, device, nullptr);
  impl->decoder = Decoder(impl_->config, impl_->vocab_size);
  impl->decoder->to(device, ModelDtype(impl_->config));
  std::unique_ptr<PolicyModel> clone(new PolicyModel(std::move(impl)));
  clone->CopyWeightsFrom(*this);
  for (auto& p : clone->impl_->decoder->parameters())
    p.set_requires_grad(false);
  clone->set_training(false);
  return clone;
}

std::vector<at::Tensor> PolicyModel::parameters() const {
  return impl_->decoder->parameters();
}

int64_t PolicyModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : impl_->decoder->parameters()) n += p.numel();
  return n;
}

void PolicyModel::set_training(bool on) { impl_->decoder->train(on); }

absl::Status PolicyModel::Save(const std::string& path) const {
  try {
    torch::serialize::OutputArchive archive;
    for (const auto& item : impl_->decoder->named_parameters()) {
      archive.write(item.key(), item.value().detach().to(torch::kCPU));
    }
    archive.save_to(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot write weights to '", path,
                                            "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status PolicyModel::Load(const std::string& path) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("cannot read weights from '", path,
                                            "': ", e.what_without_backtrace()));
  }
  torch::NoGradGuard no_grad;
  for (auto& item : impl_->decoder->named_parameters()) {
    torch::Tensor stored;
    if (!archive.try_read(item.key(), stored)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "' has no tensor '", item.key(),
          "': the checkpoint was made for a different model config"));
    }
    if (stored.sizes() != item.value().sizes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "': tensor '", item.key(), "' has shape ",
                       c10::str(stored.sizes()), " but the model config needs ",
                       c10::str(item.value().sizes())));
    }
    item.value().copy_(stored);
  }
  return absl::OkStatus();
}

at::Tensor PolicyModel::AuxLoss() const {
  const ModelConfig& c = impl_->config;
  at::Tensor total;
  if (c.moe_experts == 0) return total;
  for (const auto& block : impl_->decoder->blocks) {
    const MoeLayerStats& s = block->moe->last_stats();
    if (!s.aux_loss.defined()) return at::Tensor();
    // Under recompute the block keeps the forward's losses with autograd.
    const bool own = block->aux_loss.defined();
    auto layer = (own ? block->aux_loss : s.aux_loss) * c.moe_aux_loss_coef +
                 (own ? block->z_loss : s.z_loss) * c.moe_z_loss_coef;
    total = total.defined() ? total + layer : layer;
  }
  return total;
}

MoeStats PolicyModel::moe_stats() const {
  MoeStats out;
  const ModelConfig& c = impl_->config;
  if (c.moe_experts == 0) return out;
  at::NoGradGuard no_grad;
  at::Tensor load, dropped, aux, z;
  for (const auto& block : impl_->decoder->blocks) {
    const MoeLayerStats& s = block->moe->last_stats();
    if (!s.aux_loss.defined()) return out;
    load = load.defined() ? load + s.expert_load : s.expert_load;
    dropped = dropped.defined() ? dropped + s.dropped_frac : s.dropped_frac;
    aux = aux.defined() ? aux + s.aux_loss.detach() : s.aux_loss.detach();
    z = z.defined() ? z + s.z_loss.detach() : s.z_loss.detach();
  }
  // One host copy for all of them.
  const double layers = static_cast<double>(c.n_layers);
  const auto host =
      at::cat({load, at::stack({dropped, aux, z})}).to(at::kDouble).cpu() /
      layers;
  const auto h = host.accessor<double, 1>();
  out.expert_load.resize(c.moe_experts);
  for (int i = 0; i < c.moe_experts; ++i) out.expert_load[i] = h[i];
  out.dropped_frac = h[c.moe_experts];
  out.aux_loss = h[c.moe_experts + 1];
  out.z_loss = h[c.moe_experts + 2];
  return out;
}

const ModelConfig& PolicyModel::config() const { return impl_->config; }
int PolicyModel::vocab_size() const { return impl_->vocab_size; }
c10::Device PolicyModel::device() const { return impl_->device; }

at::Tensor PositionsFromValid(const at::Tensor& valid) {
  return (valid.to(torch::kLong).cumsum(1) - 1).clamp_min(0);
}

}  // namespace fusionrl
