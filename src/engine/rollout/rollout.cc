#include "engine/rollout/rollout.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/kernels/vocab_kernels.h"
#include "engine/model/expert_parallel.h"
#include "engine/rollout/cpu_decoder.h"
#include "engine/rollout/rollout_batch.h"

namespace fusionrl {

using rollout_internal::DistinctPrompts;
using rollout_internal::FindDistinctPrompts;
using rollout_internal::LeftPadded;
using rollout_internal::TokenCap;

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

namespace {

// Decode timings read the monotonic time of the process's Clock.
absl::Time MonotonicNow() { return RealClock().MonotonicNow(); }
double Since(absl::Time t0) { return RealClock().SecondsSince(t0); }

}  // namespace

// The fused vocabulary kernel on a CPU without top-k/top-p, else the
// composite ops.
std::pair<at::Tensor, at::Tensor> SampleTokens(const at::Tensor& logits,
                                               const at::Tensor& u,
                                               const SamplingParams& params) {
  const bool greedy = params.temperature <= 0.0;
  const bool unfiltered = greedy || (params.top_k <= 0 && params.top_p >= 1.0);
  if (unfiltered && logits.device().is_cpu()) {
    SampledRows rows =
        SampleRows(logits, greedy ? at::Tensor() : u, params.temperature);
    return {rows.tokens, rows.logp};
  }
  auto scaled = greedy ? logits.to(at::kFloat)
                       : logits.to(at::kFloat) / params.temperature;
  // The recorded log-prob is that of the distribution actually sampled
  // from: with top-k / top-p, the renormalised truncated one (the behaviour
  // policy of the importance weights pi_prox / pi_behaviour).
  const at::Tensor sampled =
      greedy ? scaled : FilterLogits(scaled, params.top_k, params.top_p);
  auto logp_all = at::log_softmax(sampled, -1);
  at::Tensor next;
  if (greedy) {
    next = scaled.argmax(-1);
  } else {
    auto probs = at::softmax(sampled, -1);
    auto cdf = probs.cumsum(-1);
    // Inverse-CDF draw with u in (0, 1]: the first token whose cumulative
    // mass reaches u; zero-probability tokens can never be chosen.
    auto ud = u.to(logits.device()).unsqueeze(1);
    next = (cdf < ud * cdf.narrow(-1, cdf.size(-1) - 1, 1))
               .sum(-1)
               .clamp_max(cdf.size(-1) - 1);
  }
  auto token_logp = logp_all.gather(-1, next.unsqueeze(-1)).squeeze(-1);
  return {next, token_logp};
}

namespace {
std::pair<at::Tensor, at::Tensor> SampleNext(const at::Tensor& logits,
                                             const at::Tensor& u,
                                             const SamplingParams& params) {
  return SampleTokens(logits, u, params);
}

}  // namespace

float RowUniform(uint64_t seed, int64_t i, int64_t t) {
  const uint64_t bits = MixSeed(MixSeed(seed, static_cast<uint64_t>(i)),
                                static_cast<uint64_t>(t));
  // 24 random bits: a float in (0, 1].
  return 1.0f - static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

void RolloutEngine::Configure(const RolloutConfig& config) {
  path_ = config.decode == DecodeMode::kComposite ? DecodePath::kComposite
          : config.decode == DecodeMode::kStatic  ? DecodePath::kStatic
                                                  : DecodePath::kFused;
  max_batch_ = config.decode_slots;
}

bool RolloutEngine::fused() const {
  return path_ == DecodePath::kFused && CpuDecoder::Supports(model_);
}

absl::StatusOr<std::vector<Completion>> RolloutEngine::Generate(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    uint64_t seed) {
  std::vector<SequenceKey> keys(prompts.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = {seed, static_cast<int64_t>(i)};
  }
  return Generate(prompts, params, keys);
}

absl::StatusOr<std::vector<Completion>> RolloutEngine::Generate(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    const std::vector<SequenceKey>& keys, const FinishedFn& on_finished) {
  if (lockstep_group_ == nullptr) {
    return GenerateOnce(prompts, params, keys, on_finished);
  }
  FUSIONRL_RETURN_IF_ERROR(ExpertLockstep::Applies(model_, fused(), "rollout"));
  ExpertLockstep lockstep(lockstep_group_);
  lockstep_ = &lockstep;
  absl::Cleanup unset = [this] { lockstep_ = nullptr; };
  // Whatever this call did, the group's other calls need this rank until
  // their last forward.
  auto out =
      lockstep.Finish(model_, GenerateOnce(prompts, params, keys, on_finished));
  stats_.expert_joins = lockstep.joins();
  return out;
}

absl::StatusOr<std::vector<Completion>> RolloutEngine::GenerateOnce(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    const std::vector<SequenceKey>& keys, const FinishedFn& on_finished) {
  stats_ = DecodeStats{};
  if (keys.size() != prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rollout: ", keys.size(),
                                                   " sampling keys for ",
                                                   prompts.size(), " prompts"));
  }
  if (prompts.empty()) return std::vector<Completion>{};
  const int64_t max_new = params.max_new_tokens;
  if (max_new < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rollout: max_new_tokens must be >= 1 (got ", max_new, ")"));
  }
  int64_t prompt_len = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rollout: prompt ", i, " is empty"));
    }
    prompt_len = std::max<int64_t>(prompt_len, prompts[i].size());
    if (keys[i].max_tokens < 0 || keys[i].max_tokens > max_new ||
        keys[i].first_token < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rollout: sequence ", i, " asks for max_tokens ", keys[i].max_tokens,
          " from token ", keys[i].first_token, " (0..max_new_tokens = ",
          max_new, " and a first token >= 0 allowed)"));
    }
    const int64_t need =
        static_cast<int64_t>(prompts[i].size()) + TokenCap(keys[i], params);
    if (need > model_.config().max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rollout: prompt ", i, " (", prompts[i].size(),
          " tokens) + the tokens it may sample (", need - prompts[i].size(),
          ", rollout.max_new_tokens) exceed model.max_seq_len (",
          model_.config().max_seq_len, ")"));
    }
  }
  const auto t0 = MonotonicNow();
  c10::InferenceMode inference;
  model_.set_training(false);
  auto out = fused() ? GenerateFused(prompts, params, keys, on_finished)
                     : GenerateComposite(prompts, params, keys);
  stats_.total_seconds = Since(t0);
  stats_.host_seconds =
      std::max(0.0, stats_.total_seconds - stats_.prefill_seconds -
                        stats_.model_seconds - stats_.sample_seconds);
  if (out.ok() && on_finished && !fused()) {
    for (size_t i = 0; i < out->size(); ++i) {
      on_finished(static_cast<int64_t>(i), (*out)[i]);
    }
  }
  if (out.ok()) {
    stats_.sequences = static_cast<int64_t>(out->size());
    for (const Completion& c : *out) {
      stats_.tokens += static_cast<int64_t>(c.tokens.size());
    }
    tokens_generated_ += stats_.tokens;
  }
  return out;
}

