#include "engine/moe.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "engine/invariant_ops.h"
#include "engine/model.h"
#include "engine/moe_module.h"
#include "engine/sub_block_timing.h"
#include "engine/swiglu.h"

namespace fusionrl {
namespace moe {
namespace {

// Router math runs in float32, or in float64 for float64 inputs (tests).
at::ScalarType RouterType(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

int64_t Capacity(double capacity_factor, int64_t tokens, int top_k,
                 int num_experts) {
  if (capacity_factor <= 0) return 0;
  const double slots = std::ceil(capacity_factor * static_cast<double>(tokens) *
                                 top_k / num_experts);
  return std::max<int64_t>(1, static_cast<int64_t>(slots));
}

RouterOutput Route(const at::Tensor& logits, int top_k, int64_t capacity) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) >= 1,
              "moe::Route: logits must be [T >= 1, N], got ", logits.sizes());
  const int64_t t = logits.size(0), n = logits.size(1);
  TORCH_CHECK((top_k == 1 || top_k == 2) && top_k <= n,
              "moe::Route: top_k must be 1 or 2 and <= N (", n, "), got ",
              top_k);
  RouterOutput r;
  r.probs = at::softmax(logits.to(RouterType(logits)), -1);
  at::Tensor top_p, top_i;
  std::tie(top_p, top_i) = r.probs.topk(top_k, -1, /*largest=*/true,
                                        /*sorted=*/true);
  r.expert_index = top_i;
  // k = 1: the probability itself (Switch); k = 2: renormalised over the
  // two chosen experts (GShard, Mixtral).
  r.gates = top_k == 1 ? top_p : top_p / top_p.sum(-1, /*keepdim=*/true);
  // Assignments in priority order: every first choice by token order, then
  // every second choice by token order.
  const auto priority = top_i.t().reshape({-1});  // [k * T]
  const auto one_hot = at::one_hot(priority, n);  // [k * T, N] int64
  const double assignments = static_cast<double>(t * top_k);
  r.expert_load = one_hot.sum(0).to(at::kFloat) / assignments;
  if (capacity > 0) {
    // 0-based rank of each assignment in its expert's queue.
    const auto rank = (one_hot.cumsum(0) * one_hot).sum(1) - 1;
    const auto keep = rank < capacity;
    r.keep = keep.view({top_k, t}).t().contiguous();
    r.dropped_frac = keep.logical_not().sum().to(at::kFloat) /
                     static_cast<float>(assignments);
  } else {
    r.keep = at::ones({t, top_k}, logits.options().dtype(at::kBool));
    r.dropped_frac = at::zeros({}, logits.options().dtype(at::kFloat));
  }
  return r;
}

at::Tensor AuxLoss(const at::Tensor& probs, const at::Tensor& expert_index) {
  const int64_t n = probs.size(1);
  const auto f =
      at::one_hot(expert_index.reshape({-1}), n).sum(0).to(at::kFloat) /
      static_cast<double>(expert_index.numel());
  const auto p = probs.to(RouterType(probs)).mean(0);
  return (f * p).sum() * static_cast<double>(n);
}

at::Tensor ZLoss(const at::Tensor& logits) {
  return at::logsumexp(logits.to(RouterType(logits)), {-1}).pow(2).mean();
}

}  // namespace moe

MoeFeedForwardImpl::MoeFeedForwardImpl(int64_t d_model, int64_t d_ff,
                                       int num_experts, int top_k,
                                       double capacity_factor,
                                       bool shared_expert)
    : num_experts_(num_experts),
      top_k_(top_k),
      capacity_factor_(capacity_factor) {
  router = register_module(
      "router",
      torch::nn::Linear(
          torch::nn::LinearOptions(d_model, num_experts).bias(false)));
  for (int i = 0; i < num_experts; ++i) {
    experts.push_back(
        register_module("expert" + std::to_string(i), SwiGLU(d_model, d_ff)));
  }
  if (shared_expert) {
    shared = register_module("shared_expert", SwiGLU(d_model, d_ff));
  }
}

void MoeFeedForwardImpl::SetRecomputeAct(bool on) {
  recompute_act_ = on;
  for (SwiGLU& e : experts) e->recompute_act = on;
  if (!shared.is_empty()) shared->recompute_act = on;
}

