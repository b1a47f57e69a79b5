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
#include <map>
#include <unordered_set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/activation_memory.h"
#include "engine/attention.h"
#include "engine/decoder_block.h"
#include "engine/invariant_ops.h"
#include "engine/lora.h"
#include "engine/moe.h"
#include "engine/moe_module.h"

namespace fusionrl {
namespace {

c10::ScalarType ModelDtype(const ModelConfig& c) {
  return c.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
}

class DecoderImpl : public torch::nn::Module {
 public:
  DecoderImpl(const ModelConfig& c, int vocab, ExpertShard shard = {})
      : config_(c) {
    embed = register_module("embed", torch::nn::Embedding(vocab, c.d_model));
    for (int i = 0; i < c.n_layers; ++i) {
      blocks.push_back(
          register_module("block" + std::to_string(i), Block(c, shard)));
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
    // Router replay (SetRouteReplay) applies to forwards without a cache.
    MoeRouting routing;
    const bool replay = cache == nullptr && route_replay.defined();
    if (config_.moe_experts > 0) {
      routing.token_valid = key_valid.narrow(1, key_valid.size(1) - t, t);
      routing.apply_capacity = cache == nullptr && is_training() &&
                               at::GradMode::is_enabled() &&
                               config_.moe_capacity_factor > 0;
      TORCH_CHECK(!replay || (route_replay.size(0) == tokens.size(0) &&
                              route_replay.size(1) == t),
                  "router replay: routes ", route_replay.sizes(),
                  " do not cover the batch ", tokens.sizes());
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
      if (replay) routing.replay = route_replay.select(2, i);
      x = blocks[i]->forward(x, cos, sin, mask, ck, cv, start, routing);
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
  // [B, T, n_layers, top_k] int64 (PolicyModel::SetRouteReplay).
  torch::Tensor route_replay;
  torch::nn::Embedding embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
  torch::Tensor rope_cos, rope_sin;
};
TORCH_MODULE(Decoder);

}  // namespace

// One targeted projection of a LoRA model.
struct LoraSlot {
  std::string name;   // "block0.attn.wq"
  at::Tensor weight;  // the projection's weight (a merged view: merged)
  at::Tensor base;    // a merged view: the base weight it merges from
  LoraAdapter adapter;
};

struct PolicyModel::Impl {
  Impl(const ModelConfig& c, int vocab, c10::Device d, Decoder dec)
      : config(c), vocab_size(vocab), device(d), decoder(std::move(dec)) {}

  // A projection LoRA can adapt: its slot name ("block0.attn.wq"), its
  // weight, and the module's pointer to its adapter.
  struct LoraTarget {
    std::string name;
    at::Tensor weight;
    const LoraAdapter** hook;
  };

  // The targeted projections in slot order (layer, then q, k, v, o, gate,
  // up, down: `targets` is in kLoraTargetNames order).
  std::vector<LoraTarget> LoraTargets(const std::vector<std::string>& targets) {
    struct Projection {
      const char* hf;    // Hugging Face name
      const char* path;  // FusionRL module path
      const torch::nn::Linear* linear;
      const LoraAdapter** hook;
    };
    std::vector<LoraTarget> out;
    for (auto& block : decoder->blocks) {
      AttentionImpl& attn = *block->attn;
      std::vector<Projection> table = {
          {"q_proj", ".attn.wq", &attn.wq, &attn.lora[0]},
          {"k_proj", ".attn.wk", &attn.wk, &attn.lora[1]},
          {"v_proj", ".attn.wv", &attn.wv, &attn.lora[2]},
          {"o_proj", ".attn.wo", &attn.wo, &attn.lora[3]}};
      if (block->moe.is_empty()) {  // a MoE block's experts are not adapted
        SwiGLUImpl& mlp = *block->mlp;
        table.push_back({"gate_proj", ".mlp.w1", &mlp.w1, &mlp.lora[0]});
        table.push_back({"up_proj", ".mlp.w3", &mlp.w3, &mlp.lora[1]});
        table.push_back({"down_proj", ".mlp.w2", &mlp.w2, &mlp.lora[2]});
      }
      const std::string prefix = "block" + std::to_string(block->layer);
      for (const std::string& t : targets) {
        for (const Projection& p : table) {
          if (t == p.hf) {
            out.push_back({prefix + p.path, (*p.linear)->weight, p.hook});
          }
        }
      }
    }
    return out;
  }

  // A merged view's targeted weights from its base and adapters.
  void Remerge() {
    for (const auto& slot : lora) {
      slot->weight.copy_(MergedWeight(slot->base, slot->adapter));
    }
  }

  ModelConfig config;
  int vocab_size;
  c10::Device device;
  Decoder decoder{nullptr};
  std::vector<LayerActivationPlan> plan;
  std::shared_ptr<ActivationHostPool> pool =
      std::make_shared<ActivationHostPool>();
  // Storages of the parameters and buffers: saved as they are under swap.
  std::unordered_set<const void*> no_swap;
  // LoRA: one slot per targeted projection; stable addresses (the modules
  // point at the adapters).
  std::vector<std::unique_ptr<LoraSlot>> lora;
  bool lora_merged = false;
  uint64_t lora_dropout_seed = 0;
  // Expert parallelism: the experts this model holds, and the group of the
  // ranks holding the others (borrowed).
  ExpertShard shard;
  GradientSync* expert_group = nullptr;
};

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

void PolicyModel::CopyWeightsFrom(const PolicyModel& other) {
  torch::NoGradGuard no_grad;
  auto dst = impl_->decoder->parameters();
  auto src = other.impl_->decoder->parameters();
  TORCH_CHECK(dst.size() == src.size(), "CopyWeightsFrom: different models");
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  if (lora() && other.lora() && !other.lora_merged()) {
    LoadTrainable(other.trainable_parameters());
  }
}

std::unique_ptr<PolicyModel> PolicyModel::CloneFrozen() const {
  return CloneFrozen(impl_->device);
}

std::unique_ptr<PolicyModel> PolicyModel::CloneFrozen(
    c10::Device device) const {
  auto impl =
      std::make_unique<Impl>(impl_->config, impl_->vocab_size, device, nullptr);
  impl->decoder = Decoder(impl_->config, impl_->vocab_size, impl_->shard);
  impl->decoder->to(device, ModelDtype(impl_->config));
  impl->shard = impl_->shard;
  std::unique_ptr<PolicyModel> clone(new PolicyModel(std::move(impl)));
  clone->set_expert_group(impl_->expert_group);
  if (!lora()) {
    clone->CopyWeightsFrom(*this);
  } else {
    // A merged view: untargeted tensors shared on the same device, the
    // targeted weights merged from the base (shared too).
    torch::NoGradGuard no_grad;
    std::unordered_set<const void*> targeted;
    for (const auto& slot : impl_->lora) {
      targeted.insert(slot->weight.unsafeGetTensorImpl());
    }
    const bool same_device = device == impl_->device;
    auto dst = clone->impl_->decoder->named_parameters();
    auto src = impl_->decoder->named_parameters();
    std::map<std::string, at::Tensor> by_name;
    for (size_t i = 0; i < dst.size(); ++i) {
      at::Tensor d = dst[i].value();
      const at::Tensor& from = src[i].value();
      const bool is_target = targeted.count(from.unsafeGetTensorImpl()) > 0;
      if (same_device && !is_target) {
        d.set_data(from.detach());
      } else if (!is_target) {
        d.copy_(from);
      }
      by_name[dst[i].key()] = d;
    }
    Impl& ci = *clone->impl_;
    for (const auto& slot : impl_->lora) {
      auto copy = std::make_unique<LoraSlot>();
      copy->name = slot->name;
      copy->weight = by_name.at(slot->name + ".weight");
      const at::Tensor& base = slot->base.defined() ? slot->base : slot->weight;
      copy->base = same_device ? base.detach() : base.detach().to(device);
      copy->adapter = slot->adapter;
      copy->adapter.a = slot->adapter.a.detach().to(
          device, /*non_blocking=*/false, /*copy=*/true);
      copy->adapter.b = slot->adapter.b.detach().to(device, false, true);
      copy->adapter.dropout_seed = nullptr;
      ci.lora.push_back(std::move(copy));
    }
    ci.lora_merged = true;
    ci.Remerge();
  }
  for (auto& p : clone->impl_->decoder->parameters())
    p.set_requires_grad(false);
  clone->set_training(false);
  return clone;
}

absl::StatusOr<std::unique_ptr<PolicyModel>> PolicyModel::ExpertShardOf(
    ExpertShard shard) const {
  const ModelConfig& c = impl_->config;
  if (c.moe_experts == 0 || impl_->shard.size != 1 || lora() ||
      shard.size < 1 || c.moe_experts % shard.size != 0 || shard.rank < 0 ||
      shard.rank >= shard.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert shard ", shard.rank, " of ", shard.size,
        ": needs a mixture-of-experts model holding every expert, without "
        "LoRA, and a shard count dividing model.moe_experts (",
        c.moe_experts, ")"));
  }
  auto impl =
      std::make_unique<Impl>(c, impl_->vocab_size, impl_->device, nullptr);
  try {
    impl->decoder = Decoder(c, impl_->vocab_size, shard);
    impl->decoder->to(impl_->device, ModelDtype(c));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("expert shard: ", e.what_without_backtrace()));
  }
  impl->shard = shard;
  std::unique_ptr<PolicyModel> model(new PolicyModel(std::move(impl)));
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> mine;
    for (auto& [name, t] : named_parameters()) mine.emplace(name, t);
    for (auto& [name, t] : model->named_parameters()) t.copy_(mine.at(name));
  }
  FUSIONRL_RETURN_IF_ERROR(model->SetActivationPlan(activation_plan()));
  return model;
}