// The fused decode of one call (GenerateFused): sequences wait, then take a
// decoder slot until they finish; outputs are kept by sequence.
struct RolloutEngine::FusedDecode {
  FusedDecode(const std::vector<std::vector<int>>& p, const SamplingParams& s,
              const std::vector<SequenceKey>& k, const FinishedFn& f)
      : prompts(p), params(s), keys(k), on_finished(f) {}
  const std::vector<std::vector<int>>& prompts;
  const SamplingParams& params;
  const std::vector<SequenceKey>& keys;
  const FinishedFn& on_finished;
  int64_t batch = 0, prompt_len = 0;
  // Prefix sharing: each distinct prompt is prefilled once.
  DistinctPrompts distinct;
  KvCache prefill;
  std::vector<Completion> completions;
  std::vector<int64_t> cap;  // a slot holds its prompt and at most its cap
  int64_t capacity = 0;      // the longest prompt plus cap
  std::vector<char> done;
  // Slots [0, live) hold sequences slot_seq, each to be fed `pending`.
  std::vector<int64_t> slot_seq, pending;
  int64_t live = 0;
  int64_t next = 0;  // the next sequence to admit
  at::Tensor step_u;
};

absl::StatusOr<std::vector<Completion>> RolloutEngine::GenerateFused(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    const std::vector<SequenceKey>& keys, const FinishedFn& on_finished) {
  FusedDecode d(prompts, params, keys, on_finished);
  d.batch = static_cast<int64_t>(prompts.size());
  stats_.fused = true;
  auto t = MonotonicNow();
  auto [first, first_logp] = PrefillFused(d);
  stats_.prefill_seconds = Since(t);

  d.completions.resize(d.batch);
  d.cap.resize(d.batch);
  for (int64_t i = 0; i < d.batch; ++i) {
    d.cap[i] = TokenCap(keys[i], params);
    d.capacity = std::max<int64_t>(d.capacity, prompts[i].size() + d.cap[i]);
  }
  d.done.assign(d.batch, 0);
  for (int64_t i = 0; i < d.batch; ++i) {
    d.done[i] = RecordToken(d, i, first.data_ptr<int64_t>()[i],
                            first_logp.data_ptr<float>()[i]);
    if (d.done[i] && on_finished) on_finished(i, d.completions[i]);
  }
  DecodeFused(d);
  return std::move(d.completions);
}

