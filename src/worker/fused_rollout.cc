#include "worker/fused_rollout.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/stalesync.h"
#include "engine/kernels/intra_op_threads.h"
#include "engine/model/model.h"
#include "engine/rollout/job_context.h"
#include "engine/rollout/rollout.h"

namespace fusionrl {
namespace {

// Just in time: how much longer than predicted a step's rollout may take
// and still be ready, and the weight of the newest measurement.
constexpr double kJitMargin = 1.2;
constexpr double kJitAverageWeight = 0.3;

void Average(double& average, double seconds) {
  average = average <= 0 ? seconds
                         : (1 - kJitAverageWeight) * average +
                               kJitAverageWeight * seconds;
}

}  // namespace

FusedRollout::FusedRollout(std::unique_ptr<PolicyModel> snapshot,
                           std::unique_ptr<RolloutEngine> engine,
                           Options options, SampleFn sample,
                           std::function<void(double)> on_sampled,
                           const Clock& clock)
    : options_(options),
      sample_(std::move(sample)),
      on_sampled_(std::move(on_sampled)),
      clock_(clock),
      snapshot_(std::move(snapshot)),
      engine_(std::move(engine)) {
  absl::MutexLock lock(&mu_);
  snapshot_version_ = options_.snapshot_version;
  rule_.max_policy_lag = options_.max_policy_lag;
  rule_.steps_per_version = options_.steps_per_version;
}

FusedRollout::~FusedRollout() { Stop(); }

void FusedRollout::Publish(const std::vector<at::Tensor>& weights,
                           int64_t version) {
  std::vector<at::Tensor> copy;
  copy.reserve(weights.size());
  for (const at::Tensor& p : weights) copy.push_back(p.detach().clone());
  absl::MutexLock lock(&mu_);
  if (taken_at_ != absl::InfinitePast()) {
    Average(train_step_seconds_,
            absl::ToDoubleSeconds(clock_.MonotonicNow() - taken_at_));
    taken_at_ = absl::InfinitePast();
  }
  if (version <= published_version_) {
    // A roll-back published an older state again: the versions after it,
    // and a snapshot taken from them, belong to the abandoned timeline.
    published_.clear();
    snapshot_version_ = -1;
  }
  if (!options_.lagged) published_.clear();
  published_[version] = std::move(copy);
  published_version_ = version;
  PruneLocked();
  changed_.SignalAll();
  if (synchronous_on_caller()) return;  // Take() samples
  if (!thread_.joinable() && !stop_) {
    thread_ = std::thread([this] { Loop(); });
  }
}

void FusedRollout::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    ++generation_;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

int64_t FusedRollout::waiting_for_step() const {
  absl::MutexLock lock(&mu_);
  return waiting_for_step_;
}

int64_t FusedRollout::AdmitLagLocked() const {
  const int64_t s = options_.max_policy_lag;
  if (!options_.just_in_time || s <= 1 || rollout_step_seconds_ <= 0 ||
      train_step_seconds_ <= 0) {
    return s;
  }
  const double steps =
      std::ceil(kJitMargin * rollout_step_seconds_ / train_step_seconds_);
  return std::clamp<int64_t>(static_cast<int64_t>(steps), 1, s);
}

bool FusedRollout::AdmittedLocked(int64_t step) const {
  return rule_.Admits(step, published_version_, AdmitLagLocked());
}

int64_t FusedRollout::SampleVersionLocked(int64_t step) const {
  if (!options_.lagged) return published_version_;
  return rule_.LaggedSampleVersion(step);
}

int64_t FusedRollout::SegmentEnd(const Round& round, int64_t step,
                                 int64_t tokens) const {
  const int64_t n = options_.partial_rollout_tokens;
  if (n <= 0) return std::numeric_limits<int64_t>::max();
  // Segments start at multiples of n; from (s - 1) n on, the last one.
  const int64_t last = std::max<int64_t>(0, options_.max_policy_lag - 1) * n;
  for (int64_t end = (tokens / n + 1) * n; end <= last; end += n) {
    if (round.rule.TokenVersion(step, end, n) != round.version) {
      return end;
    }
  }
  return std::numeric_limits<int64_t>::max();
}

int64_t FusedRollout::CarriedVersionLocked(int64_t step,
                                           const RolloutBatch& batch) const {
  const int64_t tokens = static_cast<int64_t>(
      batch.samples[batch.unfinished.front()].response_ids.size());
  return rule_.TokenVersion(step, tokens, options_.partial_rollout_tokens);
}

void FusedRollout::PruneLocked() {
  if (!options_.lagged || published_.empty()) return;
  // Coming rounds sample from versions >= that of the next step (or, with
  // no frame, from the newest: a reset starts the frame there), and carried
  // responses continue from theirs.
  int64_t keep =
      base_groups_.empty()
          ? published_version_
          : std::min(published_version_, SampleVersionLocked(next_step_));
  for (const auto& [step, batch] : carried_) {
    keep = std::min(keep, CarriedVersionLocked(step, batch));
  }
  published_.erase(published_.begin(), published_.lower_bound(keep));
}

void FusedRollout::ResetLocked(int64_t base_step) {
  next_step_ = base_step;
  ready_.clear();
  carried_.clear();
  entered_.clear();
  ++generation_;
  // The i-th step from here may start once the published version is
  // >= v0 + i - s, v0 the trainer's current version.
  rule_.frame_version = std::max<int64_t>(0, published_version_);
  PruneLocked();
  changed_.SignalAll();
}

void FusedRollout::Reset() {
  absl::MutexLock lock(&mu_);
  base_groups_.clear();
  ready_.clear();
  carried_.clear();
  entered_.clear();
  ++generation_;
  changed_.SignalAll();
}

void FusedRollout::Restore(RolloutPrefetch saved) {
  absl::MutexLock lock(&mu_);
  base_groups_ = std::move(saved.base_groups);
  rule_.base_step = saved.base_step;
  rule_.frame_version = saved.frame_version;
  rank_ = saved.rank;
  ready_.clear();
  carried_.clear();
  entered_.clear();
  next_step_ = saved.batches.empty() ? saved.checkpoint_step + 1
                                     : saved.batches.rbegin()->first + 1;
  for (auto& [step, batch] : saved.batches) {
    (batch.unfinished.empty() ? ready_ : carried_)[step] = std::move(batch);
  }
  ++generation_;
  PruneLocked();
  changed_.SignalAll();
}

absl::StatusOr<std::optional<RolloutPrefetch>> FusedRollout::Pending(
    int64_t step, int64_t version) {
  absl::MutexLock lock(&mu_);
  if (!options_.lagged || base_groups_.empty()) return std::nullopt;
  RolloutPrefetch out;
  out.max_policy_lag = options_.max_policy_lag;
  out.prompts_per_step = options_.prompts_per_step;
  out.rank = rank_;
  out.base_step = rule_.base_step;
  out.base_groups = base_groups_;
  out.frame_version = rule_.frame_version;
  const uint64_t generation = generation_;
  const absl::Time deadline = clock_.Now() + options_.timeout;
  // A batch whose responses continue from versions >= `version` is taken
  // as it stands (a resume has those versions), as it was before the first
  // round of such a version if one took it already (the end checkpoint is
  // saved after `version` was published); one that continues from an
  // older version must finish first.
  auto saved = [&](int64_t t) -> const RolloutBatch* {
    if (auto e = entered_.find(t); e != entered_.end()) {
      if (auto w = e->second.lower_bound(version); w != e->second.end()) {
        return &w->second;
      }
    }
    if (auto it = ready_.find(t); it != ready_.end()) return &it->second;
    auto it = carried_.find(t);
    if (it != carried_.end() &&
        CarriedVersionLocked(t, it->second) >= version) {
      return &it->second;
    }
    return nullptr;
  };
  out.partial_rollout_tokens =
      static_cast<int>(options_.partial_rollout_tokens);
  out.steps_per_version = options_.steps_per_version;
  for (int64_t t = step + 1; SampleVersionLocked(t) < version; ++t) {
    while (saved(t) == nullptr && error_.ok() && generation == generation_ &&
           !WaitOnClock(changed_, mu_, clock_, deadline)) {
    }
    if (!error_.ok()) return error_;
    if (generation != generation_) return std::nullopt;  // reset meanwhile
    const RolloutBatch* batch = saved(t);
    if (batch == nullptr) {
      return absl::DeadlineExceededError(absl::StrCat(
          "fused rollout: the batch of step ", t,
          " (sampled ahead for the checkpoint of step ", step,
          ") not ready within ", absl::FormatDuration(options_.timeout),
          " (run.collective_timeout_seconds)"));
    }
    out.batches.emplace(t, *batch);
  }
  return std::optional<RolloutPrefetch>(std::move(out));
}

std::optional<FusedRollout::Round> FusedRollout::NextRound(bool wait) {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (base_groups_.empty() || !AdmittedLocked(next_step_) ||
        published_version_ < SampleVersionLocked(next_step_)) {
      if (!wait) return std::nullopt;
      const auto w0 = std::chrono::steady_clock::now();
      waiting_for_step_ = base_groups_.empty() ? -1 : next_step_;
      changed_.Wait(&mu_);
      waiting_for_step_ = -1;
      if (!base_groups_.empty()) gate_wait_seconds_ += SecondsSince(w0);
      continue;
    }
    const int64_t want = SampleVersionLocked(next_step_);
    if (snapshot_version_ != want &&
        next_step_ >= options_.freeze_snapshot_before_step) {
      auto weights = published_.find(want);
      if (weights == published_.end()) {
        error_ = absl::InternalError(absl::StrCat(
            "fused rollout: step ", next_step_, " samples from version ", want,
            ", which is no longer kept (kept from ",
            published_.empty() ? -1 : published_.begin()->first, ")"));
        changed_.SignalAll();
        return std::nullopt;
      }
      // The trainable tensors (with LoRA the adapters, which a float32
      // snapshot merges here into its weights).
      snapshot_->LoadTrainable(weights->second);
      snapshot_version_ = want;
      snapshot_updates_.fetch_add(1);
    }
    Round round;
    round.generation = generation_;
    round.rank = rank_;
    round.version = snapshot_version_;
    round.rule = rule_;
    round.lag = AdmitLagLocked();
    // Carried responses that continue from this version come first: they
    // take the engine's slots before the new steps' responses.
    for (auto it = carried_.begin(); it != carried_.end();) {
      const int64_t v = CarriedVersionLocked(it->first, it->second);
      if (v < round.version) {
        error_ = absl::InternalError(
            absl::StrCat("fused rollout: step ", it->first,
                         "'s unfinished responses ", "continue from version ",
                         v, ", older than the round's (", round.version, ")"));
        changed_.SignalAll();
        return std::nullopt;
      }
      if (v > round.version) {
        ++it;
        continue;
      }
      entered_[it->first][round.version] = it->second;
      StepGroups carried{it->first, {}, std::move(it->second)};
      carried.groups = carried.partial->groups;
      round.steps.push_back(std::move(carried));
      it = carried_.erase(it);
    }
    const size_t first_new = round.steps.size();
    // The steps after it join the round while they are admitted and
    // sample from the snapshot's version.
    for (int64_t step = next_step_;
         static_cast<int>(round.steps.size() - first_new) <
         std::max(1, options_.max_steps_per_round);
         ++step) {
      if (step > next_step_ &&
          (!AdmittedLocked(step) ||
           SampleVersionLocked(step) != snapshot_version_ ||
           ready_.count(step) > 0)) {
        break;
      }
      StepGroups s{step, base_groups_, std::nullopt};
      for (uint64_t& g : s.groups) {
        g += static_cast<uint64_t>(step - rule_.base_step) *
             options_.prompts_per_step;
      }
      round.steps.push_back(std::move(s));
    }
    sampling_ = true;
    return round;
  }
  return std::nullopt;
}

