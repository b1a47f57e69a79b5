#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/memory_manager.h"
#include "core/status_macros.h"
#include "engine/train/checkpoint.h"
#include "engine/collectives/grad_sync.h"
#include "engine/train/memory_accounting.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"
#include "engine/train/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner_impl.h"
#include "worker/step/card_turns.h"
#include "worker/fused_rollout.h"
#include "worker/step/group_sampler.h"
#include "worker/hier_sync.h"
#include "worker/step/staleness_filter.h"
#include "worker/step/step_record.h"
#include "worker/step/step_totals.h"

namespace fusionrl {

absl::Status CardRunner::CountSamplingExchanges(
    GradientSync* group, const std::function<absl::Status()>& sample) {
  if (group == nullptr) return sample();
  const GradientSync::AllToAllTotals before = group->all_to_all_totals();
  absl::Status status = sample();
  const GradientSync::AllToAllTotals& after = group->all_to_all_totals();
  sampling_alltoall_bytes_ += after.bytes - before.bytes;
  sampling_alltoall_us_ +=
      static_cast<int64_t>((after.seconds - before.seconds) * 1e6);
  return status;
}

absl::StatusOr<RolloutBatch> CardRunner::SampleHere(
    const std::vector<uint64_t>& groups, const StepPlan& plan) {
  overlap_.Begin(RoleOverlap::Role::kRollout);
  absl::Cleanup done = [this] { overlap_.End(RoleOverlap::Role::kRollout); };
  SamplingPolicy();  // LoRA: the current adapters merged into rollout_'s
  absl::StatusOr<RolloutBatch> batch;
  FUSIONRL_RETURN_IF_ERROR(
      CountSamplingExchanges(rollout_->expert_lockstep(), [&] {
        batch = sampler_->Sample(
            *rollout_, groups, plan.step, plan.rank, trainer_->version(),
            *memory_, [this](const MemoryDecision&) -> absl::Status {
              FUSIONRL_RETURN_IF_ERROR(
                  MoveOptimizerState(*trainer_, c10::kCPU));
              memory_->OptimizerOffloaded(OptimizerStateBytes(*trainer_));
              return absl::OkStatus();
            });
        return batch.status();
      }));
  return batch;
}

absl::StatusOr<std::optional<EvalResult>> CardRunner::Evaluate(
    const StepPlan& plan) {
  const int max_new = config().rollout.max_new_tokens;
  if (plan.rank == 0) {
    FUSIONRL_ASSIGN_OR_RETURN(EvalResult result,
                              EvaluateGreedy(SamplingPolicy(), ctx_, max_new));
    return result;
  }
  if (samples_shard_) {
    // The lead evaluates on its shard: this card's experts take part.
    FUSIONRL_RETURN_IF_ERROR(
        EvaluateGreedy(*ctx_.policy, ctx_, max_new, /*joins_only=*/true)
            .status());
  }
  return std::nullopt;
}

absl::Status CardRunner::PrepareOptimizer() {
  CardMemoryManager& m = *memory_;
  if (m.offload_in_flight()) {
    FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, c10::kCPU));
    m.OptimizerOffloaded(OptimizerStateBytes(*trainer_));
  }
  if (!m.optimizer_offloaded()) return absl::OkStatus();
  const c10::Device device = ctx_.policy->device();
  int64_t back = m.OptimizerRestoreNeeded() ? 1 : 0;
  if (back == 0 && !device.is_cpu()) {
    // AdamW needs its state next to the parameters: wait for the room.
    FUSIONRL_ASSIGN_OR_RETURN(
        back, m.WaitOptimizerRestore(clock_, clock_.Now() + timeout_));
  }
  if (back > 0) {
    FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, device));
    m.OptimizerRestored(OptimizerStateBytes(*trainer_));
  }
  // On a CPU card a state left "on the host" is the same memory: step on.
  return absl::OkStatus();
}