// Prefills each distinct prompt once; every sequence's first token (and
// its log-prob) comes from its prompt's prefill logits.
std::pair<at::Tensor, at::Tensor> RolloutEngine::PrefillFused(FusedDecode& d) {
  d.distinct = FindDistinctPrompts(d.prompts);
  for (const auto& p : d.prompts) {
    d.prompt_len = std::max<int64_t>(d.prompt_len, p.size());
  }
  const int64_t n_unique = static_cast<int64_t>(d.distinct.unique.size());
  auto [prompt_tokens, prompt_valid] =
      LeftPadded(d.distinct.unique, d.prompt_len, 0, pad_id_, model_.device());
  // The prefill is a step of the card's work like a decode step (its
  // threads, its turn; a continued response's prefill is long).
  if (step_hook_) step_hook_();
  d.prefill = model_.NewCache(n_unique, d.prompt_len);
  at::Tensor prefill_logits =
      model_
          .ForwardCached(prompt_tokens, PositionsFromValid(prompt_valid),
                         prompt_valid, d.prefill, /*last_only=*/true)
          .select(1, 0);
  auto u = at::empty({d.batch}, at::TensorOptions().dtype(at::kFloat));
  float* u_data = u.data_ptr<float>();
  for (int64_t i = 0; i < d.batch; ++i) {
    u_data[i] =
        RowUniform(d.keys[i].seed, d.keys[i].index, d.keys[i].first_token);
  }
  auto rows =
      at::tensor(d.distinct.prompt_of, at::TensorOptions().dtype(at::kLong));
  auto [first, first_logp] =
      SampleNext(prefill_logits.index_select(0, rows), u, d.params);
  stats_.prefill_rows = n_unique;
  return {first.contiguous(), first_logp.to(at::kFloat).contiguous()};
}

bool RolloutEngine::RecordToken(FusedDecode& d, int64_t seq, int64_t token,
                                float logp) const {
  Completion& c = d.completions[seq];
  c.tokens.push_back(static_cast<int>(token));
  c.logp.push_back(logp);
  c.finished = IsStop(static_cast<int>(token));
  return c.finished || static_cast<int64_t>(c.tokens.size()) == d.cap[seq];
}

void RolloutEngine::DecodeFused(FusedDecode& d) {
  const int64_t slots =
      max_batch_ > 0 ? std::min(max_batch_, d.batch) : d.batch;
  CpuDecoder decoder(model_, slots, d.capacity);
  if (row_blocks_ > 0) decoder.set_row_blocks(row_blocks_);
  d.slot_seq.assign(slots, -1);
  d.pending.assign(slots, 0);
  d.step_u = at::empty({slots}, at::TensorOptions().dtype(at::kFloat));
  while (true) {
    // Admit waiting sequences into free slots (they are the last ones).
    while (d.live < slots && d.next < d.batch) {
      const int64_t seq = d.next++;
      if (d.done[seq]) continue;
      const int64_t prompt = d.distinct.prompt_of[seq];
      const int64_t len =
          static_cast<int64_t>(d.distinct.unique[prompt]->size());
      decoder.LoadPrefill(d.prefill, prompt, d.prompt_len - len, len, d.live);
      d.slot_seq[d.live] = seq;
      d.pending[d.live] = d.completions[seq].tokens.back();
      ++d.live;
    }
    if (d.live == 0) break;
    if (step_hook_) step_hook_();
    auto t = MonotonicNow();
    const at::Tensor& logits = decoder.Step(d.pending.data(), d.live);
    stats_.model_seconds += Since(t);
    ++stats_.decode_steps;
    stats_.rows_computed += d.live;
    t = MonotonicNow();
    auto [tokens, logp] = SampleSlots(d, logits);
    stats_.sample_seconds += Since(t);
    RetireFinished(d, decoder, tokens, logp);
  }
}

std::pair<at::Tensor, at::Tensor> RolloutEngine::SampleSlots(
    FusedDecode& d, const at::Tensor& logits) const {
  float* su = d.step_u.data_ptr<float>();
  for (int64_t s = 0; s < d.live; ++s) {
    const SequenceKey& key = d.keys[d.slot_seq[s]];
    su[s] = RowUniform(
        key.seed, key.index,
        key.first_token +
            static_cast<int64_t>(d.completions[d.slot_seq[s]].tokens.size()));
  }
  auto [tokens, logp] =
      SampleNext(logits, d.step_u.narrow(0, 0, d.live), d.params);
  return {tokens.contiguous(), logp.to(at::kFloat).contiguous()};
}

// Records each slot's token; a finished sequence leaves its slot, which the
// last live slot fills. From the last slot down, so that a finished slot is
// filled by a slot already handled this step.
void RolloutEngine::RetireFinished(FusedDecode& d, CpuDecoder& decoder,
                                   const at::Tensor& tokens,
                                   const at::Tensor& logp) const {
  const int64_t* tok = tokens.data_ptr<int64_t>();
  const float* lp = logp.data_ptr<float>();
  for (int64_t s = d.live - 1; s >= 0; --s) {
    const int64_t seq = d.slot_seq[s];
    if (!RecordToken(d, seq, tok[s], lp[s])) {
      d.pending[s] = tok[s];
      continue;
    }
    d.done[seq] = 1;
    if (d.on_finished) d.on_finished(seq, d.completions[seq]);
    const int64_t last = d.live - 1;
    if (s != last) {
      decoder.MoveSlot(last, s);
      d.slot_seq[s] = d.slot_seq[last];
      d.pending[s] = d.pending[last];
    }
    --d.live;
  }
}

}  // namespace fusionrl
