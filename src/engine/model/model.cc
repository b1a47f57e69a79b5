// PolicyModel (engine/model/model.h): the decoder stack (embedding, layers,
// final norm, LM head) and its creation, activation plans, routing, the full
// and KV-cached forwards and their statistics. Copies, clones, expert shards,
// save and load: engine/model/model_weights.cc; the internals both share:
// engine/model/model_impl.h. A layer is engine/model/decoder_block.h, its
// attention engine/model/attention.h.
#include "engine/model/model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/model/model_impl.h"
#include "engine/model/moe.h"

namespace fusionrl {

using model_internal::Decoder;
using model_internal::ModelDtype;

namespace {

// Adds LoRA adapters to a freshly created model: base frozen, A uniform in
// +-1/sqrt(in) (PEFT's kaiming_uniform(a = sqrt(5))), B zero.
absl::Status AttachLora(PolicyModel::Impl& impl, uint64_t seed) {
  const LoraConfig& l = impl.config.lora;
  absl::StatusOr<std::vector<std::string>> targets =
      ParseLoraTargets(l.targets);
  if (!targets.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.lora.targets: ", targets.status().message()));
  }
  auto slots = impl.LoraTargets(*targets);
  if (slots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.lora.targets: no layer of this model has ", l.targets,
        impl.config.moe_experts > 0
            ? " (a mixture-of-experts feed-forward has no gate/up/down_proj "
              "LoRA can adapt)"
            : ""));
  }
  for (auto& p : impl.decoder->parameters()) p.set_requires_grad(false);
  torch::NoGradGuard no_grad;
  // The adapters' own stream ("LoRA" - 1 as the tag).
  auto gen =
      at::make_generator<at::CPUGeneratorImpl>(MixSeed(seed, 0x4c6f5240ULL));
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  uint64_t index = 0;
  for (auto& [name, weight, hook] : slots) {
    auto slot = std::make_unique<LoraSlot>();
    slot->name = name;
    slot->weight = weight;
    const int64_t out = weight.size(0), in = weight.size(1);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    slot->adapter.a = at::empty({l.rank, in}, f32)
                          .uniform_(-bound, bound, gen)
                          .to(impl.device)
                          .set_requires_grad(true);
    slot->adapter.b = at::zeros({out, l.rank}, f32.device(impl.device))
                          .set_requires_grad(true);
    slot->adapter.scale = l.alpha / l.rank;
    slot->adapter.dropout = l.dropout;
    slot->adapter.dropout_seed = &impl.lora_dropout_seed;
    slot->adapter.index = index++;
    *hook = &slot->adapter;
    impl.lora.push_back(std::move(slot));
  }
  return absl::OkStatus();
}

}  // namespace

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
      (config.moe_experts < 2 || config.moe_top_k < 1 || config.moe_top_k > 8 ||
       config.moe_groups < 1 || config.moe_experts % config.moe_groups != 0 ||
       config.moe_top_k % config.moe_groups != 0 ||
       config.moe_top_k > config.moe_experts ||
       config.moe_capacity_factor < 0 || config.moe_d_ff < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: invalid mixture of experts (moe_experts ", config.moe_experts,
        ", moe_top_k ", config.moe_top_k, ", moe_groups ", config.moe_groups,
        ", moe_capacity_factor ", config.moe_capacity_factor, ", moe_d_ff ",
        config.moe_d_ff, ")"));
  }
  auto impl = std::make_unique<Impl>(config, vocab_size, device, nullptr);
  try {
    impl->decoder = Decoder(config, vocab_size);
    impl->decoder->Init(seed);
    impl->decoder->to(device, ModelDtype(config));
    if (LoraEnabled(config)) {
      if (absl::Status s = AttachLora(*impl, seed); !s.ok()) return s;
    }
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
  for (const auto& p : trainable_parameters()) {
    impl_->no_swap.insert(p.storage().unsafeGetStorageImpl());
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

void PolicyModel::SetRouteReplay(const at::Tensor& routes) {
  const ModelConfig& c = impl_->config;
  TORCH_CHECK(!routes.defined() || (c.moe_experts > 0 && routes.dim() == 4 &&
                                    routes.size(2) == c.n_layers &&
                                    routes.size(3) == c.moe_top_k &&
                                    routes.scalar_type() == at::kLong),
              "router replay: routes must be [B, T, n_layers (", c.n_layers,
              "), top_k (", c.moe_top_k, ")] int64 of a MoE model, got ",
              routes.sizes());
  impl_->decoder->route_replay = routes;
}

void PolicyModel::set_record_routes(bool on) {
  for (auto& b : impl_->decoder->blocks) {
    if (!b->moe.is_empty()) b->moe->set_record_routes(on);
  }
}

at::Tensor PolicyModel::last_routes() const {
  std::vector<at::Tensor> layers;
  for (const auto& b : impl_->decoder->blocks) {
    if (b->moe.is_empty() || !b->moe->last_routes().defined()) return {};
    layers.push_back(b->moe->last_routes());
  }
  if (layers.empty()) return {};
  return at::stack(layers, /*dim=*/-2);
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

void PolicyModel::set_expert_group(GradientSync* group) {
  impl_->expert_group = group;
  if (impl_->shard.size == 1) return;
  for (auto& b : impl_->decoder->blocks) b->moe->set_expert_group(group);
}

GradientSync* PolicyModel::expert_group() const { return impl_->expert_group; }

absl::Status PolicyModel::JoinExpertExchanges() {
  if (impl_->shard.size == 1 || impl_->expert_group == nullptr) {
    return absl::FailedPreconditionError(
        "JoinExpertExchanges: the model is not an expert shard with its "
        "group");
  }
  const at::Tensor none =
      at::empty({0, impl_->config.d_model},
                impl_->decoder->norm->weight.options().requires_grad(false));
  try {
    for (auto& b : impl_->decoder->blocks) {
      if (!b->moe.is_empty()) b->moe->forward(none, MoeRouting{});
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("joining the expert exchanges: ",
                                            e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

bool PolicyModel::lora() const { return !impl_->lora.empty(); }
bool PolicyModel::lora_merged() const { return impl_->lora_merged; }

std::vector<std::pair<std::string, at::Tensor>>
PolicyModel::named_trainable_parameters() const {
  if (!lora()) return named_parameters();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& slot : impl_->lora) {
    out.emplace_back(slot->name + ".lora_A", slot->adapter.a);
    out.emplace_back(slot->name + ".lora_B", slot->adapter.b);
  }
  return out;
}

std::vector<at::Tensor> PolicyModel::trainable_parameters() const {
  if (!lora()) return parameters();
  std::vector<at::Tensor> out;
  for (const auto& slot : impl_->lora) {
    out.push_back(slot->adapter.a);
    out.push_back(slot->adapter.b);
  }
  return out;
}

int64_t PolicyModel::num_trainable_parameters() const {
  int64_t n = 0;
  for (const at::Tensor& p : trainable_parameters()) n += p.numel();
  return n;
}

void PolicyModel::LoadTrainable(const std::vector<at::Tensor>& values) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> dst = trainable_parameters();
  TORCH_CHECK(dst.size() == values.size(), "LoadTrainable: ", values.size(),
              " tensors for a model with ", dst.size());
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(values[i]);
  if (impl_->lora_merged) impl_->Remerge();
}

void PolicyModel::set_lora_dropout_seed(uint64_t seed) {
  impl_->lora_dropout_seed = seed;
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
  out.group_load = moe::GroupLoads(out.expert_load, c.moe_groups);
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
