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
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/rollout/cpu_decoder.h"
#include "engine/model/expert_parallel.h"
#include "engine/kernels/vocab_kernels.h"

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

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

// Left-padded batch of `prompts` [n, len] and its validity [n, len + extra]
// (the prompt part set), on `device`.
std::pair<at::Tensor, at::Tensor> LeftPadded(
    const std::vector<const std::vector<int>*>& prompts, int64_t len,
    int64_t extra, int pad_id, c10::Device device) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  auto tokens = at::full({n, len}, pad_id, long_opts);
  auto valid = at::zeros({n, len + extra}, long_opts.dtype(at::kBool));
  auto tok_acc = tokens.accessor<int64_t, 2>();
  auto valid_acc = valid.accessor<bool, 2>();
  for (int64_t b = 0; b < n; ++b) {
    const auto& p = *prompts[b];
    const int64_t offset = len - static_cast<int64_t>(p.size());
    for (size_t j = 0; j < p.size(); ++j) {
      tok_acc[b][offset + j] = p[j];
      valid_acc[b][offset + j] = true;
    }
  }
  return {tokens.to(device), valid.to(device)};
}

// Prefix sharing: the distinct prompts of a batch, in first-seen order,
// and for each sequence the index of its prompt among them.
struct DistinctPrompts {
  std::vector<const std::vector<int>*> unique;
  std::vector<int64_t> prompt_of;
};

DistinctPrompts FindDistinctPrompts(
    const std::vector<std::vector<int>>& prompts) {
  DistinctPrompts d;
  std::map<std::vector<int>, int64_t> index;
  d.prompt_of.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto [it, added] =
        index.emplace(prompts[i], static_cast<int64_t>(d.unique.size()));
    if (added) d.unique.push_back(&prompts[i]);
    d.prompt_of[i] = it->second;
  }
  return d;
}

}  // namespace

