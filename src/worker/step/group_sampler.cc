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
#include "engine/rollout/rollout.h"
#include "engine/train/memory_accounting.h"

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

namespace {

// The job's sampling parameters of a rollout call.
SamplingParams SamplingOf(const RolloutConfig& rc) {
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;
  return sampling;
}

// The sequences of one SampleSteps call without an environment, across its
// steps, and the steps' batches as the engine finishes them: Queue() lays
// them out, the engine's finished sequences are scored into their batches
// (Finished), and each step is handed over once all of its sequences are
// done or stopped at their segment's end.
class StepsRollout {
 public:
  StepsRollout(const JobConfig& config, const JobContext& ctx,
               const std::vector<StepGroups>& steps, int rank, int64_t version,
               const GroupSampler::DeliverFn& deliver,
               const GroupSampler::SegmentEndFn& segment_end)
      : config_(config),
        rc_(config.rollout),
        ctx_(ctx),
        steps_(steps),
        rank_(rank),
        version_(version),
        deliver_(deliver),
        segment_end_(segment_end),
        t0_(std::chrono::steady_clock::now()),
        batches_(steps.size()),
        left_(steps.size()) {}

  // Lays out every step's sequences: a partial step's unfinished
  // responses, or group_size new samples of each of a step's groups.
  absl::Status Queue();
  // Decode slots of the call, given the engine's configured ones. Several
  // steps at once: the engine decodes one step's worth of sequences at a
  // time (or the configured slots), refilling finished slots; continued
  // responses (few: a step's long tail) get slots of their own.
  int64_t Slots(int64_t configured_slots) const;
  // The KV cache bytes the call needs with `slots`.
  int64_t KvCacheBytes(const RolloutEngine& engine, int64_t slots) const;
  // Hands over the steps that have nothing left to sample.
  void HandOverDone();
  absl::Status Generate(RolloutEngine& engine);

 private:
  // Sample j of step k's key: its next token, and how many it may take in
  // this call (to its segment's end, or to max_new_tokens in all).
  SequenceKey KeyFor(size_t k, uint64_t seed, size_t j, int64_t tokens) const;
  void Add(size_t k, size_t j, std::vector<int> prompt, SequenceKey key);
  void QueuePartial(size_t k, uint64_t seed);
  absl::Status QueueGroups(size_t k, uint64_t seed);
  // Takes sequence i's completion into its sample; scores it when done.
  void Finished(int64_t i, const Completion& c);
  void HandOver(size_t k);

