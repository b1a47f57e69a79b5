// The composite and static decode paths of RolloutEngine (DecodeMode
// kComposite, kStatic): a padded batch through PolicyModel::ForwardCached,
// one token a step, finished rows compacted away (composite only).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/clock.h"
#include "core/status_macros.h"
#include "engine/model/expert_parallel.h"
#include "engine/rollout/rollout.h"
#include "engine/rollout/rollout_batch.h"

namespace fusionrl {

using rollout_internal::FindDistinctPrompts;
using rollout_internal::LeftPadded;
using rollout_internal::TokenCap;

namespace {

// Decode timings read the monotonic time of the process's Clock.
absl::Time MonotonicNow() { return RealClock().MonotonicNow(); }
double Since(absl::Time t0) { return RealClock().SecondsSince(t0); }

std::pair<at::Tensor, at::Tensor> SampleNext(const at::Tensor& logits,
                                             const at::Tensor& u,
                                             const SamplingParams& params) {
  return SampleTokens(logits, u, params);
}

}  // namespace

// The composite decode of one call (GenerateComposite): the batch's rows are
// the live sequences listed in row_seq; outputs are kept by sequence.
struct RolloutEngine::CompositeDecode {
  CompositeDecode(const std::vector<std::vector<int>>& p,
                  const SamplingParams& s, const std::vector<SequenceKey>& k,
                  c10::Device d)
      : prompts(p), params(s), keys(k), device(d) {}
  const std::vector<std::vector<int>>& prompts;
  const SamplingParams& params;
  const std::vector<SequenceKey>& keys;
  const c10::Device device;
  // kComposite shares prefixes and drops finished rows; kStatic is the
  // reference loop: every row prefilled, every row computed to the end.
  bool batching = true;
  int64_t batch = 0, prompt_len = 0, max_new = 0, total = 0;
  // Sequences capped below max_new_tokens (partial rollout) stop there.
  std::vector<int64_t> cap;
  // Each sequence's cap, by sequence, on the device (rows index it through
  // row_seq_dev); defined when some cap is below max_new.
  at::Tensor cap_dev;
  at::Tensor valid;     // [rows, total] bool
  at::Tensor next_pos;  // [rows, 1]
  KvCache cache;
  // MoE: the experts each fed token was routed to, by sequence and column
  // ([B, total, n_layers, top_k]; router replay, docs/models.md).
  bool record = false;
  at::Tensor routes;
  at::Tensor logits;                // the rows' next-token logits
  at::Tensor out_tokens, out_logp;  // [B, max_new] by sequence
  std::vector<int64_t> row_seq;     // the sequence of each row
  at::Tensor row_seq_dev, alive, next, u;
  int64_t rows = 0;
  int64_t steps = 0;  // tokens sampled per row so far
};

absl::StatusOr<std::vector<Completion>> RolloutEngine::GenerateComposite(
    const std::vector<std::vector<int>>& prompts, const SamplingParams& params,
    const std::vector<SequenceKey>& keys) {
  CompositeDecode d(prompts, params, keys, model_.device());
  d.batching = path_ != DecodePath::kStatic;
  d.batch = static_cast<int64_t>(prompts.size());
  for (const auto& p : prompts) {
    d.prompt_len = std::max<int64_t>(d.prompt_len, p.size());
  }
  d.cap.resize(d.batch);
  for (int64_t b = 0; b < d.batch; ++b) {
    d.cap[b] = TokenCap(keys[b], params);
    d.max_new = std::max(d.max_new, d.cap[b]);
  }
  if (std::any_of(d.cap.begin(), d.cap.end(),
                  [&](int64_t c) { return c < d.max_new; })) {
    d.cap_dev =
        at::tensor(d.cap, at::TensorOptions().dtype(at::kLong)).to(d.device);
  }
  d.total = d.prompt_len + d.max_new;
  auto t = MonotonicNow();
  FUSIONRL_RETURN_IF_ERROR(PrefillComposite(d));
  stats_.prefill_seconds = Since(t);
  StartCompositeRows(d);
  for (int64_t step = 0; step < d.max_new; ++step) {
    t = MonotonicNow();
    const int64_t live = SampleCompositeStep(d, step);
    const bool last = step + 1 == d.max_new || live == 0;
    stats_.sample_seconds += Since(t);
    if (last) break;
    t = MonotonicNow();
    if (d.batching && d.rows - live >= CompactAt(d)) CompactRows(d, live);
    FUSIONRL_RETURN_IF_ERROR(DecodeCompositeStep(d, step));
    stats_.model_seconds += Since(t);
    ++stats_.decode_steps;
    stats_.rows_computed += d.rows;
  }
  return CompositeCompletions(d);
}

absl::Status RolloutEngine::PrefillComposite(CompositeDecode& d) {
  std::vector<const std::vector<int>*> all;
  for (const auto& p : d.prompts) all.push_back(&p);
  auto [prompt_tokens, valid] =
      LeftPadded(all, d.prompt_len, d.max_new, pad_id_, d.device);
  d.valid = valid;
  auto prompt_valid = d.valid.narrow(1, 0, d.prompt_len);
  d.next_pos = prompt_valid.sum(1, /*keepdim=*/true);  // [B, 1]
  d.cache = model_.NewCache(d.batch, d.total);
  const ModelConfig& mc = model_.config();
  d.record = mc.moe_experts > 0;
  if (d.record) {
    model_.set_record_routes(true);
    d.routes = at::full({d.batch, d.total, mc.n_layers, mc.moe_top_k}, -1,
                        at::TensorOptions().dtype(at::kLong).device(d.device));
  }
  if (d.batching) return PrefillSharedPrompts(d);
  if (lockstep_ != nullptr) FUSIONRL_RETURN_IF_ERROR(lockstep_->Announce());
  d.logits = model_
                 .ForwardCached(prompt_tokens, PositionsFromValid(prompt_valid),
                                prompt_valid, d.cache, /*last_only=*/true)
                 .select(1, 0);
  if (d.record) d.routes.narrow(1, 0, d.prompt_len).copy_(model_.last_routes());
  stats_.prefill_rows = d.batch;
  return absl::OkStatus();
}

// Prefix sharing: each distinct prompt is prefilled once (its own left
// padding is the batch's: every prompt is padded to prompt_len) and its
// keys and values copied to every row of it.
absl::Status RolloutEngine::PrefillSharedPrompts(CompositeDecode& d) {
  const auto [unique, prompt_of] = FindDistinctPrompts(d.prompts);
  auto [unique_tokens, unique_valid] =
      LeftPadded(unique, d.prompt_len, 0, pad_id_, d.device);
  KvCache prefill =
      model_.NewCache(static_cast<int64_t>(unique.size()), d.prompt_len);
  if (lockstep_ != nullptr) FUSIONRL_RETURN_IF_ERROR(lockstep_->Announce());
  at::Tensor unique_logits =
      model_
          .ForwardCached(unique_tokens, PositionsFromValid(unique_valid),
                         unique_valid, prefill, /*last_only=*/true)
          .select(1, 0);
  const at::Tensor rows =
      at::tensor(prompt_of, at::TensorOptions().dtype(at::kLong)).to(d.device);
  for (size_t l = 0; l < d.cache.keys.size(); ++l) {
    d.cache.keys[l]
        .narrow(2, 0, d.prompt_len)
        .copy_(prefill.keys[l].index_select(0, rows));
    d.cache.values[l]
        .narrow(2, 0, d.prompt_len)
        .copy_(prefill.values[l].index_select(0, rows));
  }
  d.cache.length = d.prompt_len;
  d.logits = unique_logits.index_select(0, rows);
  if (d.record) {
    d.routes.narrow(1, 0, d.prompt_len)
        .copy_(model_.last_routes().index_select(0, rows));
  }
  stats_.prefill_rows = static_cast<int64_t>(unique.size());
  return absl::OkStatus();
}

void RolloutEngine::StartCompositeRows(CompositeDecode& d) const {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  d.out_tokens =
      at::full({d.batch, d.max_new}, pad_id_, long_opts.device(d.device));
  d.out_logp =
      at::zeros({d.batch, d.max_new},
                at::TensorOptions().dtype(at::kFloat).device(d.device));
  d.row_seq.resize(d.batch);
  for (int64_t b = 0; b < d.batch; ++b) d.row_seq[b] = b;
  d.row_seq_dev = at::arange(d.batch, long_opts.device(d.device));
  d.rows = d.batch;
  d.alive = at::ones({d.batch}, long_opts.dtype(at::kBool).device(d.device));
  d.u = at::empty({d.batch}, at::TensorOptions().dtype(at::kFloat));
}

// Samples token `step` of every row (pad for finished rows) into the
// outputs; returns how many rows are still live.
int64_t RolloutEngine::SampleCompositeStep(CompositeDecode& d,
                                           int64_t step) const {
  float* ud = d.u.data_ptr<float>();
  for (int64_t r = 0; r < d.rows; ++r) {
    const SequenceKey& key = d.keys[d.row_seq[r]];
    ud[r] = RowUniform(key.seed, key.index, key.first_token + step);
  }
  auto [next, token_logp] =
      SampleNext(d.logits, d.u.narrow(0, 0, d.rows), d.params);
  next = at::where(d.alive, next, at::full_like(next, pad_id_));
  d.out_tokens.select(1, step).index_copy_(0, d.row_seq_dev, next);
  d.out_logp.select(1, step).index_copy_(
      0, d.row_seq_dev,
      at::where(d.alive, token_logp, at::zeros_like(token_logp))
          .to(at::kFloat));
  d.valid.select(1, d.prompt_len + step).copy_(d.alive);
  for (int id : stop_ids_) d.alive = d.alive & (next != id);
  if (d.cap_dev.defined()) {
    d.alive = d.alive & (d.cap_dev.index_select(0, d.row_seq_dev) > step + 1);
  }
  d.next = next;
  d.steps = step + 1;
  return d.alive.sum().item<int64_t>();
}

// Compaction: the live rows are gathered into a smaller batch (their
// cache rows, masks and positions) and the finished ones are no longer
// computed. Each gather copies the live rows' cache once: on a CPU
// gathering at every finish measured faster than waiting for a quarter
// of the rows; elsewhere (a GPU, where a decode step's cost depends
// little on its row count) a quarter bounds the gathers at
// log_{4/3}(rows) a call (set_compaction_fraction). The finished rows that
// trigger a compaction:
int64_t RolloutEngine::CompactAt(const CompositeDecode& d) const {
  const double fraction = compaction_fraction_ >= 0
                              ? compaction_fraction_
                              : (d.device.is_cpu() ? 0.0 : 0.25);
  return std::max<int64_t>(
      1,
      static_cast<int64_t>(std::ceil(fraction * static_cast<double>(d.rows))));
}

void RolloutEngine::CompactRows(CompositeDecode& d, int64_t live) const {
  const at::Tensor keep = d.alive.nonzero().squeeze(1);
  // In place: the live rows' filled columns move to the front rows of
  // the same storage (through a gathered copy of those columns only),
  // and the cache becomes a view of its first `live` rows. Nothing of
  // the cache's size is allocated, and unfilled columns are not copied.
  auto gather = [&](at::Tensor& t) {
    t.narrow(0, 0, live)
        .narrow(2, 0, d.cache.length)
        .copy_(t.narrow(2, 0, d.cache.length).index_select(0, keep));
    t = t.narrow(0, 0, live);
  };
  for (size_t l = 0; l < d.cache.keys.size(); ++l) {
    gather(d.cache.keys[l]);
    gather(d.cache.values[l]);
  }
  d.valid = d.valid.index_select(0, keep);
  d.next_pos = d.next_pos.index_select(0, keep);
  d.next = d.next.index_select(0, keep);
  d.row_seq_dev = d.row_seq_dev.index_select(0, keep);
  const at::Tensor keep_cpu = keep.to(at::kCPU);
  const int64_t* k = keep_cpu.data_ptr<int64_t>();
  for (int64_t r = 0; r < live; ++r) d.row_seq[r] = d.row_seq[k[r]];
  d.rows = live;
  d.alive =
      at::ones({d.rows}, at::TensorOptions().dtype(at::kBool).device(d.device));
}

// Feeds the tokens of `step` to the rows: the next step's logits.
absl::Status RolloutEngine::DecodeCompositeStep(CompositeDecode& d,
                                                int64_t step) {
  if (lockstep_ != nullptr) FUSIONRL_RETURN_IF_ERROR(lockstep_->Announce());
  d.logits =
      model_
          .ForwardCached(d.next.unsqueeze(1), d.next_pos,
                         d.valid.narrow(1, 0, d.prompt_len + step + 1), d.cache)
          .select(1, 0);
  if (d.record) {
    d.routes.select(1, d.prompt_len + step)
        .index_copy_(0, d.row_seq_dev, model_.last_routes().select(1, 0));
  }
  d.next_pos = d.next_pos + 1;
  return absl::OkStatus();
}

std::vector<Completion> RolloutEngine::CompositeCompletions(
    const CompositeDecode& d) const {
  std::vector<Completion> completions(d.batch);
  auto tokens_cpu =
      d.out_tokens.narrow(1, 0, d.steps).to(at::kCPU).contiguous();
  auto logp_cpu = d.out_logp.narrow(1, 0, d.steps).to(at::kCPU).contiguous();
  auto tok_acc = tokens_cpu.accessor<int64_t, 2>();
  auto logp_acc = logp_cpu.accessor<float, 2>();
  for (int64_t b = 0; b < d.batch; ++b) {
    Completion& c = completions[b];
    for (int64_t s = 0; s < std::min(d.steps, d.cap[b]); ++s) {
      const int tok = static_cast<int>(tok_acc[b][s]);
      c.tokens.push_back(tok);
      c.logp.push_back(logp_acc[b][s]);
      if (IsStop(tok)) {
        c.finished = true;
        break;
      }
    }
  }
  if (!d.record) return completions;
  // Every token the call fed: the prompt's and the response's but the
  // last (never fed).
  const ModelConfig& mc = model_.config();
  const auto host = d.routes.to(at::kCPU).to(at::kChar).contiguous();
  const int64_t per_token = mc.n_layers * mc.moe_top_k;
  for (int64_t b = 0; b < d.batch; ++b) {
    Completion& c = completions[b];
    const int64_t p = static_cast<int64_t>(d.prompts[b].size());
    const int64_t fed = p + static_cast<int64_t>(c.tokens.size()) - 1;
    const int8_t* row = host[b].data_ptr<int8_t>();
    c.routes.assign(row + (d.prompt_len - p) * per_token,
                    row + (d.prompt_len - p + fed) * per_token);
  }
  return completions;
}

}  // namespace fusionrl
