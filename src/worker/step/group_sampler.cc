#include "worker/step/group_sampler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/rollout/agent_loop.h"
#include "engine/rollout/job_context.h"
#include "engine/train/memory_accounting.h"
#include "engine/rollout/rollout.h"

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
      engine, {StepGroups{step, groups, std::nullopt}}, rank, version, memory,
      on_offload,
      [&out](int64_t, RolloutBatch batch) { out = std::move(batch); }));
  if (!out.has_value()) {
    return absl::InternalError(
        absl::StrCat("rollout: step ", step, " delivered no batch"));
  }
  return *std::move(out);
}

absl::Status GroupSampler::SampleSteps(
    RolloutEngine& engine, const std::vector<StepGroups>& steps, int rank,
    int64_t version, CardMemoryManager& memory, const OffloadFn& on_offload,
    const DeliverFn& deliver, const SegmentEndFn& segment_end) const {
  if (ctx_.environment != nullptr) {
    return SampleEpisodes(engine, steps, rank, version, memory, on_offload,
                          deliver);
  }
  const auto& rc = config_.rollout;
  const int64_t max_new = rc.max_new_tokens;
  auto t0 = std::chrono::steady_clock::now();
  // One batch per step; sequence i is sample sample_of[i] of step step_of[i].
  std::vector<RolloutBatch> batches(steps.size());
  std::vector<std::vector<int>> prompts;
  std::vector<SequenceKey> keys;
  std::vector<size_t> step_of, sample_of, left(steps.size());
  int64_t largest_step = 0, continued = 0, distinct = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    RolloutBatch& batch = batches[k];
    uint64_t seed =
        MixSeed(MixSeed(config_.seed, kRolloutStream), steps[k].step);
    if (rank > 0) seed = MixSeed(seed, rank);
    // Sample j's key: its next token, and how many it may take in this
    // call (to its segment's end, or to max_new_tokens in all).
    auto key_for = [&](size_t j, int64_t tokens) {
      int64_t end = max_new;
      if (segment_end) end = std::min(end, segment_end(steps[k].step, tokens));
      return SequenceKey{seed, static_cast<int64_t>(j), tokens,
                         std::max<int64_t>(1, end - tokens)};
    };
    auto add = [&](size_t j, std::vector<int> prompt, SequenceKey key) {
      keys.push_back(key);
      prompts.push_back(std::move(prompt));
      step_of.push_back(k);
      sample_of.push_back(j);
    };
    if (steps[k].partial.has_value()) {
      batch = *steps[k].partial;
      if (batch.problems.empty()) {  // restored from a checkpoint's file
        for (uint64_t index : batch.groups) {
          batch.problems.push_back(ctx_.task->TrainProblem(index));
        }
      }
      std::vector<int32_t> todo;
      todo.swap(batch.unfinished);
      for (const int32_t j : todo) {
        const fusionrl::Sample& s = batch.samples[j];
        std::vector<int> prompt = s.prompt_ids;
        prompt.insert(prompt.end(), s.response_ids.begin(),
                      s.response_ids.end());
        add(j, std::move(prompt),
            key_for(j, static_cast<int64_t>(s.response_ids.size())));
      }
      left[k] = todo.size();
      continued += static_cast<int64_t>(todo.size());
      distinct += static_cast<int64_t>(todo.size());
      continue;
    }
    batch.groups = steps[k].groups;
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
        const size_t j = batch.samples.size();
        batch.samples.push_back(std::move(s));
        add(j, ids, key_for(j, 0));
      }
    }
    left[k] = batch.samples.size();
    distinct += static_cast<int64_t>(steps[k].groups.size());
    largest_step = std::max<int64_t>(
        largest_step, static_cast<int64_t>(batch.samples.size()));
  }
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;
  // Several steps at once: the engine decodes one step's worth of sequences
  // at a time (or the configured slots), refilling finished slots; continued
  // responses (few: a step's long tail) get slots of their own.
  const int64_t configured_slots = engine.max_batch();
  const int64_t at_once = largest_step + continued;
  const int64_t slots =
      configured_slots == 0 && static_cast<int64_t>(prompts.size()) > at_once
          ? at_once
          : configured_slots;
  const int64_t decoded_at_once = slots > 0
                                      ? std::min<int64_t>(slots, prompts.size())
                                      : static_cast<int64_t>(prompts.size());
  // The KV cache of the round: granted by the card's memory books, which
  // may first move the optimizer state to host memory.
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
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
  auto hand_over = [&](size_t k) {
    RolloutBatch& batch = batches[k];
    std::sort(batch.unfinished.begin(), batch.unfinished.end());
    batch.Recount();
    const auto now = std::chrono::steady_clock::now();
    batch.round_seconds = std::chrono::duration<double>(now - t0).count();
    batch.seconds += batch.round_seconds;
    t0 = now;
    deliver(steps[k].step, std::move(batch));
  };
  // Scores each finished sequence; hands a step over once all of its
  // sequences are done or stopped at their segment's end.
  auto finished = [&](int64_t i, const Completion& c) {
    const size_t k = step_of[i];
    const size_t j = sample_of[i];
    fusionrl::Sample& s = batches[k].samples[j];
    const size_t before = s.response_ids.size();
    s.response_ids.insert(s.response_ids.end(), c.tokens.begin(),
                          c.tokens.end());
    s.behaviour_logp.insert(s.behaviour_logp.end(), c.logp.begin(),
                            c.logp.end());
    // A continued response's call fed its earlier tokens again: each token
    // keeps the routing of the call that fed it first.
    if (c.routes.size() > s.routes.size()) {
      s.routes.insert(s.routes.end(), c.routes.begin() + s.routes.size(),
                      c.routes.end());
    }
    if (!s.token_versions.empty() || s.behaviour_version != version) {
      if (s.token_versions.empty()) {
        s.token_versions.assign(before, s.behaviour_version);
      }
      s.token_versions.insert(s.token_versions.end(), c.tokens.size(), version);
    }
    s.finished = c.finished;
    if (!c.finished && static_cast<int64_t>(s.response_ids.size()) < max_new) {
      batches[k].unfinished.push_back(static_cast<int32_t>(j));
    } else {
      const Verdict v =
          ScoreCompletion(ctx_, batches[k].problems[j / rc.group_size],
                          s.prompt_ids, s.response_ids);
      s.reward = v.reward;
      s.correct = v.correct;
    }
    if (--left[k] == 0) hand_over(k);
  };
  for (size_t k = 0; k < steps.size(); ++k) {
    if (left[k] == 0) hand_over(k);
  }
  engine.set_max_batch(slots);
  absl::Cleanup restore = [&] {
    engine.set_max_batch(configured_slots);
    memory.Set(MemoryCategory::kKvCache, 0);
  };
  return engine.Generate(prompts, sampling, keys, finished).status();
}