absl::StatusOr<RolloutBatch> CardRunner::StepBatch(const StepPlan& plan,
                                                   double* wait_seconds,
                                                   int64_t* thread_samples,
                                                   int64_t* over_stale) {
  const JobConfig& cfg = config();
  RolloutBatch batch;
  *wait_seconds = 0;
  *thread_samples = 0;
  *over_stale = 0;
  if (fused_ != nullptr) {
    if (resumed_step_ >= 0) {
      RestorePrefetch(plan);
      resumed_step_ = -1;
    }
    Doing(absl::StrCat("waiting for the rollout of step ", plan.step));
    const absl::Time t0 = clock_.MonotonicNow();
    FUSIONRL_ASSIGN_OR_RETURN(batch, fused_->Take(plan));
    *wait_seconds = clock_.SecondsSince(t0);
    *thread_samples = static_cast<int64_t>(batch.samples.size());
  } else {
    Doing(absl::StrCat("rollout of step ", plan.step, " (", plan.groups.size(),
                       " prompt groups)"));
    FUSIONRL_ASSIGN_OR_RETURN(batch, SampleHere(plan.groups, plan));
  }
  const int64_t max_lag = cfg.stalesync.max_policy_lag;
  const StalenessFilter filter(max_lag);
  FUSIONRL_ASSIGN_OR_RETURN(
      std::vector<uint64_t> stale_groups,
      filter.OverStaleGroups(batch.samples, trainer_->version()));
  if (samples_shard_ && fused_ != nullptr &&
      cfg.stalesync.over_stale == OverStalePolicy::kRegenerate) {
    // The cards of an expert group sample in lockstep: all of them take
    // part in a regeneration any of them needs, with no groups of their
    // own where they need none. (A batch sampled here, from the trainer's
    // version, is never over the lag.)
    std::vector<double> anywhere = {static_cast<double>(stale_groups.size())};
    FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(job_.experts, anywhere));
    if (stale_groups.empty() && anywhere[0] > 0) {
      FUSIONRL_RETURN_IF_ERROR(SampleHere({}, plan).status());
    }
  }
  if (stale_groups.empty()) return batch;
  *over_stale =
      static_cast<int64_t>(stale_groups.size()) * cfg.rollout.group_size;
  spdlog::warn(
      "{} card {}: step {}: {} prompt group(s) over the policy lag {}; {}",
      job_.node_id, job_.local_rank, plan.step, stale_groups.size(), max_lag,
      OverStalePolicyName(cfg.stalesync.over_stale));
  if (fused_ != nullptr) *thread_samples -= *over_stale;
  if (cfg.stalesync.over_stale == OverStalePolicy::kDrop) {
    StalenessFilter::Drop(batch.samples, stale_groups);
  } else {
    FUSIONRL_ASSIGN_OR_RETURN(RolloutBatch fresh,
                              SampleHere(stale_groups, plan));
    StalenessFilter::Replace(batch.samples, stale_groups,
                             std::move(fresh.samples));
    // Recount the batch's totals over what is trained.
    batch.Recount();
  }
  return batch;
}