void FusedRollout::Deliver(const Round& round, int64_t step, RolloutBatch batch,
                           bool last) {
  absl::MutexLock lock(&mu_);
  // The round's last batch ends the sampling: a trainer woken by it must
  // see the thread idle (it takes the card's threads then), not wait for
  // EndRound.
  if (last) sampling_ = false;
  if (round.generation != generation_) return;  // reset meanwhile: drop
  batch.gate_wait_seconds += gate_wait_seconds_;
  gate_wait_seconds_ = 0;
  if (batch.admission_lag < 0) batch.admission_lag = round.lag;
  (batch.unfinished.empty() ? ready_ : carried_)[step] = std::move(batch);
  changed_.SignalAll();
}

bool FusedRollout::EndRound(const Round& round, absl::Status status,
                            size_t delivered) {
  absl::MutexLock lock(&mu_);
  sampling_ = false;
  if (round.generation != generation_) return true;  // reset meanwhile
  if (status.ok() && delivered != round.steps.size()) {
    status = absl::InternalError(absl::StrCat(
        "fused rollout: a round of steps ", round.steps.front().step, "..",
        round.steps.back().step, " delivered ", delivered, " batches"));
  }
  if (!status.ok()) {
    error_ = std::move(status);
    changed_.SignalAll();
    return false;
  }
  next_step_ = round.steps.back().step + 1;
  PruneLocked();
  changed_.SignalAll();
  return true;
}