absl::Status GroupSampler::SampleEpisodes(RolloutEngine& engine,
                                          const std::vector<StepGroups>& steps,
                                          int rank, int64_t version,
                                          CardMemoryManager& memory,
                                          const OffloadFn& on_offload,
                                          const DeliverFn& deliver) const {
  const auto& rc = config_.rollout;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RolloutBatch> batches(steps.size());
  std::vector<Problem> problems;
  std::vector<SequenceKey> keys;
  int64_t largest_step = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (steps[k].partial.has_value()) {
      return absl::FailedPreconditionError(
          "rollout: a multi-turn job has no partial rollouts to continue");
    }
    uint64_t seed =
        MixSeed(MixSeed(config_.seed, kRolloutStream), steps[k].step);
    if (rank > 0) seed = MixSeed(seed, rank);
    RolloutBatch& batch = batches[k];
    batch.groups = steps[k].groups;
    for (uint64_t index : steps[k].groups) {
      batch.problems.push_back(ctx_.task->TrainProblem(index));
      for (int i = 0; i < rc.group_size; ++i) {
        fusionrl::Sample s;
        s.group_id = index;
        s.problem_index = index;
        s.behaviour_version = version;
        keys.push_back(SequenceKey{
            seed, static_cast<int64_t>(batch.samples.size()), 0, 0});
        batch.samples.push_back(std::move(s));
        problems.push_back(batch.problems.back());
      }
    }
    largest_step = std::max<int64_t>(largest_step, batch.samples.size());
  }
  const int64_t slots =
      engine.max_batch() > 0 ? engine.max_batch() : largest_step;
  // The episodes' KV caches, max_seq_len entries each: the decode slots
  // and the parked caches of episodes waiting on the environment (fused),
  // or one cache per episode (composite): at most every episode's.
  const int64_t kv_bytes =
      KvCacheBytesFor(config_.model, static_cast<int64_t>(problems.size()),
                      config_.model.max_seq_len);
  const MemoryDecision kv = memory.RequestKvCache(kv_bytes);
  if (!kv.granted()) return absl::ResourceExhaustedError(kv.message);
  if (kv.outcome == MemoryDecision::Outcome::kGrantedAfterOffload) {
    FUSIONRL_RETURN_IF_ERROR(on_offload(kv));
  }
  absl::Cleanup release = [&] { memory.Set(MemoryCategory::kKvCache, 0); };
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;
  FUSIONRL_ASSIGN_OR_RETURN(
      EpisodeBatch episodes,
      AgentLoop(ctx_).Run(engine.model(), problems, keys, sampling, slots,
                          engine.row_blocks(), engine.fused_path(),
                          engine.expert_lockstep()));
  const bool drop = config_.env.on_failure == "drop";
  size_t next = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    RolloutBatch& batch = batches[k];
    for (fusionrl::Sample& s : batch.samples) {
      fusionrl::Sample& e = episodes.samples[next++];
      s.prompt_ids = std::move(e.prompt_ids);
      s.response_ids = std::move(e.response_ids);
      s.behaviour_logp = std::move(e.behaviour_logp);
      s.loss_mask = std::move(e.loss_mask);
      s.routes = std::move(e.routes);
      s.finished = e.finished;
      s.reward = e.reward;
      s.correct = e.correct;
      s.episode = e.episode;
    }
    if (drop) {
      for (size_t g = 0; g < batch.samples.size(); g += rc.group_size) {
        bool failed = false;
        for (int i = 0; i < rc.group_size; ++i) {
          failed |= batch.samples[g + i].episode.env_failed;
        }
        if (!failed) continue;
        for (int i = 0; i < rc.group_size; ++i) {
          batch.samples[g + i].excluded = true;
        }
      }
    }
    batch.Recount();
    batch.round_seconds = k == 0 ? std::chrono::duration<double>(
                                       std::chrono::steady_clock::now() - t0)
                                       .count()
                                 : 0;
    batch.seconds = batch.round_seconds;
    deliver(steps[k].step, std::move(batch));
  }
  return absl::OkStatus();
}

}  // namespace fusionrl