absl::Status CardRunner::TrainStep(const StepPlan& plan, StepReport& report) {
  const JobConfig& cfg = config();
  PolicyModel& policy = *ctx_.policy;
  const bool lead = plan.rank == 0;
  if (plan.eval_before) {
    Doing("evaluation before step 1");
    FUSIONRL_ASSIGN_OR_RETURN(std::optional<EvalResult> initial,
                              Evaluate(plan));
    if (initial.has_value()) {
      spdlog::info("[{}] initial eval accuracy {:.3f} ({:.1f}s)", cfg.name,
                   initial->accuracy, initial->seconds);
      report.initial_eval_accuracy = initial->accuracy;
    }
  }
  const absl::Time t0 = clock_.MonotonicNow();
  job_.counters->active = true;
  StepTimes times;
  int64_t thread_samples = 0;
  int64_t over_stale = 0;
  FUSIONRL_ASSIGN_OR_RETURN(
      RolloutBatch batch,
      StepBatch(plan, &times.rollout_wait, &thread_samples, &over_stale));
  times.rollout = batch.seconds;
  times.gate_wait = batch.gate_wait_seconds;
  const int64_t admission_lag =
      cfg.stalesync.rollout_version == RolloutVersion::kJustInTime
          ? batch.admission_lag
          : -1;
  const int64_t max_staleness =
      StalenessFilter::MaxStaleness(batch.samples, trainer_->version());
  FUSIONRL_RETURN_IF_ERROR(PrepareOptimizer());
  const absl::Time t1 = clock_.MonotonicNow();
  TrainStats ts;
  StepExchange exchange;
  Doing(absl::StrCat("training step ", plan.step));
  {
    // Activations: the bytes the step allocates and holds at its peak.
    ScopedAllocationCounter counted(ctx_.policy->device());
    if (turns_ != nullptr) {
      FUSIONRL_RETURN_IF_ERROR(turns_->TrainerEnter(clock_.Now() + timeout_));
    }
    overlap_.Begin(RoleOverlap::Role::kTrainer);
    const GradientSync::AllToAllTotals a2a_before =
        job_.experts != nullptr ? job_.experts->all_to_all_totals()
                                : GradientSync::AllToAllTotals{};
    absl::StatusOr<TrainStats> stepped = trainer_->Step(batch.samples);
    if (job_.experts != nullptr) {
      const GradientSync::AllToAllTotals& a2a =
          job_.experts->all_to_all_totals();
      exchange.expert_alltoall_calls = a2a.calls - a2a_before.calls;
      exchange.expert_alltoall_bytes = a2a.bytes - a2a_before.bytes;
      exchange.expert_alltoall_seconds = a2a.seconds - a2a_before.seconds;
    }
    overlap_.End(RoleOverlap::Role::kTrainer);
    if (turns_ != nullptr) turns_->TrainerExit();
    FUSIONRL_ASSIGN_OR_RETURN(ts, std::move(stepped));
    memory_->Set(MemoryCategory::kActivations, counted.peak_bytes());
  }
  memory_->Set(MemoryCategory::kGradients, GradientBytes(policy));
  if (!memory_->optimizer_offloaded()) {
    memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  }
  times.train = clock_.SecondsSince(t1);
  if (gathered_ != nullptr) {
    // Every card of the expert group, after every step: what rollout,
    // evaluation and checkpoints read.
    const absl::Time tg = clock_.MonotonicNow();
    FUSIONRL_RETURN_IF_ERROR(GatherExperts());
    times.expert_gather = clock_.SecondsSince(tg);
  }
  // What this card trained (the version the step started from), summed
  // over the job's cards.
  const int lag = cfg.stalesync.max_policy_lag;
  FUSIONRL_ASSIGN_OR_RETURN(StepTotals mine,
                            StepTotals::Of(batch, trainer_->version() - 1, lag,
                                           thread_samples, over_stale));
  std::vector<double> flat = mine.Pack();
  const bool checkpoint = !plan.checkpoint_name.empty();
  if (checkpoint && !plan.exchange_updates) {
    // Before the step's sum: every card's file is on disk before the lead
    // writes the checkpoint.
    FUSIONRL_RETURN_IF_ERROR(SavePrefetch(plan.step));
    FUSIONRL_RETURN_IF_ERROR(
        SaveExpertShard(plan.checkpoint_name, plan.rank, plan.step));
  }
  FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_.get(), flat));
  FUSIONRL_ASSIGN_OR_RETURN(const StepTotals totals,
                            StepTotals::Unpack(flat, lag));
  if (plan.sync_weights) {
    const absl::Time ts0 = clock_.MonotonicNow();
    Doing(absl::StrCat("weight sync after step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(exchange.weight_sync_bytes, SyncWeights(plan));
    // Expert parallelism: the shard may have taken the lead's.
    FUSIONRL_RETURN_IF_ERROR(GatherExperts());
    times.weight_sync = clock_.SecondsSince(ts0);
  }
  if (checkpoint && plan.exchange_updates) {
    // Across super nodes the checkpoint holds the synced weights (and each
    // expert shard's synced optimizer state).
    FUSIONRL_RETURN_IF_ERROR(SavePrefetch(plan.step));
    FUSIONRL_RETURN_IF_ERROR(
        SaveExpertShard(plan.checkpoint_name, plan.rank, plan.step));
  }
  if (plan.exchange_updates && job_.local_rank == 0) {
    // Each super node reports its own tokens and groups; the controller
    // adds them up.
    report.rollout_tokens = static_cast<int64_t>(totals.tokens);
    report.has_trained_groups = true;
    report.trained_groups = totals.trained_groups;
    report.trained_group_id_sum = totals.trained_group_id_sum;
    report.trained_group_id_sq_sum = totals.trained_group_id_sq_sum;
    if (plan.sync_weights) {
      // Every expert; with expert_sampling shard the lead card's shard
      // (each super node's card 0 holds the same one).
      report.weights_crc32c = WeightsCrc32c(RolloutSource());
      report.has_weights_crc32c = true;
    }
  }
  times.step = clock_.SecondsSince(t0);
  // The mode this step ran in; the next step's may differ.
  const bool interleaved = turns_ != nullptr && turns_->interleaved();
  if (turns_ != nullptr) {
    turns_->StepDone(times.step, static_cast<int64_t>(mine.tokens));
  }
  job_.counters->busy_us += static_cast<int64_t>(times.step * 1e6);
  // Since the previous step's record (the first one holds the setup).
  const RoleSplit split = overlap_.Take();
  if (!lead) {
    if (plan.eval_after) {
      Doing(absl::StrCat("evaluation after step ", plan.step));
      FUSIONRL_RETURN_IF_ERROR(Evaluate(plan).status());
    }
    return absl::OkStatus();
  }

  exchange.cross_node_rounds = sync_->rounds();
  exchange.cross_node_seconds = sync_->cross_node_seconds();
  exchange.cross_node_bytes = sync_->cross_node_bytes();
  exchange.updates_received = sync_->updates_received();
  exchange.max_update_lag = sync_->max_update_lag();
  StepRecordParts parts;
  parts.step = plan.step;
  parts.policy_version = trainer_->version();
  parts.cards = plan.world_size;
  parts.nodes = plan.nodes;
  parts.attempt = plan.attempt;
  parts.totals = &totals;
  parts.train = &ts;
  parts.max_staleness = max_staleness;
  parts.admission_lag = admission_lag;
  parts.times = times;
  exchange.sampling_alltoall_bytes = sampling_alltoall_bytes_.exchange(0);
  exchange.sampling_alltoall_seconds =
      static_cast<double>(sampling_alltoall_us_.exchange(0)) / 1e6;
  parts.exchange = exchange;
  parts.split = split;
  parts.interleaved = interleaved;
  parts.snapshot_updates = fused_ != nullptr ? fused_->snapshot_updates() : 0;
  parts.moe = cfg.model.moe_experts > 0;
  if (parts.moe) parts.card_memory = memory_->Snapshot();
  parts.expert_parallel =
      job_.experts != nullptr ? job_.experts->world_size() : 1;
  parts.samples_shard = samples_shard_;
  parts.env = !cfg.env.name.empty();
  if (policy.lora()) {
    parts.lora_rank = cfg.model.lora.rank;
    parts.trainable_parameters = policy.num_trainable_parameters();
  }
  for (const Sample& s : batch.samples) {
    for (const auto& [name, value] : s.episode.metrics) {
      parts.env_metrics[name] +=
          value / static_cast<double>(batch.samples.size());
    }
  }
  MetricFields rec = StepRecord(parts);
  if (plan.eval_after) {
    Doing(absl::StrCat("evaluation after step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(std::optional<EvalResult> ev, Evaluate(plan));
    report.eval_accuracy = ev->accuracy;
    rec.push_back({"eval_accuracy", ev->accuracy});
    rec.push_back({"eval_seconds", ev->seconds});
  }
  if (checkpoint) {
    FUSIONRL_RETURN_IF_ERROR(
        WriteStepCheckpoint(plan, plan.step, &report.checkpoint_dir));
  }
  report.metrics = std::move(rec);
  report.rollout_tokens = static_cast<int64_t>(totals.tokens);
  report.loop_seconds = times.step;
  report.reward_mean = totals.reward_sum / totals.samples;
  report.train_accuracy = totals.correct / totals.samples;
  report.policy_version = trainer_->version();
  return absl::OkStatus();
}

}  // namespace fusionrl