const ExpertShard& PolicyModel::expert_shard() const { return impl_->shard; }

std::unique_ptr<PolicyModel> PolicyModel::WholeFrozen(
    c10::Device device) const {
  auto impl =
      std::make_unique<Impl>(impl_->config, impl_->vocab_size, device, nullptr);
  impl->decoder = Decoder(impl_->config, impl_->vocab_size);
  impl->decoder->to(device, ModelDtype(impl_->config));
  std::unique_ptr<PolicyModel> whole(new PolicyModel(std::move(impl)));
  for (auto& p : whole->impl_->decoder->parameters()) {
    p.set_requires_grad(false);
  }
  whole->set_training(false);
  return whole;
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

absl::Status PolicyModel::Save(const std::string& path) const {
  return Save(path, [](const std::string&) { return true; });
}

absl::Status PolicyModel::Save(
    const std::string& path,
    const std::function<bool(const std::string&)>& keep) const {
  try {
    torch::serialize::OutputArchive archive;
    for (const auto& [name, value] : named_trainable_parameters()) {
      if (keep(name)) archive.write(name, value.detach().to(torch::kCPU));
    }
    archive.save_to(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot write weights to '", path,
                                            "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status PolicyModel::Load(const std::string& path) {
  return Load(std::vector<std::string>{path});
}

absl::Status PolicyModel::Load(const std::vector<std::string>& paths) {
  if (paths.empty()) {
    return absl::InvalidArgumentError("Load: no weight archive to read");
  }
  const std::string& path = paths.front();  // named in errors
  std::vector<torch::serialize::InputArchive> archives(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    try {
      archives[i].load_from(paths[i]);
    } catch (const c10::Error& e) {
      return absl::DataLossError(
          absl::StrCat("cannot read weights from '", paths[i],
                       "': ", e.what_without_backtrace()));
    }
  }
  torch::NoGradGuard no_grad;
  // A LoRA model reads the adapters of a LoRA archive, or the base weights
  // of a full one; a full model refuses a LoRA archive by name.
  bool has_adapters = false;
  for (const std::string& key : archives.front().keys()) {
    has_adapters = has_adapters || absl::EndsWith(key, ".lora_A");
  }
  if (has_adapters && !lora()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path,
        "' holds LoRA adapters, not a full model: set model.lora as in the "
        "run that wrote it (its config.yaml), or export it merged (fusionrl "
        "export --merge)"));
  }
  const bool adapters = lora() && has_adapters;
  if (impl_->lora_merged && !adapters) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "': a merged LoRA view takes adapters only"));
  }
  std::vector<std::pair<std::string, at::Tensor>> wanted;
  if (adapters) {
    wanted = named_trainable_parameters();
  } else {
    for (auto& item : impl_->decoder->named_parameters()) {
      wanted.emplace_back(item.key(), item.value());
    }
  }
  for (auto& [name, value] : wanted) {
    torch::Tensor stored;
    bool found = false;
    for (auto& archive : archives) {
      if (archive.try_read(name, stored)) {
        found = true;
        break;
      }
    }
    if (!found) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "'",
          paths.size() > 1 ? " and its expert shards' files have" : " has",
          " no tensor '", name,
          adapters
              ? "': the adapters were made with other model.lora "
                "targets (its config.yaml says which)"
              : "': the checkpoint was made for a different model config"));
    }
    if (stored.sizes() != value.sizes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "': tensor '", name, "' has shape ",
                       c10::str(stored.sizes()), " but the model config needs ",
                       c10::str(value.sizes()),
                       adapters ? " (another model.lora.rank?)" : ""));
    }
    value.copy_(stored);
  }
  if (impl_->lora_merged) impl_->Remerge();
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
