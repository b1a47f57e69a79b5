#include "engine/model/moe.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "engine/collectives/grad_sync.h"
#include "engine/kernels/invariant_ops.h"
#include "engine/model/model.h"
#include "engine/model/moe_module.h"
#include "engine/model/sub_block_timing.h"
#include "engine/model/swiglu.h"

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
  RouteOptions options;
  options.top_k = top_k;
  options.capacity = capacity;
  return Route(logits, options);
}

RouterOutput Route(const at::Tensor& logits, const RouteOptions& options) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) >= 1,
              "moe::Route: logits must be [T >= 1, N], got ", logits.sizes());
  const int64_t t = logits.size(0), n = logits.size(1);
  const int top_k = options.top_k, groups = options.groups;
  const int64_t capacity = options.capacity;
  TORCH_CHECK(top_k >= 1 && top_k <= n, "moe::Route: top_k must be in [1, N (",
              n, ")], got ", top_k);
  TORCH_CHECK(groups >= 1 && n % groups == 0 && top_k % groups == 0,
              "moe::Route: groups (", groups, ") must divide N (", n,
              ") and top_k (", top_k, ")");
  const bool replay = options.replay.defined();
  TORCH_CHECK(!replay || (capacity == 0 && options.replay.dim() == 2 &&
                          options.replay.size(0) == t &&
                          options.replay.size(1) == top_k),
              "moe::Route: replay must be [T, top_k] with capacity 0, got ",
              options.replay.sizes(), " with capacity ", capacity);
  RouterOutput r;
  r.probs = at::softmax(logits.to(RouterType(logits)), -1);
  at::Tensor top_p, top_i;
  if (groups == 1) {
    std::tie(top_p, top_i) = r.probs.topk(top_k, -1, /*largest=*/true,
                                          /*sorted=*/true);
  } else {
    // MoGE: the k / G best of each group's N / G experts, then all k best
    // first (a stable sort: ties keep the lower group first).
    const int64_t per = n / groups, k_group = top_k / groups;
    auto [group_p, group_i] =
        r.probs.view({t, groups, per})
            .topk(k_group, -1, /*largest=*/true, /*sorted=*/true);
    group_i =
        group_i +
        at::arange(groups, group_i.options()).mul(per).view({1, groups, 1});
    at::Tensor order;
    std::tie(top_p, order) = group_p.reshape({t, top_k})
                                 .sort(c10::optional<bool>(true), /*dim=*/-1,
                                       /*descending=*/true);
    top_i = group_i.reshape({t, top_k}).gather(1, order);
  }
  if (replay) {
    top_i = at::where(options.replay.ge(0), options.replay, top_i);
    top_p = r.probs.gather(1, top_i);
  }
  r.expert_index = top_i;
  // By default k = 1: the probability itself (Switch); k >= 2: renormalised
  // over the chosen experts (GShard, Mixtral). model.moe_gates can pin
  // either (Hugging Face's norm_topk_prob).
  const bool renormalise = options.renormalise.value_or(top_k >= 2);
  r.gates = renormalise ? top_p / top_p.sum(-1, /*keepdim=*/true) : top_p;
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

std::vector<double> GroupLoads(const std::vector<double>& expert_load,
                               int groups) {
  std::vector<double> out(groups, 0.0);
  const size_t per_group = expert_load.size() / groups;
  for (size_t e = 0; e < expert_load.size(); ++e) {
    out[e / per_group] += expert_load[e];
  }
  return out;
}

at::Tensor ZLoss(const at::Tensor& logits) {
  return at::logsumexp(logits.to(RouterType(logits)), {-1}).pow(2).mean();
}

}  // namespace moe