  const JobConfig& config_;
  const RolloutConfig& rc_;
  const JobContext& ctx_;
  const std::vector<StepGroups>& steps_;
  const int rank_;
  const int64_t version_;
  const GroupSampler::DeliverFn& deliver_;
  const GroupSampler::SegmentEndFn& segment_end_;
  std::chrono::steady_clock::time_point t0_;  // the last hand-over
  // One batch per step; sequence i is sample sample_of_[i] of step
  // step_of_[i]; left_[k]: step k's sequences not done yet.
  std::vector<RolloutBatch> batches_;
  std::vector<std::vector<int>> prompts_;
  std::vector<SequenceKey> keys_;
  std::vector<size_t> step_of_, sample_of_, left_;
  int64_t largest_step_ = 0, continued_ = 0, distinct_ = 0;
};

absl::Status StepsRollout::Queue() {
  for (size_t k = 0; k < steps_.size(); ++k) {
    uint64_t seed =
        MixSeed(MixSeed(config_.seed, kRolloutStream), steps_[k].step);
    if (rank_ > 0) seed = MixSeed(seed, rank_);
    if (steps_[k].partial.has_value()) {
      QueuePartial(k, seed);
    } else {
      FUSIONRL_RETURN_IF_ERROR(QueueGroups(k, seed));
    }
  }
  return absl::OkStatus();
}

SequenceKey StepsRollout::KeyFor(size_t k, uint64_t seed, size_t j,
                                 int64_t tokens) const {
  int64_t end = rc_.max_new_tokens;
  if (segment_end_) end = std::min(end, segment_end_(steps_[k].step, tokens));
  return SequenceKey{seed, static_cast<int64_t>(j), tokens,
                     std::max<int64_t>(1, end - tokens)};
}

void StepsRollout::Add(size_t k, size_t j, std::vector<int> prompt,
                       SequenceKey key) {
  keys_.push_back(key);
  prompts_.push_back(std::move(prompt));
  step_of_.push_back(k);
  sample_of_.push_back(j);
}

void StepsRollout::QueuePartial(size_t k, uint64_t seed) {
  RolloutBatch& batch = batches_[k];
  batch = *steps_[k].partial;
  if (batch.problems.empty()) {  // restored from a checkpoint's file
    for (uint64_t index : batch.groups) {
      batch.problems.push_back(ctx_.task->TrainProblem(index));
    }
  }
  std::vector<int32_t> todo;
  todo.swap(batch.unfinished);
  for (const int32_t j : todo) {
    const Sample& s = batch.samples[j];
    std::vector<int> prompt = s.prompt_ids;
    prompt.insert(prompt.end(), s.response_ids.begin(), s.response_ids.end());
    Add(k, j, std::move(prompt),
        KeyFor(k, seed, j, static_cast<int64_t>(s.response_ids.size())));
  }
  left_[k] = todo.size();
  continued_ += static_cast<int64_t>(todo.size());
  distinct_ += static_cast<int64_t>(todo.size());
}

absl::Status StepsRollout::QueueGroups(size_t k, uint64_t seed) {
  RolloutBatch& batch = batches_[k];
  batch.groups = steps_[k].groups;
  for (uint64_t index : steps_[k].groups) {
    batch.problems.push_back(ctx_.task->TrainProblem(index));
    FUSIONRL_ASSIGN_OR_RETURN(auto ids,
                              EncodeProblemPrompt(ctx_, batch.problems.back()));
    for (int i = 0; i < rc_.group_size; ++i) {
      Sample s;
      s.group_id = index;
      s.problem_index = index;
      s.prompt_ids = ids;
      s.behaviour_version = version_;
      const size_t j = batch.samples.size();
      batch.samples.push_back(std::move(s));
      Add(k, j, ids, KeyFor(k, seed, j, 0));
    }
  }
  left_[k] = batch.samples.size();
  distinct_ += static_cast<int64_t>(steps_[k].groups.size());
  largest_step_ = std::max<int64_t>(largest_step_,
                                    static_cast<int64_t>(batch.samples.size()));
  return absl::OkStatus();
}

int64_t StepsRollout::Slots(int64_t configured_slots) const {
  const int64_t at_once = largest_step_ + continued_;
  return configured_slots == 0 &&
                 static_cast<int64_t>(prompts_.size()) > at_once
             ? at_once
             : configured_slots;
}

int64_t StepsRollout::KvCacheBytes(const RolloutEngine& engine,
                                   int64_t slots) const {
  const int64_t decoded_at_once =
      slots > 0 ? std::min<int64_t>(slots, prompts_.size())
                : static_cast<int64_t>(prompts_.size());
  size_t longest = 0;
  for (const auto& p : prompts_) longest = std::max(longest, p.size());
  int64_t kv_bytes = KvCacheBytesFor(
      config_.model,
      engine.fused() ? decoded_at_once : static_cast<int64_t>(prompts_.size()),
      static_cast<int64_t>(longest) + rc_.max_new_tokens);
  // With prefix sharing the engine also holds one prefill entry per prompt
  // token of each group, next to the batch's cache.
  if (engine.shares_prefixes()) {
    kv_bytes += KvCacheBytesFor(config_.model, distinct_,
                                static_cast<int64_t>(longest));
  }
  return kv_bytes;
}

void StepsRollout::HandOverDone() {
  for (size_t k = 0; k < steps_.size(); ++k) {
    if (left_[k] == 0) HandOver(k);
  }
}

absl::Status StepsRollout::Generate(RolloutEngine& engine) {
  return engine
      .Generate(prompts_, SamplingOf(rc_), keys_,
                [this](int64_t i, const Completion& c) { Finished(i, c); })
      .status();
}

void StepsRollout::Finished(int64_t i, const Completion& c) {
  const size_t k = step_of_[i];
  const size_t j = sample_of_[i];
  Sample& s = batches_[k].samples[j];
  const size_t before = s.response_ids.size();
  s.response_ids.insert(s.response_ids.end(), c.tokens.begin(), c.tokens.end());
  s.behaviour_logp.insert(s.behaviour_logp.end(), c.logp.begin(), c.logp.end());
  // A continued response's call fed its earlier tokens again: each token
  // keeps the routing of the call that fed it first.
  if (c.routes.size() > s.routes.size()) {
    s.routes.insert(s.routes.end(), c.routes.begin() + s.routes.size(),
                    c.routes.end());
  }
  if (!s.token_versions.empty() || s.behaviour_version != version_) {
    if (s.token_versions.empty()) {
      s.token_versions.assign(before, s.behaviour_version);
    }
    s.token_versions.insert(s.token_versions.end(), c.tokens.size(), version_);
  }
  s.finished = c.finished;
  if (!c.finished &&
      static_cast<int64_t>(s.response_ids.size()) < rc_.max_new_tokens) {
    batches_[k].unfinished.push_back(static_cast<int32_t>(j));
  } else {
    const Verdict v =
        ScoreCompletion(ctx_, batches_[k].problems[j / rc_.group_size],
                        s.prompt_ids, s.response_ids);
    s.reward = v.reward;
    s.correct = v.correct;
  }
  if (--left_[k] == 0) HandOver(k);
}

void StepsRollout::HandOver(size_t k) {
  RolloutBatch& batch = batches_[k];
  std::sort(batch.unfinished.begin(), batch.unfinished.end());
  batch.Recount();
  const auto now = std::chrono::steady_clock::now();
  batch.round_seconds = std::chrono::duration<double>(now - t0_).count();
  batch.seconds += batch.round_seconds;
  t0_ = now;
  deliver_(steps_[k].step, std::move(batch));
}

}  // namespace

