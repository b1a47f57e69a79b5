#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/memory_manager.h"
#include "core/status_macros.h"
#include "engine/collectives/grad_sync.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"
#include "engine/train/checkpoint.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner_impl.h"
#include "worker/fused_rollout.h"
#include "worker/hier_sync.h"
#include "worker/step/card_turns.h"
#include "worker/step/group_sampler.h"
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

// One attempt of one step on this card, while TrainStep runs it: the batch,
// what training it gave, the sums over the job's cards and the phases'
// times.
struct CardRunner::StepRun {
  absl::Time start;  // monotonic
  RolloutBatch batch;
  StepTimes times;
  int64_t thread_samples = 0;
  int64_t over_stale = 0;
  // rollout_version jit: the lag the batch was admitted with; -1 otherwise.
  int64_t admission_lag = -1;
  int64_t max_staleness = 0;
  TrainStats train;
  StepExchange exchange;
  StepTotals mine;           // what this card trained
  StepTotals totals;         // summed over the job's cards
  bool interleaved = false;  // the mode this step ran in (card_turns.h)
  RoleSplit split;           // since the previous step's record
};

absl::Status CardRunner::TrainStep(const StepPlan& plan, StepReport& report) {
  if (plan.eval_before) {
    FUSIONRL_RETURN_IF_ERROR(EvaluateBefore(plan, report));
  }
  StepRun run;
  run.start = clock_.MonotonicNow();
  job_.counters->active = true;
  FUSIONRL_RETURN_IF_ERROR(TakeBatch(plan, run));
  FUSIONRL_RETURN_IF_ERROR(PrepareOptimizer());
  FUSIONRL_RETURN_IF_ERROR(TrainOnBatch(plan, run));
  FUSIONRL_RETURN_IF_ERROR(SumTotals(plan, run));
  FUSIONRL_RETURN_IF_ERROR(SyncAcrossSuperNodes(plan, run, report));
  EndOnCard(run);
  if (plan.rank == 0) return ReportAsLead(plan, run, report);
  if (plan.eval_after) {
    Doing(absl::StrCat("evaluation after step ", plan.step));
    FUSIONRL_RETURN_IF_ERROR(Evaluate(plan).status());
  }
  return absl::OkStatus();
}

absl::Status CardRunner::EvaluateBefore(const StepPlan& plan,
                                        StepReport& report) {
  Doing("evaluation before step 1");
  FUSIONRL_ASSIGN_OR_RETURN(std::optional<EvalResult> initial, Evaluate(plan));
  if (initial.has_value()) {
    spdlog::info("[{}] initial eval accuracy {:.3f} ({:.1f}s)", config().name,
                 initial->accuracy, initial->seconds);
    report.initial_eval_accuracy = initial->accuracy;
  }
  return absl::OkStatus();
}

absl::Status CardRunner::TakeBatch(const StepPlan& plan, StepRun& run) {
  FUSIONRL_ASSIGN_OR_RETURN(
      run.batch, StepBatch(plan, &run.times.rollout_wait, &run.thread_samples,
                           &run.over_stale));
  run.times.rollout = run.batch.seconds;
  run.times.gate_wait = run.batch.gate_wait_seconds;
  run.admission_lag =
      config().stalesync.rollout_version == RolloutVersion::kJustInTime
          ? run.batch.admission_lag
          : -1;
  run.max_staleness =
      StalenessFilter::MaxStaleness(run.batch.samples, trainer_->version());
  return absl::OkStatus();
}