void MoeFeedForwardImpl::SetTimer(SubBlockTimer* timer, int layer) {
  timer_ = timer;
  layer_ = layer;
  for (SwiGLU& e : experts) {
    e->timer = timer;
    e->layer = layer;
  }
  if (!shared.is_empty()) {
    shared->timer = timer;
    shared->layer = layer;
  }
}

torch::Tensor MoeFeedForwardImpl::forward(const torch::Tensor& x,
                                          const torch::Tensor& token_valid,
                                          bool apply_capacity) {
  const int64_t d = x.size(-1);
  const auto flat = x.reshape({-1, d});
  if (token_valid.defined()) {
    const auto rows = token_valid.reshape({-1}).nonzero().squeeze(1);
    if (rows.size(0) != flat.size(0)) {
      const auto y = Dispatch(flat.index_select(0, rows), apply_capacity);
      return torch::zeros_like(flat).index_copy(0, rows, y).view(x.sizes());
    }
  }
  return Dispatch(flat, apply_capacity).view(x.sizes());
}

torch::Tensor MoeFeedForwardImpl::Dispatch(const torch::Tensor& x,
                                           bool apply_capacity) {
  const int64_t m = x.size(0);
  auto f32 = x.options().dtype(torch::kFloat);
  if (m == 0) {
    stats_.aux_loss = torch::zeros({}, f32);
    stats_.z_loss = torch::zeros({}, f32);
    stats_.expert_load = torch::zeros({num_experts_}, f32);
    stats_.dropped_frac = torch::zeros({}, f32);
    return torch::zeros_like(x);
  }
  const auto logits = InvariantLinear(x, router->weight);  // [M, N]
  const int64_t capacity =
      apply_capacity ? moe::Capacity(capacity_factor_, m, top_k_, num_experts_)
                     : 0;
  const moe::RouterOutput r = moe::Route(logits, top_k_, capacity);
  stats_.aux_loss = moe::AuxLoss(r.probs, r.expert_index);
  stats_.z_loss = moe::ZLoss(logits);
  stats_.expert_load = r.expert_load.detach();
  stats_.dropped_frac = r.dropped_frac.detach();

  // Assignments in priority order; dropped ones go to bucket N, never run.
  const auto expert = r.expert_index.t().reshape({-1});
  const auto bucket =
      expert.masked_fill(r.keep.t().reshape({-1}).logical_not(), num_experts_);
  const auto order =
      std::get<1>(bucket.sort(c10::optional<bool>(true), /*dim=*/0));
  const auto counts =
      torch::bincount(bucket, /*weights=*/{}, num_experts_ + 1).to(torch::kCPU);
  const auto count = counts.accessor<int64_t, 1>();
  const auto token =
      torch::arange(m, x.options().dtype(torch::kLong)).repeat({top_k_});
  const auto gate = r.gates.t().reshape({-1});
  auto out = torch::zeros_like(x);
  const bool recompute = recompute_act_ && at::GradMode::is_enabled();
  int64_t start = 0;
  for (int i = 0; i < num_experts_; ++i) {
    const int64_t n = count[i];
    if (n == 0) continue;
    const auto slots = order.narrow(0, start, n);
    start += n;
    const auto rows = token.index_select(0, slots);
    const auto g = gate.index_select(0, slots).unsqueeze(1).to(x.scalar_type());
    if (recompute) {
      const SwiGLU& e = experts[i];
      out.index_add_(0, rows,
                     SwiGLURecomputedAct(x, rows, g, e->w1->weight,
                                         e->w3->weight, e->w2->weight));
      continue;
    }
    // Profiling: the gather and the gating are what mlp_act recomputes
    // besides the expert's SiLU and product (timed in SwiGLUImpl::forward).
    const auto xs = TimeSubBlock(timer_, layer_, kMlpActSlot,
                                 [&] { return x.index_select(0, rows); });
    const auto y = experts[i]->forward(xs);
    out.index_add_(0, rows, TimeSubBlock(timer_, layer_, kMlpActSlot, [&] {
                     return y * g;
                   }));
  }
  if (!shared.is_empty()) out = out + shared->forward(x);
  return out;
}

}  // namespace fusionrl