bool FusedRollout::RunRound(const Round& round) {
  const absl::Time started = clock_.MonotonicNow();
  size_t delivered = 0;
  absl::Status status;
  auto sample = [&] {
    try {
      GroupSampler::SegmentEndFn segment_end;
      if (options_.partial_rollout_tokens > 0) {
        segment_end = [this, &round](int64_t step, int64_t tokens) {
          return SegmentEnd(round, step, tokens);
        };
      }
      status = sample_(
          *engine_, round.steps, round.rank, round.version,
          [&](int64_t step, RolloutBatch batch) {
            if (on_sampled_) on_sampled_(batch.round_seconds);
            ++delivered;
            Deliver(round, step, std::move(batch),
                    delivered == round.steps.size());
          },
          segment_end);
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("rollout thread: ", e.what()));
    }
  };
  if (options_.round_on_own_thread && !synchronous_on_caller()) {
    std::thread worker([&] {
      SetIntraOpThreads(options_.rollout_threads);
      sample();
    });
    worker.join();
  } else {
    sample();
  }
  if (options_.just_in_time && delivered > 0) {
    absl::MutexLock lock(&mu_);
    Average(rollout_step_seconds_,
            absl::ToDoubleSeconds(clock_.MonotonicNow() - started) /
                static_cast<double>(delivered));
  }
  return EndRound(round, std::move(status), delivered);
}