MoeFeedForwardImpl::MoeFeedForwardImpl(int64_t d_model, int64_t d_ff,
                                       int num_experts, int top_k, int groups,
                                       double capacity_factor,
                                       bool shared_expert, ExpertShard shard,
                                       std::optional<bool> renormalise_gates)
    : num_experts_(num_experts),
      top_k_(top_k),
      groups_(groups),
      renormalise_gates_(renormalise_gates),
      shard_(shard),
      capacity_factor_(capacity_factor) {
  TORCH_CHECK(shard.size >= 1 && num_experts % shard.size == 0 &&
                  shard.rank >= 0 && shard.rank < shard.size,
              "MoE: expert shard ", shard.rank, " of ", shard.size,
              " does not split ", num_experts, " experts evenly");
  router = register_module(
      "router",
      torch::nn::Linear(
          torch::nn::LinearOptions(d_model, num_experts).bias(false)));
  const int local = num_experts / shard.size;
  for (int i = first_expert(); i < first_expert() + local; ++i) {
    experts.push_back(
        register_module("expert" + std::to_string(i), SwiGLU(d_model, d_ff)));
  }
  if (shared_expert) {
    shared = register_module("shared_expert", SwiGLU(d_model, d_ff));
  }
}

void MoeFeedForwardImpl::set_expert_group(GradientSync* group) {
  TORCH_CHECK(
      group == nullptr ||
          (group->world_size() == shard_.size && group->rank() == shard_.rank),
      "MoE: the expert group (rank ", group ? group->rank() : -1, " of ",
      group ? group->world_size() : 0, ") is not this module's shard (",
      shard_.rank, " of ", shard_.size, ")");
  expert_group_ = group;
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
                                          const MoeRouting& routing) {
  const int64_t d = x.size(-1);
  const auto flat = x.reshape({-1, d});
  const int64_t m = flat.size(0);
  torch::Tensor replay = routing.replay.defined()
                             ? routing.replay.reshape({m, top_k_})
                             : torch::Tensor();
  torch::Tensor routes;
  torch::Tensor* record = record_routes_ ? &routes : nullptr;
  auto finish = [&](const torch::Tensor& y, const torch::Tensor& rows) {
    if (record_routes_) {
      if (rows.defined()) {
        routes = torch::full({m, top_k_}, -1, routes.options())
                     .index_copy(0, rows, routes);
      }
      auto shape = x.sizes().vec();
      shape.back() = top_k_;
      routes_ = routes.view(shape);
    }
    return y.view(x.sizes());
  };
  if (routing.token_valid.defined()) {
    const auto rows = routing.token_valid.reshape({-1}).nonzero().squeeze(1);
    if (rows.size(0) != m) {
      const auto y = Dispatch(
          flat.index_select(0, rows), routing.apply_capacity,
          replay.defined() ? replay.index_select(0, rows) : replay, record);
      return finish(torch::zeros_like(flat).index_copy(0, rows, y), rows);
    }
  }
  return finish(Dispatch(flat, routing.apply_capacity, replay, record),
                torch::Tensor());
}