float RowUniform(uint64_t seed, int64_t i, int64_t t) {
  const uint64_t bits = MixSeed(MixSeed(seed, static_cast<uint64_t>(i)),
                                static_cast<uint64_t>(t));
  // 24 random bits: a float in (0, 1].
  return 1.0f - static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

namespace {
// How many tokens a call may sample for the sequence of `key`.
int64_t TokenCap(const SequenceKey& key, const SamplingParams& params) {
  return key.max_tokens > 0
             ? std::min<int64_t>(key.max_tokens, params.max_new_tokens)
             : params.max_new_tokens;
}
}  // namespace

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
  const auto t0 = Clock::now();
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

absl::StatusOr<std::vector<Completion>> RolloutEngine::GenerateFused(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    const std::vector<SequenceKey>& keys, const FinishedFn& on_finished) {
  const int64_t batch = static_cast<int64_t>(prompts.size());
  stats_.fused = true;
  auto t = Clock::now();

  // Prefix sharing: each distinct prompt is prefilled once.
  const auto [unique, prompt_of] = FindDistinctPrompts(prompts);
  int64_t prompt_len = 0;
  for (const auto& p : prompts) {
    prompt_len = std::max<int64_t>(prompt_len, p.size());
  }
  const int64_t n_unique = static_cast<int64_t>(unique.size());
  auto [prompt_tokens, prompt_valid] =
      LeftPadded(unique, prompt_len, 0, pad_id_, model_.device());
  // The prefill is a step of the card's work like a decode step (its
  // threads, its turn; a continued response's prefill is long).
  if (step_hook_) step_hook_();
  KvCache prefill = model_.NewCache(n_unique, prompt_len);
  at::Tensor prefill_logits =
      model_
          .ForwardCached(prompt_tokens, PositionsFromValid(prompt_valid),
                         prompt_valid, prefill, /*last_only=*/true)
          .select(1, 0);
  // Every sequence's first token comes from its prompt's prefill logits.
  auto u = at::empty({batch}, at::TensorOptions().dtype(at::kFloat));
  float* u_data = u.data_ptr<float>();
  for (int64_t i = 0; i < batch; ++i) {
    u_data[i] = RowUniform(keys[i].seed, keys[i].index, keys[i].first_token);
  }
  auto rows = at::tensor(prompt_of, at::TensorOptions().dtype(at::kLong));
  auto [first, first_logp] =
      SampleNext(prefill_logits.index_select(0, rows), u, params);
  first = first.contiguous();
  first_logp = first_logp.to(at::kFloat).contiguous();
  stats_.prefill_rows = n_unique;
  stats_.prefill_seconds = Since(t);

  std::vector<Completion> completions(batch);
  // A slot holds its prompt and at most its cap of tokens.
  std::vector<int64_t> cap(batch);
  int64_t capacity = 0;
  for (int64_t i = 0; i < batch; ++i) {
    cap[i] = TokenCap(keys[i], params);
    capacity = std::max<int64_t>(capacity, prompts[i].size() + cap[i]);
  }
  auto record = [&](int64_t seq, int64_t token, float logp) {
    Completion& c = completions[seq];
    c.tokens.push_back(static_cast<int>(token));
    c.logp.push_back(logp);
    c.finished = IsStop(static_cast<int>(token));
    return c.finished || static_cast<int64_t>(c.tokens.size()) == cap[seq];
  };
  std::vector<char> done(batch, 0);
  for (int64_t i = 0; i < batch; ++i) {
    done[i] = record(i, first.data_ptr<int64_t>()[i],
                     first_logp.data_ptr<float>()[i]);
    if (done[i] && on_finished) on_finished(i, completions[i]);
  }

  const int64_t slots = max_batch_ > 0 ? std::min(max_batch_, batch) : batch;
  CpuDecoder decoder(model_, slots, capacity);
  if (row_blocks_ > 0) decoder.set_row_blocks(row_blocks_);
  std::vector<int64_t> slot_seq(slots, -1), pending(slots, 0);
  int64_t live = 0, next = 0;
  auto step_u = at::empty({slots}, at::TensorOptions().dtype(at::kFloat));
  while (true) {
    // Admit waiting sequences into free slots (they are the last ones).
    while (live < slots && next < batch) {
      const int64_t seq = next++;
      if (done[seq]) continue;
      const auto& p = *unique[prompt_of[seq]];
      const int64_t len = static_cast<int64_t>(p.size());
      decoder.LoadPrefill(prefill, prompt_of[seq], prompt_len - len, len, live);
      slot_seq[live] = seq;
      pending[live] = completions[seq].tokens.back();
      ++live;
    }
    if (live == 0) break;
    if (step_hook_) step_hook_();
    t = Clock::now();
    const at::Tensor& logits = decoder.Step(pending.data(), live);
    stats_.model_seconds += Since(t);
    ++stats_.decode_steps;
    stats_.rows_computed += live;
    t = Clock::now();
    float* su = step_u.data_ptr<float>();
    for (int64_t s = 0; s < live; ++s) {
      const int64_t seq = slot_seq[s];
      su[s] =
          RowUniform(keys[seq].seed, keys[seq].index,
                     keys[seq].first_token +
                         static_cast<int64_t>(completions[seq].tokens.size()));
    }
    auto [tokens, logp] = SampleNext(logits, step_u.narrow(0, 0, live), params);
    tokens = tokens.contiguous();
    logp = logp.to(at::kFloat).contiguous();
    stats_.sample_seconds += Since(t);
    const int64_t* tok = tokens.data_ptr<int64_t>();
    const float* lp = logp.data_ptr<float>();
    // From the last slot down, so that a finished slot is filled by a slot
    // already handled this step.
    for (int64_t s = live - 1; s >= 0; --s) {
      const int64_t seq = slot_seq[s];
      if (!record(seq, tok[s], lp[s])) {
        pending[s] = tok[s];
        continue;
      }
      done[seq] = 1;
      if (on_finished) on_finished(seq, completions[seq]);
      const int64_t last = live - 1;
      if (s != last) {
        decoder.MoveSlot(last, s);
        slot_seq[s] = slot_seq[last];
        pending[s] = pending[last];
      }
      --live;
    }
  }
  return completions;
}

absl::StatusOr<std::vector<Completion>> RolloutEngine::GenerateComposite(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    const std::vector<SequenceKey>& keys) {
  // kComposite shares prefixes and drops finished rows; kStatic is the
  // reference loop: every row prefilled, every row computed to the end.
  const bool batching = path_ != DecodePath::kStatic;
  std::vector<Completion> completions(prompts.size());
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t prompt_len = 0;
  std::vector<const std::vector<int>*> all;
  for (const auto& p : prompts) {
    all.push_back(&p);
    prompt_len = std::max<int64_t>(prompt_len, p.size());
  }
  // Sequences capped below max_new_tokens (partial rollout) stop there.
  std::vector<int64_t> cap(batch);
  int64_t max_new = 0;
  for (int64_t b = 0; b < batch; ++b) {
    cap[b] = TokenCap(keys[b], params);
    max_new = std::max(max_new, cap[b]);
  }
  const bool capped = std::any_of(cap.begin(), cap.end(),
                                  [&](int64_t c) { return c < max_new; });
  const int64_t total = prompt_len + max_new;
  const auto device = model_.device();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  // Each sequence's cap, by sequence, on the device (rows index it through
  // row_seq_dev).
  const at::Tensor cap_dev =
      capped ? at::tensor(cap, long_opts).to(device) : at::Tensor();
  auto t = Clock::now();
  auto [prompt_tokens, valid] =
      LeftPadded(all, prompt_len, max_new, pad_id_, device);
  auto prompt_valid = valid.narrow(1, 0, prompt_len);
  auto next_pos = prompt_valid.sum(1, /*keepdim=*/true);  // [B, 1]

  KvCache cache = model_.NewCache(batch, total);
  // MoE: the experts each fed token was routed to, by sequence and column
  // ([B, total, n_layers, top_k]; router replay, docs/models.md).
  const ModelConfig& mc = model_.config();
  const bool record = mc.moe_experts > 0;
  at::Tensor routes;
  if (record) {
    model_.set_record_routes(true);
    routes = at::full({batch, total, mc.n_layers, mc.moe_top_k}, -1,
                      long_opts.device(device));
  }
  at::Tensor logits;
  if (batching) {
    // Prefix sharing: each distinct prompt is prefilled once (its own left
    // padding is the batch's: every prompt is padded to prompt_len) and its
    // keys and values copied to every row of it.
    const auto [unique, prompt_of] = FindDistinctPrompts(prompts);
    auto [unique_tokens, unique_valid] =
        LeftPadded(unique, prompt_len, 0, pad_id_, device);
    KvCache prefill =
        model_.NewCache(static_cast<int64_t>(unique.size()), prompt_len);
    if (lockstep_ != nullptr) FUSIONRL_RETURN_IF_ERROR(lockstep_->Announce());
    at::Tensor unique_logits =
        model_
            .ForwardCached(unique_tokens, PositionsFromValid(unique_valid),
                           unique_valid, prefill, /*last_only=*/true)
            .select(1, 0);
    const at::Tensor rows = at::tensor(prompt_of, long_opts).to(device);
    for (size_t l = 0; l < cache.keys.size(); ++l) {
      cache.keys[l]
          .narrow(2, 0, prompt_len)
          .copy_(prefill.keys[l].index_select(0, rows));
      cache.values[l]
          .narrow(2, 0, prompt_len)
          .copy_(prefill.values[l].index_select(0, rows));
    }
    cache.length = prompt_len;
    logits = unique_logits.index_select(0, rows);
    if (record) {
      routes.narrow(1, 0, prompt_len)
          .copy_(model_.last_routes().index_select(0, rows));
    }
    stats_.prefill_rows = static_cast<int64_t>(unique.size());
  } else {
    if (lockstep_ != nullptr) FUSIONRL_RETURN_IF_ERROR(lockstep_->Announce());
    logits = model_
                 .ForwardCached(prompt_tokens, PositionsFromValid(prompt_valid),
                                prompt_valid, cache, /*last_only=*/true)
                 .select(1, 0);
    if (record) routes.narrow(1, 0, prompt_len).copy_(model_.last_routes());
    stats_.prefill_rows = batch;
  }
  stats_.prefill_seconds = Since(t);

  // Outputs by sequence; the batch's rows are the sequences in row_seq.
  auto out_tokens =
      at::full({batch, max_new}, pad_id_, long_opts.device(device));
  auto out_logp = at::zeros(
      {batch, max_new}, at::TensorOptions().dtype(at::kFloat).device(device));
  std::vector<int64_t> row_seq(batch);
  for (int64_t b = 0; b < batch; ++b) row_seq[b] = b;
  at::Tensor row_seq_dev = at::arange(batch, long_opts.device(device));
  int64_t rows = batch;
  auto alive = at::ones({batch}, long_opts.dtype(at::kBool).device(device));
  auto u = at::empty({batch}, at::TensorOptions().dtype(at::kFloat));
  int64_t steps = 0;
  for (int64_t step = 0; step < max_new; ++step) {
    t = Clock::now();
    float* ud = u.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const SequenceKey& key = keys[row_seq[r]];
      ud[r] = RowUniform(key.seed, key.index, key.first_token + step);
    }
    auto [next, token_logp] = SampleNext(logits, u.narrow(0, 0, rows), params);
    next = at::where(alive, next, at::full_like(next, pad_id_));
    out_tokens.select(1, step).index_copy_(0, row_seq_dev, next);
    out_logp.select(1, step).index_copy_(
        0, row_seq_dev,
        at::where(alive, token_logp, at::zeros_like(token_logp))
            .to(at::kFloat));
    valid.select(1, prompt_len + step).copy_(alive);
    for (int id : stop_ids_) alive = alive & (next != id);
    if (capped) {
      alive = alive & (cap_dev.index_select(0, row_seq_dev) > step + 1);
    }
    steps = step + 1;
    const int64_t live = alive.sum().item<int64_t>();
    const bool last = step + 1 == max_new || live == 0;
    stats_.sample_seconds += Since(t);
    if (last) break;
    t = Clock::now();
    // Compaction: the live rows are gathered into a smaller batch (their
    // cache rows, masks and positions) and the finished ones are no longer
    // computed. Each gather copies the live rows' cache once: on a CPU
    // gathering at every finish measured faster than waiting for a quarter
    // of the rows; elsewhere (a GPU, where a decode step's cost depends
    // little on its row count) a quarter bounds the gathers at
    // log_{4/3}(rows) a call (set_compaction_fraction).
    const double fraction = compaction_fraction_ >= 0
                                ? compaction_fraction_
                                : (device.is_cpu() ? 0.0 : 0.25);
    const int64_t compact_at = std::max<int64_t>(
        1,
        static_cast<int64_t>(std::ceil(fraction * static_cast<double>(rows))));
    if (batching && rows - live >= compact_at) {
      const at::Tensor keep = alive.nonzero().squeeze(1);
      // In place: the live rows' filled columns move to the front rows of
      // the same storage (through a gathered copy of those columns only),
      // and the cache becomes a view of its first `live` rows. Nothing of
      // the cache's size is allocated, and unfilled columns are not copied.
      auto gather = [&](at::Tensor& t) {
        t.narrow(0, 0, live)
            .narrow(2, 0, cache.length)
            .copy_(t.narrow(2, 0, cache.length).index_select(0, keep));
        t = t.narrow(0, 0, live);
      };
      for (size_t l = 0; l < cache.keys.size(); ++l) {
        gather(cache.keys[l]);
        gather(cache.values[l]);
      }
      valid = valid.index_select(0, keep);
      next_pos = next_pos.index_select(0, keep);
      next = next.index_select(0, keep);
      row_seq_dev = row_seq_dev.index_select(0, keep);
      const at::Tensor keep_cpu = keep.to(at::kCPU);
      const int64_t* k = keep_cpu.data_ptr<int64_t>();
      for (int64_t r = 0; r < live; ++r) row_seq[r] = row_seq[k[r]];
      rows = live;
      alive = at::ones({rows}, long_opts.dtype(at::kBool).device(device));
    }
    if (lockstep_ != nullptr) FUSIONRL_RETURN_IF_ERROR(lockstep_->Announce());
    logits =
        model_
            .ForwardCached(next.unsqueeze(1), next_pos,
                           valid.narrow(1, 0, prompt_len + step + 1), cache)
            .select(1, 0);
    if (record) {
      routes.select(1, prompt_len + step)
          .index_copy_(0, row_seq_dev, model_.last_routes().select(1, 0));
    }
    next_pos = next_pos + 1;
    stats_.model_seconds += Since(t);
    ++stats_.decode_steps;
    stats_.rows_computed += rows;
  }

  auto tokens_cpu = out_tokens.narrow(1, 0, steps).to(at::kCPU).contiguous();
  auto logp_cpu = out_logp.narrow(1, 0, steps).to(at::kCPU).contiguous();
  auto tok_acc = tokens_cpu.accessor<int64_t, 2>();
  auto logp_acc = logp_cpu.accessor<float, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    Completion& c = completions[b];
    for (int64_t s = 0; s < std::min(steps, cap[b]); ++s) {
      const int tok = static_cast<int>(tok_acc[b][s]);
      c.tokens.push_back(tok);
      c.logp.push_back(logp_acc[b][s]);
      if (IsStop(tok)) {
        c.finished = true;
        break;
      }
    }
  }
  if (record) {
    // Every token the call fed: the prompt's and the response's but the
    // last (never fed).
    const auto host = routes.to(at::kCPU).to(at::kChar).contiguous();
    const int64_t per_token = mc.n_layers * mc.moe_top_k;
    for (int64_t b = 0; b < batch; ++b) {
      Completion& c = completions[b];
      const int64_t p = static_cast<int64_t>(prompts[b].size());
      const int64_t fed = p + static_cast<int64_t>(c.tokens.size()) - 1;
      const int8_t* row = host[b].data_ptr<int8_t>();
      c.routes.assign(row + (prompt_len - p) * per_token,
                      row + (prompt_len - p + fed) * per_token);
    }
  }
  return completions;
}

}  // namespace fusionrl
