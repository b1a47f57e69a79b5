#include "worker/group_sampler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/job_common.h"
#include "engine/memory_accounting.h"
#include "engine/rollout.h"

namespace fusionrl {
namespace {
constexpr uint64_t kRolloutStream = 0x726f6c6c;  // "roll"
}  // namespace

void RolloutBatch::Recount() {
  tokens = correct = finished = 0;
  reward_sum = 0;
  for (const Sample& s : samples) {
    tokens += static_cast<int64_t>(s.response_ids.size());
    correct += s.correct;
    finished += s.finished;
    reward_sum += s.reward;
  }
}

absl::StatusOr<RolloutBatch> GroupSampler::Sample(
    RolloutEngine& engine, const std::vector<uint64_t>& groups, int64_t step,
    int rank, int64_t version, CardMemoryManager& memory,
    const OffloadFn& on_offload) const {
  std::optional<RolloutBatch> out;
  FUSIONRL_RETURN_IF_ERROR(SampleSteps(
      engine, {StepGroups{step, groups}}, rank, version, memory, on_offload,
      [&out](int64_t, RolloutBatch batch) { out = std::move(batch); }));
  if (!out.has_value()) {
    return absl::InternalError(
        absl::StrCat("rollout: step ", step, " delivered no batch"));
  }
  return *std::move(out);
}

absl::Status GroupSampler::SampleSteps(RolloutEngine& engine,
                                       const std::vector<StepGroups>& steps,
                                       int rank, int64_t version,
                                       CardMemoryManager& memory,
                                       const OffloadFn& on_offload,
                                       const DeliverFn& deliver) const {
  const auto& rc = config_.rollout;
  auto t0 = std::chrono::steady_clock::now();
  // One batch per step; sequence j of step k is prompts[first[k] + j].
  std::vector<RolloutBatch> batches(steps.size());
  std::vector<std::vector<int>> prompts;
  std::vector<SequenceKey> keys;
  std::vector<size_t> step_of, first;
  int64_t largest_step = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    RolloutBatch& batch = batches[k];
    batch.groups = steps[k].groups;
    first.push_back(prompts.size());
    uint64_t seed =
        MixSeed(MixSeed(config_.seed, kRolloutStream), steps[k].step);
    if (rank > 0) seed = MixSeed(seed, rank);
    for (uint64_t index : steps[k].groups) {
      batch.problems.push_back(ctx_.task->TrainProblem(index));
      FUSIONRL_ASSIGN_OR_RETURN(
          auto ids, EncodeProblemPrompt(ctx_, batch.problems.back()));
      for (int i = 0; i < rc.group_size; ++i) {
        fusionrl::Sample s;
        s.group_id = index;
        s.problem_index = index;
        s.prompt_ids = ids;
        s.behaviour_version = version;
        batch.samples.push_back(std::move(s));
        keys.push_back({seed, static_cast<int64_t>(prompts.size() - first[k])});
        prompts.push_back(ids);
        step_of.push_back(k);
      }
    }
    largest_step = std::max<int64_t>(
        largest_step, static_cast<int64_t>(batch.samples.size()));
  }
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;
  // Several steps at once: the engine decodes one step's worth of sequences
  // at a time (or the configured slots), refilling finished slots.
  const int64_t configured_slots = engine.max_batch();
  const int64_t slots = steps.size() > 1 && configured_slots == 0
                            ? largest_step
                            : configured_slots;
  const int64_t decoded_at_once = slots > 0
                                      ? std::min<int64_t>(slots, prompts.size())
                                      : static_cast<int64_t>(prompts.size());
  // The KV cache of the round: granted by the card's memory books, which
  // may first move the optimizer state to host memory.
  size_t longest = 0;
  int64_t distinct = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  for (const StepGroups& s : steps) {
    distinct += static_cast<int64_t>(s.groups.size());
  }
  int64_t kv_bytes = KvCacheBytesFor(
      config_.model,
      engine.fused() ? decoded_at_once : static_cast<int64_t>(prompts.size()),
      static_cast<int64_t>(longest) + rc.max_new_tokens);
  // With prefix sharing the engine also holds one prefill entry per prompt
  // token of each group, next to the batch's cache.
  if (engine.shares_prefixes()) {
    kv_bytes +=
        KvCacheBytesFor(config_.model, distinct, static_cast<int64_t>(longest));
  }
  const MemoryDecision kv = memory.RequestKvCache(kv_bytes);
  if (!kv.granted()) return absl::ResourceExhaustedError(kv.message);
  if (kv.outcome == MemoryDecision::Outcome::kGrantedAfterOffload) {
    FUSIONRL_RETURN_IF_ERROR(on_offload(kv));
  }
  // Scores each finished sequence; hands a step over once all of its are.
  std::vector<size_t> left(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    left[k] = batches[k].samples.size();
  }
  auto finished = [&](int64_t i, const Completion& c) {
    const size_t k = step_of[i];
    const size_t j = static_cast<size_t>(i) - first[k];
    fusionrl::Sample& s = batches[k].samples[j];
    s.response_ids = c.tokens;
    s.behaviour_logp = c.logp;
    s.finished = c.finished;
    const Verdict v = ctx_.reward->Score(batches[k].problems[j / rc.group_size],
                                         DecodeResponse(ctx_, s.response_ids));
    s.reward = v.reward;
    s.correct = v.correct;
    if (--left[k] > 0) return;
    batches[k].Recount();
    const auto now = std::chrono::steady_clock::now();
    batches[k].seconds = std::chrono::duration<double>(now - t0).count();
    t0 = now;
    deliver(steps[k].step, std::move(batches[k]));
  };
  for (size_t k = 0; k < steps.size(); ++k) {
    if (left[k] == 0) deliver(steps[k].step, std::move(batches[k]));
  }
  engine.set_max_batch(slots);
  absl::Cleanup restore = [&] {
    engine.set_max_batch(configured_slots);
    memory.Set(MemoryCategory::kKvCache, 0);
  };
  return engine.Generate(prompts, sampling, keys, finished).status();
}

}  // namespace fusionrl