torch::Tensor MoeFeedForwardImpl::Dispatch(const torch::Tensor& x,
                                           bool apply_capacity,
                                           const torch::Tensor& replay,
                                           torch::Tensor* routes) {
  const int64_t m = x.size(0);
  auto f32 = x.options().dtype(torch::kFloat);
  const bool parallel = shard_.size > 1;
  TORCH_CHECK(!parallel || expert_group_ != nullptr, "MoE: expert shard ",
              shard_.rank, " of ", shard_.size,
              " has no expert group (set_expert_group)");
  if (m == 0) {
    if (routes != nullptr) {
      *routes = torch::empty({0, top_k_}, x.options().dtype(torch::kLong));
    }
    // An expert-parallel rank with no tokens still serves its experts to
    // the others (the exchanges are collective).
    if (parallel) {
      // Its (empty) result stays in the graph, so backward joins the
      // reverse exchanges too.
      const auto none = torch::empty({0}, x.options().dtype(torch::kLong));
      return torch::zeros_like(x).index_add(
          0, none, ExchangeAndRun(x, std::vector<int64_t>(num_experts_, 0)));
    }
    stats_.aux_loss = torch::zeros({}, f32);
    stats_.z_loss = torch::zeros({}, f32);
    stats_.expert_load = torch::zeros({num_experts_}, f32);
    stats_.dropped_frac = torch::zeros({}, f32);
    return torch::zeros_like(x);
  }
  const auto logits = InvariantLinear(x, router->weight);  // [M, N]
  moe::RouteOptions options;
  options.top_k = top_k_;
  options.groups = groups_;
  options.replay = replay;
  options.renormalise = renormalise_gates_;
  options.capacity =
      apply_capacity && !replay.defined()
          ? moe::Capacity(capacity_factor_, m, top_k_, num_experts_)
          : 0;
  const moe::RouterOutput r = moe::Route(logits, options);
  stats_.aux_loss = moe::AuxLoss(r.probs, r.expert_index);
  stats_.z_loss = moe::ZLoss(logits);
  stats_.expert_load = r.expert_load.detach();
  stats_.dropped_frac = r.dropped_frac.detach();
  if (routes != nullptr) {
    *routes = r.expert_index.masked_fill(r.keep.logical_not(), -1);
  }

  // Assignment a = choice * M + token, in priority order; dropped ones go to
  // bucket N and are never run. The index work is done once: the kept
  // assignments sorted by expert, their tokens and gates gathered in that
  // order; each expert then reads a contiguous slice.
  const auto expert = r.expert_index.t().reshape({-1});
  const auto bucket =
      expert.masked_fill(r.keep.t().reshape({-1}).logical_not(), num_experts_);
  const auto order =
      std::get<1>(bucket.sort(c10::optional<bool>(true), /*dim=*/0));
  const auto counts =
      torch::bincount(bucket, /*weights=*/{}, num_experts_ + 1).to(torch::kCPU);
  const auto count = counts.accessor<int64_t, 1>();
  const int64_t kept = top_k_ * m - count[num_experts_];
  // The kept assignments in expert order: their tokens and gates.
  const auto slots = order.narrow(0, 0, kept);
  const auto token = slots.remainder(m);
  const auto gate =
      r.gates.t().reshape({-1}).index_select(0, slots).unsqueeze(1).to(
          x.scalar_type());
  auto out = torch::zeros_like(x);
  if (parallel) {
    const std::vector<int64_t> per_expert(count.data(),
                                          count.data() + num_experts_);
    const auto y = ExchangeAndRun(x.index_select(0, token), per_expert);
    out.index_add_(0, token, y * gate);
  } else if (kept > 0) {
    const std::vector<int64_t> per_expert(count.data(),
                                          count.data() + num_experts_);
    std::vector<int> expert_of(num_experts_);
    for (int i = 0; i < num_experts_; ++i) expert_of[i] = i;
    out.index_add_(0, token, RunExperts(x, token, gate, per_expert, expert_of));
  }
  if (!shared.is_empty()) out = out + shared->forward(x);
  return out;
}