absl::Status CardRunner::TrainOnBatch(const StepPlan& plan, StepRun& run) {
  const absl::Time t1 = clock_.MonotonicNow();
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
    absl::StatusOr<TrainStats> stepped = trainer_->Step(run.batch.samples);
    if (job_.experts != nullptr) {
      const GradientSync::AllToAllTotals& a2a =
          job_.experts->all_to_all_totals();
      run.exchange.expert_alltoall_calls = a2a.calls - a2a_before.calls;
      run.exchange.expert_alltoall_bytes = a2a.bytes - a2a_before.bytes;
      run.exchange.expert_alltoall_seconds = a2a.seconds - a2a_before.seconds;
    }
    overlap_.End(RoleOverlap::Role::kTrainer);
    if (turns_ != nullptr) turns_->TrainerExit();
    FUSIONRL_ASSIGN_OR_RETURN(run.train, std::move(stepped));
    memory_->Set(MemoryCategory::kActivations, counted.peak_bytes());
  }
  memory_->Set(MemoryCategory::kGradients, GradientBytes(*ctx_.policy));
  if (!memory_->optimizer_offloaded()) {
    memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  }
  run.times.train = clock_.SecondsSince(t1);
  if (gathered_ != nullptr) {
    // Every card of the expert group, after every step: what rollout,
    // evaluation and checkpoints read.
    const absl::Time tg = clock_.MonotonicNow();
    FUSIONRL_RETURN_IF_ERROR(GatherExperts());
    run.times.expert_gather = clock_.SecondsSince(tg);
  }
  return absl::OkStatus();
}

absl::Status CardRunner::SaveCardCheckpointFiles(const StepPlan& plan) {
  FUSIONRL_RETURN_IF_ERROR(SavePrefetch(plan.step));
  return SaveExpertShard(plan.checkpoint_name, plan.rank, plan.step);
}

absl::Status CardRunner::SumTotals(const StepPlan& plan, StepRun& run) {
  // What this card trained (the version the step started from), summed
  // over the job's cards.
  const int lag = config().stalesync.max_policy_lag;
  FUSIONRL_ASSIGN_OR_RETURN(
      run.mine, StepTotals::Of(run.batch, trainer_->version() - 1, lag,
                               run.thread_samples, run.over_stale));
  std::vector<double> flat = run.mine.Pack();
  if (!plan.checkpoint_name.empty() && !plan.exchange_updates) {
    // Before the step's sum: every card's file is on disk before the lead
    // writes the checkpoint.
    FUSIONRL_RETURN_IF_ERROR(SaveCardCheckpointFiles(plan));
  }
  FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_.get(), flat));
  FUSIONRL_ASSIGN_OR_RETURN(run.totals, StepTotals::Unpack(flat, lag));
  return absl::OkStatus();
}

