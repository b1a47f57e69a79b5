#include "engine/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn.h>
#include <torch/serialize.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/moe_module.h"

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

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c)
      : n_heads_(c.n_heads), head_dim_(c.d_model / c.n_heads) {
    wq = register_module(
        "wq", torch::nn::Linear(
                  torch::nn::LinearOptions(c.d_model, c.d_model).bias(false)));
    wk = register_module(
        "wk", torch::nn::Linear(
                  torch::nn::LinearOptions(c.d_model, c.d_model).bias(false)));
    wv = register_module(
        "wv", torch::nn::Linear(
                  torch::nn::LinearOptions(c.d_model, c.d_model).bias(false)));
    wo = register_module(
        "wo", torch::nn::Linear(
                  torch::nn::LinearOptions(c.d_model, c.d_model).bias(false)));
  }

  // x [B, T, D]; cos/sin [B, 1, T, Dh/2]; mask [B, 1, T, K].
  // With a cache, k/v are written at slots [cache_start, cache_start + T) of
  // cache_k/cache_v and attention runs over slots [0, cache_start + T).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask,
                        torch::Tensor* cache_k, torch::Tensor* cache_v,
                        int64_t cache_start) {
    const int64_t b = x.size(0), t = x.size(1);
    auto split = [&](const torch::Tensor& y) {
      return y.view({b, t, n_heads_, head_dim_}).transpose(1, 2);
    };
    auto q = Rotate(split(wq(x)), cos, sin);
    auto k = Rotate(split(wk(x)), cos, sin);
    auto v = split(wv(x));
    if (cache_k != nullptr) {
      cache_k->narrow(2, cache_start, t).copy_(k);
      cache_v->narrow(2, cache_start, t).copy_(v);
      k = cache_k->narrow(2, 0, cache_start + t);
      v = cache_v->narrow(2, 0, cache_start + t);
    }
    auto scores = torch::matmul(q, k.transpose(-2, -1)) /
                  std::sqrt(static_cast<double>(head_dim_));
    scores = scores.masked_fill(mask.logical_not(),
                                -std::numeric_limits<float>::infinity());
    auto out = torch::matmul(torch::softmax(scores, -1), v);
    return wo(out.transpose(1, 2).reshape({b, t, n_heads_ * head_dim_}));
  }

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};

 private:
  // Rotary embedding, half-split convention (x1, x2) -> (x1 c - x2 s,
  // x1 s + x2 c).
  static torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin) {
    auto halves = x.chunk(2, -1);
    const auto& x1 = halves[0];
    const auto& x2 = halves[1];
    return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
  }
  int64_t n_heads_;
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
  }
  // token_valid [B, T] (MoE only): which tokens are routed. apply_capacity
  // (MoE only): drop assignments past the experts' capacity.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin, const torch::Tensor& mask,
                        torch::Tensor* cache_k, torch::Tensor* cache_v,
                        int64_t cache_start, const torch::Tensor& token_valid,
                        bool apply_capacity) {
    auto h =
        x + attn(attn_norm(x), cos, sin, mask, cache_k, cache_v, cache_start);
    if (!moe.is_empty()) {
      return h + moe(mlp_norm(h), token_valid, apply_capacity);
    }
    return h + mlp(mlp_norm(h));
  }
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  Attention attn{nullptr};
  SwiGLU mlp{nullptr};          // dense
  MoeFeedForward moe{nullptr};  // MoE
};
TORCH_MODULE(Block);

class DecoderImpl : public torch::nn::Module {
 public:
  DecoderImpl(const ModelConfig& c, int vocab) : config_(c) {
    embed = register_module("embed", torch::nn::Embedding(vocab, c.d_model));
    for (int i = 0; i < c.n_layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Block(c)));
    }
    norm = register_module("norm", RMSNorm(c.d_model, c.norm_eps));
    lm_head = register_module(
        "lm_head", torch::nn::Linear(
                       torch::nn::LinearOptions(c.d_model, vocab).bias(false)));
    // Rotary tables for every position, [max_seq_len, Dh/2]; buffers so they
    // follow .to(device) but are not parameters.
    const int64_t half = c.d_model / c.n_heads / 2;
    auto inv_freq =
        torch::pow(c.rope_theta, -torch::arange(half, torch::kDouble) / half);
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
    return lm_head(norm(x));
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
      if (p.dim() < 2) continue;  // norm weights stay 1
      const bool residual_out = name.find("wo.") != std::string::npos ||
                                name.find("w2.") != std::string::npos;
      auto init = at::normal(0.0, residual_out ? out_std : std, p.sizes(), gen,
                             p.options().device(torch::kCPU));
      p.copy_(init);
    }
  }

  ModelConfig config_;
  torch::nn::Embedding embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
  torch::Tensor rope_cos, rope_sin;
};
TORCH_MODULE(Decoder);

}  // namespace

struct PolicyModel::Impl {
  ModelConfig config;
  int vocab_size;
  c10::Device device;
  Decoder decoder{nullptr};
};

PolicyModel::PolicyModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PolicyModel::~PolicyModel() = default;

absl::StatusOr<std::unique_ptr<PolicyModel>> PolicyModel::Create(
    const ModelConfig& config, int vocab_size, c10::Device device,
    uint64_t seed) {
  if (vocab_size < 1 || config.d_model % config.n_heads != 0 ||
      (config.d_model / config.n_heads) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: invalid shape (vocab ", vocab_size, ", d_model ",
                     config.d_model, ", n_heads ", config.n_heads, ")"));
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
  auto impl = std::make_unique<Impl>(Impl{config, vocab_size, device, nullptr});
  try {
    impl->decoder = Decoder(config, vocab_size);
    impl->decoder->Init(seed);
    impl->decoder->to(device);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("model: cannot create on ",
                                            device.str(), ": ",
                                            e.what_without_backtrace()));
  }
  return std::unique_ptr<PolicyModel>(new PolicyModel(std::move(impl)));
}

at::Tensor PolicyModel::Forward(const at::Tensor& tokens,
                                const at::Tensor& positions,
                                const at::Tensor& key_valid) {
  return impl_->decoder->forward(tokens, positions, key_valid, nullptr);
}

KvCache PolicyModel::NewCache(int64_t batch, int64_t capacity) const {
  const auto& c = impl_->config;
  KvCache cache;
  cache.capacity = capacity;
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(impl_->device);
  for (int i = 0; i < c.n_layers; ++i) {
    cache.keys.push_back(torch::empty(
        {batch, c.n_heads, capacity, c.d_model / c.n_heads}, opts));
    cache.values.push_back(torch::empty_like(cache.keys.back()));
  }
  return cache;
}

at::Tensor PolicyModel::ForwardCached(const at::Tensor& tokens,
                                      const at::Tensor& positions,
                                      const at::Tensor& key_valid,
                                      KvCache& cache) {
  TORCH_CHECK(cache.length + tokens.size(1) <= cache.capacity,
              "KV cache overflow: ", cache.length, " + ", tokens.size(1), " > ",
              cache.capacity);
  return impl_->decoder->forward(tokens, positions, key_valid, &cache);
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
  auto impl = std::make_unique<Impl>(
      Impl{impl_->config, impl_->vocab_size, device, nullptr});
  impl->decoder = Decoder(impl_->config, impl_->vocab_size);
  impl->decoder->to(device);
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
    auto layer =
        s.aux_loss * c.moe_aux_loss_coef + s.z_loss * c.moe_z_loss_coef;
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
