#include "engine/rollout.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/vocab_kernels.h"

namespace fusionrl {

at::Tensor FilterLogits(const at::Tensor& logits, int top_k, double top_p) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  at::Tensor out = logits;
  const int64_t vocab = logits.size(-1);
  if (top_k > 0 && top_k < vocab) {
    auto kth = std::get<0>(at::topk(out, top_k, -1)).select(-1, top_k - 1);
    out = out.masked_fill(out < kth.unsqueeze(-1), neg_inf);
  }
  if (top_p < 1.0) {
    auto sorted = at::sort(out, -1, /*descending=*/true);
    auto& sorted_logits = std::get<0>(sorted);
    auto& sorted_idx = std::get<1>(sorted);
    auto cum = at::softmax(sorted_logits, -1).cumsum(-1);
    // Drop a token when the mass before it already reaches top_p; the first
    // token is always kept.
    auto drop = (cum - at::softmax(sorted_logits, -1)) >= top_p;
    auto drop_orig = at::zeros_like(drop).scatter(-1, sorted_idx, drop);
    out = out.masked_fill(drop_orig, neg_inf);
  }
  return out;
}

RolloutEngine::RolloutEngine(PolicyModel& model, int pad_id, int eos_id)
    : RolloutEngine(model, pad_id, std::vector<int>{eos_id}) {}

RolloutEngine::RolloutEngine(PolicyModel& model, int pad_id,
                             std::vector<int> stop_ids)
    : model_(model), pad_id_(pad_id), stop_ids_(std::move(stop_ids)) {}

bool RolloutEngine::IsStop(int id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

absl::StatusOr<std::vector<Completion>> RolloutEngine::Generate(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    uint64_t seed) {
  std::vector<Completion> completions(prompts.size());
  if (prompts.empty()) return completions;
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t prompt_len = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rollout: prompt ", i, " is empty"));
    }
    prompt_len = std::max<int64_t>(prompt_len, prompts[i].size());
  }
  const int64_t max_new = params.max_new_tokens;
  const int64_t total = prompt_len + max_new;
  if (total > model_.config().max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rollout: longest prompt (", prompt_len, " tokens) + max_new_tokens (",
        max_new, ") exceeds model.max_seq_len (", model_.config().max_seq_len,
        ")"));
  }

  c10::InferenceMode inference;
  model_.set_training(false);
  const auto device = model_.device();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);

  // Left-padded prompt batch, built on the host and moved once.
  auto prompt_tokens = at::full({batch, prompt_len}, pad_id_, long_opts);
  auto valid = at::zeros({batch, total}, long_opts.dtype(at::kBool));
  {
    auto tok_acc = prompt_tokens.accessor<int64_t, 2>();
    auto valid_acc = valid.accessor<bool, 2>();
    for (int64_t b = 0; b < batch; ++b) {
      const auto& p = prompts[b];
      const int64_t offset = prompt_len - static_cast<int64_t>(p.size());
      for (size_t j = 0; j < p.size(); ++j) {
        tok_acc[b][offset + j] = p[j];
        valid_acc[b][offset + j] = true;
      }
    }
  }
  prompt_tokens = prompt_tokens.to(device);
  valid = valid.to(device);
  auto prompt_valid = valid.narrow(1, 0, prompt_len);
  auto next_pos = prompt_valid.sum(1, /*keepdim=*/true);  // [B, 1]

  KvCache cache = model_.NewCache(batch, total);
  auto logits =
      model_
          .ForwardCached(prompt_tokens, PositionsFromValid(prompt_valid),
                         prompt_valid, cache, /*last_only=*/true)
          .select(1, 0);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto out_tokens =
      at::full({batch, max_new}, pad_id_, long_opts.device(device));
  auto out_logp = at::zeros(
      {batch, max_new}, at::TensorOptions().dtype(at::kFloat).device(device));
  auto alive = at::ones({batch}, long_opts.dtype(at::kBool).device(device));
  int64_t steps = 0;
  const bool greedy = params.temperature <= 0.0;
  const bool unfiltered = greedy || (params.top_k <= 0 && params.top_p >= 1.0);
  for (int64_t step = 0; step < max_new; ++step) {
    at::Tensor next, token_logp;
    if (unfiltered && device.is_cpu()) {
      // One fused pass per row: no [B, V] temporaries (vocab_kernels.h).
      // The same uniforms are drawn as on the composite path below.
      at::Tensor u;
      if (!greedy) {
        u = 1.0 - at::rand({batch}, gen, at::TensorOptions().dtype(at::kFloat));
      }
      SampledRows rows = SampleRows(logits, u, params.temperature);
      next = rows.tokens;
      token_logp = rows.logp;
    } else {
      auto scaled = greedy ? logits.to(at::kFloat)
                           : logits.to(at::kFloat) / params.temperature;
      auto logp_all = at::log_softmax(scaled, -1);
      if (greedy) {
        next = scaled.argmax(-1);
      } else {
        auto probs =
            at::softmax(FilterLogits(scaled, params.top_k, params.top_p), -1);
        auto cdf = probs.cumsum(-1);
        // Inverse-CDF draw with u in (0, 1]: the first token whose cumulative
        // mass reaches u; zero-probability tokens can never be chosen.
        auto u = (1.0 - at::rand({batch, 1}, gen,
                                 at::TensorOptions().dtype(at::kFloat)))
                     .to(device);
        next = (cdf < u * cdf.narrow(-1, cdf.size(-1) - 1, 1))
                   .sum(-1)
                   .clamp_max(cdf.size(-1) - 1);
      }
      token_logp = logp_all.gather(-1, next.unsqueeze(-1)).squeeze(-1);
    }
    next = at::where(alive, next, at::full_like(next, pad_id_));
    out_tokens.select(1, step).copy_(next);
    out_logp.select(1, step).copy_(
        at::where(alive, token_logp, at::zeros_like(token_logp)));
    valid.select(1, prompt_len + step).copy_(alive);
    for (int id : stop_ids_) alive = alive & (next != id);
    steps = step + 1;
    if (step + 1 == max_new || !alive.any().item<bool>()) break;
    logits =
        model_
            .ForwardCached(next.unsqueeze(1), next_pos,
                           valid.narrow(1, 0, prompt_len + step + 1), cache)
            .select(1, 0);
    next_pos = next_pos + 1;
  }

  auto tokens_cpu = out_tokens.narrow(1, 0, steps).to(at::kCPU).contiguous();
  auto logp_cpu = out_logp.narrow(1, 0, steps).to(at::kCPU).contiguous();
  auto tok_acc = tokens_cpu.accessor<int64_t, 2>();
  auto logp_acc = logp_cpu.accessor<float, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    Completion& c = completions[b];
    for (int64_t s = 0; s < steps; ++s) {
      const int tok = static_cast<int>(tok_acc[b][s]);
      c.tokens.push_back(tok);
      c.logp.push_back(logp_acc[b][s]);
      if (IsStop(tok)) {
        c.finished = true;
        break;
      }
    }
    tokens_generated_ += static_cast<int64_t>(c.tokens.size());
  }
  return completions;
}

}  // namespace fusionrl
