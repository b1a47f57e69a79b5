// PolicyModel's internals (engine/model/model.h), shared by its two files:
// model.cc (creation, activation plans, routing, the forwards and their
// statistics) and model_weights.cc (copies, clones, expert shards, save and
// load). Internal to engine/: the torch module headers stay out of
// engine/model/model.h.
#ifndef FUSIONRL_ENGINE_MODEL_MODEL_IMPL_H_
#define FUSIONRL_ENGINE_MODEL_MODEL_IMPL_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/kernels/invariant_ops.h"
#include "engine/model/activation_swap.h"
#include "engine/model/attention.h"
#include "engine/model/decoder_block.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/model/moe_module.h"

namespace fusionrl {
namespace model_internal {

inline c10::ScalarType ModelDtype(const ModelConfig& c) {
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

}  // namespace model_internal

// One targeted projection of a LoRA model.
struct LoraSlot {
  std::string name;   // "block0.attn.wq"
  at::Tensor weight;  // the projection's weight (a merged view: merged)
  at::Tensor base;    // a merged view: the base weight it merges from;
                      // undefined otherwise (the weight is the base)
  LoraAdapter adapter;
};

struct PolicyModel::Impl {
  Impl(const ModelConfig& c, int vocab, c10::Device d,
       model_internal::Decoder dec)
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
  model_internal::Decoder decoder{nullptr};
  std::vector<LayerActivationPlan> plan;
  std::shared_ptr<ActivationHostPool> pool =
      std::make_shared<ActivationHostPool>();
  // Storages of the parameters and buffers: saved as they are under swap.
  std::unordered_set<const void*> no_swap;
  // LoRA: one slot per targeted projection; stable addresses (the modules
  // point at the adapters).
  std::vector<std::unique_ptr<LoraSlot>> lora;
  bool lora_merged = false;
  // A frozen view (CloneFrozen, CloneMerged): its base weights are another
  // model's, so it takes adapters only.
  bool lora_view = false;
  uint64_t lora_dropout_seed = 0;
  // Expert parallelism: the experts this model holds, and the group of the
  // ranks holding the others (borrowed).
  ExpertShard shard;
  GradientSync* expert_group = nullptr;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_MODEL_IMPL_H_
