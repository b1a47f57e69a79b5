// One decoder layer of the policy (engine/model/decoder_block.h): its forward,
// and the plan-driven training forward that keeps, recomputes or swaps each
// sub-block's activations.
#include "engine/model/decoder_block.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>

#include "engine/model/sub_block_timing.h"

namespace fusionrl {

BlockImpl::BlockImpl(const ModelConfig& c, ExpertShard shard) {
  attn_norm = register_module("attn_norm", RMSNorm(c.d_model, c.norm_eps));
  attn = register_module("attn", Attention(c));
  mlp_norm = register_module("mlp_norm", RMSNorm(c.d_model, c.norm_eps));
  if (c.moe_experts > 0) {
    moe = register_module(
        "mlp", MoeFeedForward(c.d_model, c.moe_d_ff > 0 ? c.moe_d_ff : c.d_ff,
                              c.moe_experts, c.moe_top_k, c.moe_groups,
                              c.moe_capacity_factor, c.moe_shared_expert, shard,
                              RouterRenormalises(c.moe_gates, c.moe_top_k)));
  } else {
    mlp = register_module("mlp", SwiGLU(c.d_model, c.d_ff));
  }
  SetPlan(LayerActivationPlan{});
}
torch::Tensor BlockImpl::forward(
    const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
    const torch::Tensor& mask, torch::Tensor* cache_k, torch::Tensor* cache_v,
    int64_t cache_start, const MoeRouting& routing) {
  aux_loss = torch::Tensor();
  z_loss = torch::Tensor();
  if (cache_k == nullptr && at::GradMode::is_enabled() &&
      (!AllKeep() || timer != nullptr)) {
    return PlannedForward(x, cos, sin, mask, routing);
  }
  auto h =
      x + attn(attn_norm(x), cos, sin, mask, cache_k, cache_v, cache_start);
  if (!moe.is_empty()) {
    return h + moe(mlp_norm(h), routing);
  }
  return h + mlp(mlp_norm(h));
}

torch::Tensor BlockImpl::ForwardWindow(const torch::Tensor& x,
                                       const torch::Tensor& cos,
                                       const torch::Tensor& sin,
                                       const torch::Tensor& mask,
                                       int64_t first) {
  aux_loss = torch::Tensor();
  z_loss = torch::Tensor();
  auto h =
      x.narrow(1, first, x.size(1) - first) +
      attn->forward(attn_norm(x), cos, sin, mask, nullptr, nullptr, 0, first);
  return h + mlp(mlp_norm(h));
}

bool BlockImpl::WindowApplies() const {
  return moe.is_empty() && AllKeep() && timer == nullptr;
}

bool BlockImpl::AllKeep() const {
  return plan_.attention == ActivationAction::kKeep &&
         plan_.mlp == ActivationAction::kKeep &&
         plan_.norm == ActivationAction::kKeep;
}

void BlockImpl::Apply(int step, Values& v, const torch::Tensor& cos,
                      const torch::Tensor& sin, const torch::Tensor& mask,
                      const MoeRouting& routing) {
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
      v[kY] = v[kH] + moe(v[kN2], routing);
      // The router's losses are outputs of the step, so under recompute
      // they are outputs of the recompute node and their gradient flows
      // through the recomputed graph, exactly as without it.
      v[kAux] = moe->last_stats().aux_loss;
      v[kZ] = moe->last_stats().z_loss;
  }
}

void BlockImpl::SetPlan(const LayerActivationPlan& p) {
  static const std::vector<int> kReads[4] = {{kX}, {kX, kN1}, {kH}, {kH, kN2}};
  static const std::vector<int> kWrites[4] = {
      {kN1}, {kH}, {kN2}, {kY, kAux, kZ}};
  plan_ = p;
  // The core runs inside the attention sub-block: under a recomputed
  // sub-block it is recomputed already.
  attn->recompute_core = p.attention_core == ActivationAction::kRecompute &&
                         p.attention != ActivationAction::kRecompute;
  // Likewise the SwiGLUs' insides under a recomputed mlp sub-block.
  const bool act = p.mlp_act == ActivationAction::kRecompute &&
                   p.mlp != ActivationAction::kRecompute;
  if (moe.is_empty()) {
    mlp->recompute_act = act;
  } else {
    moe->SetRecomputeAct(act);
  }
  const ActivationAction action[4] = {p.norm, p.attention, p.norm, p.mlp};
  segments_.clear();
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
    segments_.push_back(std::move(seg));
  }
}

torch::Tensor BlockImpl::PlannedForward(const torch::Tensor& x,
                                        const torch::Tensor& cos,
                                        const torch::Tensor& sin,
                                        const torch::Tensor& mask,
                                        const MoeRouting& routing) {
  const int kind[4] = {2, 0, 2, 1};  // timer slot of each step
  torch::nn::Module* module[4] = {
      attn_norm.ptr().get(), attn.ptr().get(), mlp_norm.ptr().get(),
      moe.is_empty() ? static_cast<torch::nn::Module*>(mlp.ptr().get())
                     : moe.ptr().get()};
  Values v;
  v[kX] = x;
  for (const Segment& seg : segments_) {
    const int i = seg.first, j = seg.last;
    const std::vector<int>& in = seg.in;
    const std::vector<int>& out = seg.out;
    RecomputeFn fn = [this, i, j, in, out, cos, sin, mask,
                      routing](const Tensors& inputs) {
      Values local;
      for (size_t k = 0; k < in.size(); ++k) local[in[k]] = inputs[k];
      for (int s = i; s <= j; ++s) {
        Apply(s, local, cos, sin, mask, routing);
      }
      Tensors result;
      for (int w : out) result.push_back(local[w]);
      return result;
    };
    Tensors inputs;
    for (int r : in) inputs.push_back(v[r]);
    std::vector<at::Tensor> params;
    for (int s = i; s <= j; ++s) {
      for (const auto& p : module[s]->parameters()) params.push_back(p);
      // LoRA adapters are the model's, not the modules' parameters.
      const LoraAdapter* const* adapters =
          s == 1 ? attn->lora.data()
                 : (s == 3 && moe.is_empty() ? mlp->lora.data() : nullptr);
      const int count = s == 1 ? 4 : 3;
      for (int k = 0; adapters != nullptr && k < count; ++k) {
        if (adapters[k] == nullptr) continue;
        params.push_back(adapters[k]->a);
        params.push_back(adapters[k]->b);
      }
    }
    // A fused run's time goes to its first step's slot (the planner times
    // only plans without recompute, where every run is one step).
    Tensors outs =
        Run(kind[i], seg.action, std::move(fn), inputs, std::move(params));
    for (size_t k = 0; k < out.size(); ++k) v[out[k]] = outs[k];
  }
  if (!moe.is_empty() && plan_.mlp == ActivationAction::kRecompute) {
    aux_loss = v[kAux];
    z_loss = v[kZ];
  }
  return v[kY];
}

BlockImpl::Tensors BlockImpl::Run(int kind, ActivationAction action,
                                  RecomputeFn fn, const Tensors& inputs,
                                  std::vector<at::Tensor> params) {
  return TimeSubBlock(timer, layer, kind, [&] {
    return RunAs(action, std::move(fn), inputs, std::move(params));
  });
}

BlockImpl::Tensors BlockImpl::RunAs(ActivationAction action, RecomputeFn fn,
                                    const Tensors& inputs,
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

}  // namespace fusionrl