namespace {

at::Tensor Exchange(GradientSync* group, const at::Tensor& x,
                    const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv) {
  absl::StatusOr<at::Tensor> out = group->AllToAll(x, send, recv);
  TORCH_CHECK(out.ok(), "MoE expert parallelism: ", out.status().ToString());
  return *std::move(out);
}

// Rows sent to the ranks of an expert group; backward returns each row's
// gradient to the rank it came from (the reverse exchange).
class RowExchange : public torch::autograd::Function<RowExchange> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& x, GradientSync* group,
                            const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["like"] = x.new_empty({0, x.size(1)});
    return Exchange(group, x, send, recv);
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto* group =
        reinterpret_cast<GradientSync*>(ctx->saved_data["group"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    at::Tensor g = grads[0];
    if (!g.defined()) {
      // Every rank must join the exchange, with or without a gradient.
      int64_t rows = 0;
      for (int64_t n : recv) rows += n;
      const at::Tensor like = ctx->saved_data["like"].toTensor();
      g = at::zeros({rows, like.size(1)}, like.options());
    }
    return {Exchange(group, g, recv, send), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

torch::Tensor MoeFeedForwardImpl::RunExperts(
    const torch::Tensor& x, const torch::Tensor& rows,
    const torch::Tensor& gate, const std::vector<int64_t>& counts,
    const std::vector<int>& expert_of) {
  bool lora = false;
  for (const SwiGLU& e : experts) {
    for (const LoraAdapter* a : e->lora) lora = lora || a != nullptr;
  }
  std::vector<torch::Tensor> w1, w3, w2;
  if (!lora) {
    for (int e : expert_of) {
      w1.push_back(experts[e]->w1->weight);
      w3.push_back(experts[e]->w3->weight);
      w2.push_back(experts[e]->w2->weight);
    }
  }
  const bool grad = at::GradMode::is_enabled();
  if (grad && recompute_act_ && !lora) {
    // Gathered, gated and scattered back inside one node: no gathered copy
    // is saved (autograd keeps x anyway).
    return GroupedSwiGLURecomputedAct(x, rows, gate, counts, w1, w3, w2);
  }
  const torch::Tensor xs = TimeSubBlock(timer_, layer_, kMlpActSlot, [&] {
    return rows.defined() ? x.index_select(0, rows) : x;
  });
  if (!grad && !lora) return GroupedSwiGLU(xs, gate, counts, w1, w3, w2);
  torch::Tensor y;
  if (lora) {
    // The adapters run in the experts' own forwards, one expert at a time.
    std::vector<torch::Tensor> ys;
    int64_t start = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      if (counts[g] > 0) {
        ys.push_back(
            experts[expert_of[g]]->forward(xs.narrow(0, start, counts[g])));
      }
      start += counts[g];
    }
    y = ys.size() == 1 ? ys[0] : torch::cat(ys);
  } else {
    const torch::Tensor h1 = InvariantGroupedLinear(xs, counts, w1);
    const torch::Tensor h3 = InvariantGroupedLinear(xs, counts, w3);
    // Profiling: what mlp_act would recompute.
    y = InvariantGroupedLinear(
        TimeSubBlock(timer_, layer_, kMlpActSlot,
                     [&] { return torch::silu(h1) * h3; }),
        counts, w2);
  }
  if (!gate.defined()) return y;
  // Profiling: the gating is recomputed under mlp_act too.
  return TimeSubBlock(timer_, layer_, kMlpActSlot, [&] { return y * gate; });
}

torch::Tensor MoeFeedForwardImpl::ExchangeAndRun(
    const torch::Tensor& xs, const std::vector<int64_t>& count) {
  const int ranks = shard_.size;
  const int per = num_experts_ / ranks;
  // Every rank learns how many rows of each of its experts each rank
  // sends: recv_count[s * per + e], rank s's rows for local expert e.
  const std::vector<int64_t> per_rank(ranks, per);
  const at::Tensor recv_count_t = Exchange(
      expert_group_, torch::tensor(count, torch::kLong), per_rank, per_rank);
  const std::vector<int64_t> recv_count(
      recv_count_t.data_ptr<int64_t>(),
      recv_count_t.data_ptr<int64_t>() + num_experts_);
  std::vector<int64_t> send_rows(ranks, 0), recv_rows(ranks, 0);
  for (int i = 0; i < num_experts_; ++i) {
    send_rows[i / per] += count[i];
    recv_rows[i / per] += recv_count[i];
  }
  const at::Tensor received =
      RowExchange::apply(xs, expert_group_, send_rows, recv_rows);
  // Received rows are rank-major, expert-minor (recv_count's order): block
  // b is rank b / per's rows for local expert b % per, a contiguous slice,
  // so the outputs come out in arrival order with no regrouping copy.
  // No rows (then `received` is empty): still the graph's, so that
  // backward joins the reverse exchanges.
  std::vector<int> expert_of(num_experts_);
  for (int b = 0; b < num_experts_; ++b) expert_of[b] = b % per;
  const at::Tensor y =
      received.size(0) == 0
          ? received
          : RunExperts(received, {}, {}, recv_count, expert_of);
  return RowExchange::apply(y, expert_group_, recv_rows, send_rows);
}

}  // namespace fusionrl
