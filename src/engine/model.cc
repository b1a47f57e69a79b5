// PolicyModel (engine/model.h): the decoder stack (embedding, layers, final
// norm, LM head), the full and KV-cached forwards, and the model's weights
// (init, copy, clone, save, load). A layer is engine/decoder_block.h, its
// attention engine/attention.h.
#include "engine/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize.h>

#include <cmath>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/activation_memory.h"
#include "engine/attention.h"
#include "engine/decoder_block.h"
#include "engine/invariant_ops.h"
#include "engine/moe_module.h"

namespace fusionrl {
namespace {

c10::ScalarType ModelDtype(const ModelConfig& c) {
  return c.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
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
    auto [cos, sin] = RotaryTables(c);
    rope_cos = register_buffer("rope_cos", std::move(cos));
    rope_sin = register_buffer("rope_sin", std::move(sin));
  }

  // `first` > 0 (no cache): the outputs of positions [first, T) only; the
  // last block computes only those where its WindowApplies().
  torch::Tensor forward(const torch::Tensor& tokens,
                        const torch::Tensor& positions,
                        const torch::Tensor& key_valid, KvCache* cache,
                        int64_t first = 0) {
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
    const bool window =
        first > 0 && cache == nullptr && blocks.back()->WindowApplies();
    for (size_t i = 0; i < blocks.size(); ++i) {
      torch::Tensor* ck = cache ? &cache->keys[i] : nullptr;
      torch::Tensor* cv = cache ? &cache->values[i] : nullptr;
      if (window && i + 1 == blocks.size()) {
        x = blocks[i]->ForwardWindow(
            x, cos, sin, AttentionMask(key_valid, first, t - first), first);
        break;
      }
      x = blocks[i]->forward(x, cos, sin, mask, ck, cv, start, token_valid,
                             apply_capacity);
    }
    if (first > 0 && !window) x = x.narrow(1, first, t - first);
    if (cache) cache->length += t;
    if (hidden_only_) return norm(x);
    return Head(norm(x));
  }

  // Logits of final hidden states [..., D] -> [..., V].
  torch::Tensor Head(const torch::Tensor& h) {
    return InvariantLinear(
        h, lm_head.is_empty() ? embed->weight : lm_head->weight);
  }

  // Final hidden states [B, T - first, D] of positions [first, T) (after
  // the last norm): forward() without the head, for callers that need
  // logits at a few positions only.
  torch::Tensor Hidden(const torch::Tensor& tokens,
                       const torch::Tensor& positions,
                       const torch::Tensor& key_valid, int64_t first) {
    hidden_only_ = true;
    auto h = forward(tokens, positions, key_valid, nullptr, first);
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
    timer->seconds.assign(blocks.size(), {0.0, 0.0, 0.0, 0.0, 0.0});
  }
  for (auto& b : blocks) {
    b->timer = timer;
    b->attn->timer = timer;
    b->attn->layer = b->layer;
    if (b->moe.is_empty()) {
      b->mlp->timer = timer;
      b->mlp->layer = b->layer;
    } else {
      b->moe->SetTimer(timer, b->layer);
    }
  }
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
                                      const at::Tensor& key_valid,
                                      int64_t first_position) {
  TORCH_CHECK(first_position >= 0 && first_position < tokens.size(1),
              "ForwardHidden: first_position ", first_position, " outside [0, ",
              tokens.size(1), ")");
  return impl_->decoder->Hidden(tokens, positions, key_valid, first_position);
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