absl::Status GroupSampler::SampleSteps(
    RolloutEngine& engine, const std::vector<StepGroups>& steps, int rank,
    int64_t version, CardMemoryManager& memory, const OffloadFn& on_offload,
    const DeliverFn& deliver, const SegmentEndFn& segment_end) const {
  if (ctx_.environment != nullptr) {
    return SampleEpisodes(engine, steps, rank, version, memory, on_offload,
                          deliver);
  }
  StepsRollout rollout(config_, ctx_, steps, rank, version, deliver,
                       segment_end);
  FUSIONRL_RETURN_IF_ERROR(rollout.Queue());
  const int64_t configured_slots = engine.max_batch();
  const int64_t slots = rollout.Slots(configured_slots);
  // The KV cache of the round: granted by the card's memory books, which
  // may first move the optimizer state to host memory.
  const MemoryDecision kv =
      memory.RequestKvCache(rollout.KvCacheBytes(engine, slots));
  if (!kv.granted()) return absl::ResourceExhaustedError(kv.message);
  if (kv.outcome == MemoryDecision::Outcome::kGrantedAfterOffload) {
    FUSIONRL_RETURN_IF_ERROR(on_offload(kv));
  }
  rollout.HandOverDone();
  engine.set_max_batch(slots);
  absl::Cleanup restore = [&] {
    engine.set_max_batch(configured_slots);
    memory.Set(MemoryCategory::kKvCache, 0);
  };
  return rollout.Generate(engine);
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
  FUSIONRL_ASSIGN_OR_RETURN(
      EpisodeBatch episodes,
      AgentLoop(ctx_).Run(engine.model(), problems, keys, SamplingOf(rc), slots,
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