absl::Status CardRunner::SyncAcrossSuperNodes(const StepPlan& plan,
                                              StepRun& run,
                                              StepReport& report) {
  if (plan.sync_weights) {
    const absl::Time ts0 = clock_.MonotonicNow();
    Doing(absl::StrCat("weight sync after step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(run.exchange.weight_sync_bytes,
                              SyncWeights(plan));
    // Expert parallelism: the shard may have taken the lead's.
    FUSIONRL_RETURN_IF_ERROR(GatherExperts());
    run.times.weight_sync = clock_.SecondsSince(ts0);
  }
  if (!plan.exchange_updates) return absl::OkStatus();
  if (!plan.checkpoint_name.empty()) {
    // Across super nodes the checkpoint holds the synced weights (and each
    // expert shard's synced optimizer state).
    FUSIONRL_RETURN_IF_ERROR(SaveCardCheckpointFiles(plan));
  }
  if (job_.local_rank != 0) return absl::OkStatus();
  // Each super node reports its own tokens and groups; the controller
  // adds them up.
  report.rollout_tokens = static_cast<int64_t>(run.totals.tokens);
  report.has_trained_groups = true;
  report.trained_groups = run.totals.trained_groups;
  report.trained_group_id_sum = run.totals.trained_group_id_sum;
  report.trained_group_id_sq_sum = run.totals.trained_group_id_sq_sum;
  if (plan.sync_weights) {
    // Every expert; with expert_sampling shard the lead card's shard
    // (each super node's card 0 holds the same one).
    report.weights_crc32c = WeightsCrc32c(RolloutSource());
    report.has_weights_crc32c = true;
  }
  return absl::OkStatus();
}

void CardRunner::EndOnCard(StepRun& run) {
  run.times.step = clock_.SecondsSince(run.start);
  // The mode this step ran in; the next step's may differ.
  run.interleaved = turns_ != nullptr && turns_->interleaved();
  if (turns_ != nullptr) {
    turns_->StepDone(run.times.step, static_cast<int64_t>(run.mine.tokens));
  }
  job_.counters->busy_us += static_cast<int64_t>(run.times.step * 1e6);
  // Since the previous step's record (the first one holds the setup).
  run.split = overlap_.Take();
}

absl::Status CardRunner::ReportAsLead(const StepPlan& plan, StepRun& run,
                                      StepReport& report) {
  MetricFields rec = StepRecord(RecordParts(plan, run));
  if (plan.eval_after) {
    Doing(absl::StrCat("evaluation after step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(std::optional<EvalResult> ev, Evaluate(plan));
    report.eval_accuracy = ev->accuracy;
    rec.push_back({"eval_accuracy", ev->accuracy});
    rec.push_back({"eval_seconds", ev->seconds});
  }
  if (!plan.checkpoint_name.empty()) {
    FUSIONRL_RETURN_IF_ERROR(
        WriteStepCheckpoint(plan, plan.step, &report.checkpoint_dir));
  }
  const StepTotals& totals = run.totals;
  report.metrics = std::move(rec);
  report.rollout_tokens = static_cast<int64_t>(totals.tokens);
  report.loop_seconds = run.times.step;
  report.reward_mean = totals.reward_sum / totals.samples;
  report.train_accuracy = totals.correct / totals.samples;
  report.policy_version = trainer_->version();
  return absl::OkStatus();
}

StepRecordParts CardRunner::RecordParts(const StepPlan& plan, StepRun& run) {
  const JobConfig& cfg = config();
  StepExchange& exchange = run.exchange;
  exchange.cross_node_rounds = sync_->rounds();
  exchange.cross_node_seconds = sync_->cross_node_seconds();
  exchange.cross_node_bytes = sync_->cross_node_bytes();
  exchange.updates_received = sync_->updates_received();
  exchange.max_update_lag = sync_->max_update_lag();
  exchange.sampling_alltoall_bytes = sampling_alltoall_bytes_.exchange(0);
  exchange.sampling_alltoall_seconds =
      static_cast<double>(sampling_alltoall_us_.exchange(0)) / 1e6;
  StepRecordParts parts;
  parts.step = plan.step;
  parts.policy_version = trainer_->version();
  parts.cards = plan.world_size;
  parts.nodes = plan.nodes;
  parts.attempt = plan.attempt;
  parts.totals = &run.totals;
  parts.train = &run.train;
  parts.max_staleness = run.max_staleness;
  parts.admission_lag = run.admission_lag;
  parts.times = run.times;
  parts.exchange = exchange;
  parts.split = run.split;
  parts.interleaved = run.interleaved;
  parts.snapshot_updates = fused_ != nullptr ? fused_->snapshot_updates() : 0;
  parts.moe = cfg.model.moe_experts > 0;
  if (parts.moe) parts.card_memory = memory_->Snapshot();
  parts.expert_parallel =
      job_.experts != nullptr ? job_.experts->world_size() : 1;
  parts.samples_shard = samples_shard_;
  parts.env = !cfg.env.name.empty();
  const PolicyModel& policy = *ctx_.policy;
  if (policy.lora()) {
    parts.lora_rank = cfg.model.lora.rank;
    parts.trainable_parameters = policy.num_trainable_parameters();
  }
  for (const Sample& s : run.batch.samples) {
    for (const auto& [name, value] : s.episode.metrics) {
      parts.env_metrics[name] +=
          value / static_cast<double>(run.batch.samples.size());
    }
  }
  return parts;
}

}  // namespace fusionrl