void FusedRollout::Loop() {
  SetIntraOpThreads(options_.rollout_threads);
  // Sampling runs without the lock: the snapshot and the engine are the
  // thread's own while it samples (NextRound updates them under the lock).
  while (std::optional<Round> round = NextRound()) {
    if (!RunRound(*round)) return;
  }
}

absl::StatusOr<RolloutBatch> FusedRollout::Take(const StepPlan& plan) {
  const uint64_t per_step = options_.prompts_per_step;
  absl::MutexLock lock(&mu_);
  bool predicted = !base_groups_.empty() && rank_ == plan.rank &&
                   plan.step >= rule_.base_step &&
                   plan.groups.size() == base_groups_.size();
  for (size_t i = 0; predicted && i < plan.groups.size(); ++i) {
    predicted =
        plan.groups[i] ==
        base_groups_[i] +
            static_cast<uint64_t>(plan.step - rule_.base_step) * per_step;
  }
  if (!predicted) {
    // First step, or the controller replanned: sample what the plan says.
    base_groups_ = plan.groups;
    rule_.base_step = plan.step;
    rank_ = plan.rank;
    ResetLocked(plan.step);
  }
  // Steps before this one will not be trained any more.
  ready_.erase(ready_.begin(), ready_.lower_bound(plan.step));
  carried_.erase(carried_.begin(), carried_.lower_bound(plan.step));
  entered_.erase(entered_.begin(), entered_.lower_bound(plan.step));
  if (synchronous_on_caller()) {
    // The step is admitted (the trainer published the weights it samples
    // from before asking): sample it here.
    while (ready_.count(plan.step) == 0 && error_.ok()) {
      mu_.Unlock();
      std::optional<Round> round = NextRound(/*wait=*/false);
      if (round) RunRound(*round);
      mu_.Lock();
      if (!round && error_.ok()) {
        return absl::InternalError(absl::StrCat(
            "fused rollout: step ", plan.step,
            " is not admitted at published version ", published_version_));
      }
    }
  }
  const absl::Time deadline = clock_.Now() + options_.timeout;
  while (ready_.count(plan.step) == 0 && error_.ok() &&
         !WaitOnClock(changed_, mu_, clock_, deadline)) {
  }
  if (!error_.ok()) return error_;
  auto it = ready_.find(plan.step);
  if (it == ready_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("fused rollout: no batch for step ", plan.step, " within ",
                     absl::FormatDuration(options_.timeout),
                     " (run.collective_timeout_seconds)"));
  }
  RolloutBatch batch = std::move(it->second);
  ready_.erase(it);
  taken_at_ = clock_.MonotonicNow();
  return batch;
}

}  // namespace fusionrl
