#include "worker/group_sampler.h"

#include <algorithm>
#include <chrono>
#include <utility>

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
  const auto& rc = config_.rollout;
  const auto t0 = std::chrono::steady_clock::now();
  RolloutBatch batch;
  batch.groups = groups;
  std::vector<std::vector<int>> prompts;
  for (uint64_t index : groups) {
    batch.problems.push_back(ctx_.task->TrainProblem(index));
    FUSIONRL_ASSIGN_OR_RETURN(auto ids,
                              EncodeProblemPrompt(ctx_, batch.problems.back()));
    for (int i = 0; i < rc.group_size; ++i) {
      fusionrl::Sample s;
      s.group_id = index;
      s.problem_index = index;
      s.prompt_ids = ids;
      s.behaviour_version = version;
      batch.samples.push_back(std::move(s));
      prompts.push_back(ids);
    }
  }
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;
  uint64_t seed = MixSeed(MixSeed(config_.seed, kRolloutStream), step);
  if (rank > 0) seed = MixSeed(seed, rank);
  // The KV cache of the round: granted by the card's memory books, which
  // may first move the optimizer state to host memory.
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  // The fused decode path also holds one prefill entry per prompt token of
  // each group (prefix sharing), next to the slots' cache.
  int64_t kv_bytes =
      KvCacheBytesFor(config_.model, static_cast<int64_t>(prompts.size()),
                      static_cast<int64_t>(longest) + rc.max_new_tokens);
  if (engine.fused()) {
    kv_bytes +=
        KvCacheBytesFor(config_.model, static_cast<int64_t>(groups.size()),
                        static_cast<int64_t>(longest));
  }
  const MemoryDecision kv = memory.RequestKvCache(kv_bytes);
  if (!kv.granted()) return absl::ResourceExhaustedError(kv.message);
  if (kv.outcome == MemoryDecision::Outcome::kGrantedAfterOffload) {
    FUSIONRL_RETURN_IF_ERROR(on_offload(kv));
  }
  auto completions = engine.Generate(prompts, sampling, seed);
  memory.Set(MemoryCategory::kKvCache, 0);
  if (!completions.ok()) return completions.status();
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    fusionrl::Sample& s = batch.samples[i];
    s.response_ids = std::move((*completions)[i].tokens);
    s.behaviour_logp = std::move((*completions)[i].logp);
    s.finished = (*completions)[i].finished;
    const Verdict v = ctx_.reward->Score(batch.problems[i / rc.group_size],
                                         DecodeResponse(ctx_, s.response_ids));
    s.reward = v.reward;
    s.correct = v.correct;
  }
  batch.Recount();
  batch.seconds = SecondsSince(t0);
  return batch;
}

}  // namespace fusionrl
