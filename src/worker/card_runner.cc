#include "worker/card_runner.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/memory_manager.h"
#include "core/role_overlap.h"
#include "core/status_macros.h"
#include "engine/checkpoint.h"
#include "engine/grad_sync.h"
#include "engine/intra_op_threads.h"
#include "engine/job_common.h"
#include "engine/memory_accounting.h"
#include "engine/model.h"
#include "engine/rollout.h"
#include "engine/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/card_turns.h"
#include "worker/controller_store.h"
#include "worker/fused_rollout.h"
#include "worker/group_sampler.h"
#include "worker/hier_sync.h"
#include "worker/rollout_prefetch.h"
#include "worker/staleness_filter.h"
#include "worker/step_snapshot.h"

namespace fusionrl {
namespace {

using SteadyClock = std::chrono::steady_clock;

class CardRunner {
 public:
  explicit CardRunner(const CardJob& job)
      : job_(job),
        clock_(*job.clock),
        timeout_(absl::Seconds(job.config->run.collective_timeout_seconds)),
        overlap_(*job.clock) {}
  ~CardRunner() {
    if (fused_ != nullptr) fused_->Stop();
  }

  absl::Status Run();

 private:
  const JobConfig& config() const { return *job_.config; }
  absl::Status Setup();
  // The colocated rollout of `groups` on this thread.
  absl::StatusOr<RolloutBatch> SampleHere(const std::vector<uint64_t>& groups,
                                          const StepPlan& plan);
  // Before a training step: carries out an optimizer offload the rollout
  // thread was granted, and brings the state back when it fits.
  absl::Status PrepareOptimizer();
  // StaleSync across super nodes, after a sync_weights step: the lead card
  // publishes its weights and optimizer state (through the controller's
  // WeightService, or broadcast over the c10d data plane), the cards of
  // the other super nodes adopt them. Returns the bytes this card sent or
  // received.
  absl::StatusOr<int64_t> SyncWeights(const StepPlan& plan);
  // One attempt of one step. Fills `report` (lead: metrics).
  absl::Status TrainStep(const StepPlan& plan, StepReport& report);
  absl::Status WriteEndCheckpoint(const StepPlan& plan, std::string* dir);
  absl::StatusOr<bool> Finish(const StepReport& report);
  void ReportFailure(const absl::Status& status, int64_t step, int attempt);
  StepReport NewReport(int64_t step, int attempt) const;
  void PublishToRollout();
  // The checkpoint writer's fault-injection pause (debug_checkpoint_delay).
  std::function<void()> CheckpointPause() const;
  // What the card does now (heartbeats report it; docs/cluster.md#hangs).
  void Doing(std::string what) { job_.counters->SetActivity(std::move(what)); }
  // StaleSync across super nodes, before a step: keeps the weights every
  // super node starts from (the first step), and after a roll-back
  // (plan.rollback_to_step, a new attempt) restores those of the last
  // committed weight sync and drops the rollout's prefetched samples.
  absl::Status EnterSkewedStep(const StepPlan& plan);
  // Keeps this card's state after the weight sync of `step` (on the host),
  // dropping syncs after it and all but the newest before it.
  absl::Status KeepSyncPoint(int64_t step);
  // Fused or disaggregated with rollout_version lagged: writes what this
  // card's rollout sampled ahead of the checkpoint of `step`
  // (worker/rollout_prefetch.h).
  absl::Status SavePrefetch(int64_t step);
  // The same for the job's end checkpoint after `step` (once; a failure is
  // logged: the checkpoint stands, a resume samples afresh).
  void SaveEndPrefetch(int64_t step);
  // After a resume, before the first batch is taken: continues the rollout
  // pipeline the checkpoint's prefetch file of this card describes, or
  // says why the coming steps are sampled afresh.
  void RestorePrefetch(const StepPlan& plan);

  const CardJob& job_;
  const Clock& clock_;
  const absl::Duration timeout_;
  JobContext ctx_;
  std::unique_ptr<GroupSampler> sampler_;
  std::unique_ptr<PolicyModel> reference_;
  std::unique_ptr<HierarchicalSync> sync_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<RolloutEngine> rollout_;
  std::unique_ptr<FusedRollout> fused_;
  std::shared_ptr<CardMemoryManager> memory_;          // this card
  std::shared_ptr<CardMemoryManager> rollout_memory_;  // its rollout card's
  int per_card_threads_ = 1;
  // When this card's trainer and rollout compute: the step's time split,
  // and (fused) whether the trainer is in a training step, when the
  // rollout's decode steps take a share only.
  RoleOverlap overlap_;
  // Fused with a lag, every thread shared: concurrent or interleaved.
  std::unique_ptr<CardTurns> turns_;
  int64_t plan_step_ = 0;
  int plan_attempt_ = 0;
  // StaleSync across super nodes: the state after the last weight syncs
  // (at most two: the last committed one and a newer one), by step, and
  // the attempt of the last skewed plan.
  std::map<int64_t, StepSnapshot> sync_points_;
  int skewed_attempt_ = 0;
  // Resumed: the checkpoint's step and weights (RestorePrefetch).
  int64_t resumed_step_ = -1;
  uint32_t resumed_crc32c_ = 0;
  bool end_prefetch_saved_ = false;
};

StepReport CardRunner::NewReport(int64_t step, int attempt) const {
  StepReport report;
  report.job_id = job_.job_id;
  report.node_id = job_.node_id;
  report.step = step;
  report.attempt = attempt;
  return report;
}

absl::StatusOr<bool> CardRunner::Finish(const StepReport& report) {
  return job_.client->FinishStep(report, timeout_);
}

void CardRunner::ReportFailure(const absl::Status& status, int64_t step,
                               int attempt) {
  if (job_.local_rank != 0) return;
  StepReport report = NewReport(step, attempt);
  report.error = status;
  Finish(report).IgnoreError();
}

std::function<void()> CardRunner::CheckpointPause() const {
  if (job_.debug_checkpoint_delay <= absl::ZeroDuration()) return {};
  return [this] { SleepOnClock(clock_, job_.debug_checkpoint_delay); };
}

void CardRunner::PublishToRollout() {
  fused_->Publish(ctx_.policy->parameters(), trainer_->version());
}

absl::Status CardRunner::Setup() {
  const JobConfig& cfg = config();
  FUSIONRL_ASSIGN_OR_RETURN(ctx_, PrepareJob(cfg, std::string()));
  sampler_ = std::make_unique<GroupSampler>(cfg, ctx_);
  // Each of the node's cards in the job gets an equal share of the threads.
  per_card_threads_ = std::max(1, job_.threads / job_.assigned_cards);
  SetIntraOpThreads(per_card_threads_);
  PolicyModel& policy = *ctx_.policy;
  if (cfg.algorithm.kl_coef > 0) reference_ = policy.CloneFrozen();
  WorkClient* client = job_.client;
  sync_ = std::make_unique<HierarchicalSync>(
      job_.local, job_.local_rank,
      [this, client](int64_t round, ReduceDtype dtype,
                     std::string payload) -> absl::StatusOr<std::string> {
        ReduceCall call;
        call.job_id = job_.job_id;
        call.node_id = job_.node_id;
        call.step = plan_step_;
        call.attempt = plan_attempt_;
        call.round = round;
        call.dtype = dtype;
        call.payload = std::move(payload);
        return client->Reduce(std::move(call), timeout_);
      },
      [this, client](int64_t step, int64_t round, int64_t due_step,
                     std::string payload) {
        UpdateCall call;
        call.job_id = job_.job_id;
        call.node_id = job_.node_id;
        call.step = step;
        call.round = round;
        call.due_step = due_step;
        call.attempt = plan_attempt_;
        call.payload = std::move(payload);
        return client->ExchangeUpdates(std::move(call), timeout_);
      },
      [this, client](int64_t generation, int node_rank, int nodes) {
        return FormCrossNodeGroup(client, job_.job_id, job_.node_id, generation,
                                  node_rank, nodes, timeout_);
      });
  sync_->set_activity_hook([this](const char* what, int64_t round) {
    Doing(what == nullptr
              ? absl::StrCat("training step ", plan_step_)
              : absl::StrCat(what, " round ", round, " of step ", plan_step_));
  });
  FUSIONRL_ASSIGN_OR_RETURN(
      trainer_, Trainer::Create(policy, reference_.get(), cfg,
                                ctx_.tokenizer->pad_id(), sync_.get()));
  rollout_ = std::make_unique<RolloutEngine>(policy, ctx_.tokenizer->pad_id(),
                                             ctx_.stop_ids);
  rollout_->Configure(cfg.rollout);
  rollout_->set_row_blocks(per_card_threads_);
  if (job_.local_rank == 0) {
    spdlog::info(
        "[{}] {}: policy {} parameters on {} x {} card(s), task {} "
        "({} eval problems)",
        cfg.name, job_.node_id, policy.num_parameters(), job_.local_cards,
        ctx_.device.str(), ctx_.task->name(), ctx_.task->eval_set().size());
  }
  if (!job_.resume_checkpoint.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(
        CheckpointMeta meta,
        ReadCheckpoint(job_.resume_checkpoint, policy, trainer_.get()));
    trainer_->set_version(meta.policy_version);
    resumed_step_ = meta.step;
    resumed_crc32c_ = WeightsCrc32c(policy);
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      memory_, CardMemoryManager::Create(job_.local_rank, cfg.memory));
  memory_->Set(
      MemoryCategory::kWeights,
      ParameterBytes(policy) + (reference_ ? ParameterBytes(*reference_) : 0));
  memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  job_.counters->SetMemory(memory_);
  rollout_memory_ = memory_;
  if (job_.rollout_counters != nullptr) {
    FUSIONRL_ASSIGN_OR_RETURN(
        rollout_memory_,
        CardMemoryManager::Create(job_.local_rank, cfg.memory));
    job_.rollout_counters->SetMemory(rollout_memory_);
  }
  const bool fused = cfg.placement.mode == PlacementMode::kFused;
  if (!fused && cfg.placement.mode != PlacementMode::kDisaggregated) {
    return absl::OkStatus();
  }

  FusedRollout::Options fo;
  fo.max_policy_lag = cfg.stalesync.max_policy_lag;
  fo.lagged = cfg.stalesync.rollout_version == RolloutVersion::kLagged;
  fo.prompts_per_step = cfg.rollout.prompts_per_step;
  fo.partial_rollout_tokens = cfg.stalesync.partial_rollout_tokens;
  fo.snapshot_version = trainer_->version();
  fo.timeout = timeout_;
  fo.freeze_snapshot_before_step =
      job_.debug_freeze_rollout_snapshot_before_step;
  int train_threads = per_card_threads_;
  std::unique_ptr<PolicyModel> snapshot;
  if (fused) {
    // RL Fusion: this thread trains with half the card's threads, the
    // rollout thread samples with the rest; either borrows the other's
    // share while the other is idle.
    train_threads = cfg.placement.fused_train_threads > 0
                        ? cfg.placement.fused_train_threads
                        : std::max(1, per_card_threads_ / 2);
    fo.rollout_threads = cfg.placement.fused_rollout_threads > 0
                             ? cfg.placement.fused_rollout_threads
                             : std::max(1, per_card_threads_ - train_threads);
    snapshot = policy.CloneFrozen();
    // At s = 0 nothing can overlap (the next step samples from the weights
    // this step trains): the card samples between its steps, on its whole
    // thread budget, from the snapshot.
    fo.synchronous_on_caller = true;
  } else {
    // Disaggregated: this card trains with its whole share; the rollout
    // thread samples on its rollout card with that card's share (split
    // between the training cards it serves).
    const int served = std::max(1, job_.local_cards / job_.rollout_cards);
    fo.rollout_threads = std::max(1, per_card_threads_ / served);
    FUSIONRL_ASSIGN_OR_RETURN(c10::Device rollout_device,
                              ResolveDevice(job_.rollout_device));
    snapshot = policy.CloneFrozen(rollout_device);
  }
  rollout_memory_->Set(MemoryCategory::kSnapshot, ParameterBytes(*snapshot));
  SetIntraOpThreads(train_threads);
  auto engine = std::make_unique<RolloutEngine>(
      *snapshot, ctx_.tokenizer->pad_id(), ctx_.stop_ids);
  engine->Configure(cfg.rollout);
  // The decoder's rows are split as on a card that samples with all its
  // threads, whatever share the rollout holds at a step: the samples are
  // those of a colocated-sync run, and the same in every run.
  const int card_threads = std::max(per_card_threads_, train_threads);
  engine->set_row_blocks(card_threads);
  const bool share = fused && cfg.placement.fused_share_idle_threads;
  // The trainer's step does not depend on its thread count either
  // (engine/invariant_ops.h), except through the composite attention
  // kernel's batched products: with it the trainer keeps its share.
  const bool trainer_shares = share && (cfg.model.attention_kernel == "fused" ||
                                        !policy.device().is_cpu());
  if (trainer_shares && engine->fused() && fo.max_policy_lag > 0) {
    // Both roles share every thread: the card measures whether they
    // compute faster at once or in turns (worker/card_turns.h).
    CardTurns::Options turns;
    turns.settle_steps = static_cast<int>(fo.max_policy_lag) + 1;
    turns_ = std::make_unique<CardTurns>(turns, clock_);
  }
  if (share && engine->fused()) {
    // The rollout borrows the trainer's threads at every decode step the
    // trainer does not compute (the trainer does the same before each of
    // its forward passes, below). Only on the fused decoder, whose samples
    // do not depend on its thread count.
    const int rollout_threads = fo.rollout_threads;
    engine->set_step_hook([this, rollout_threads, card_threads] {
      if (turns_ != nullptr && turns_->interleaved()) {
        // Waiting for its turn is not computing (the card's time split).
        // The engine's loop has no status to return: the round ends with
        // the exception (FusedRollout records it as the thread's error).
        overlap_.End(RoleOverlap::Role::kRollout);
        absl::Status s = turns_->RolloutStep(clock_.Now() + timeout_);
        overlap_.Begin(RoleOverlap::Role::kRollout);
        if (!s.ok()) throw std::runtime_error(std::string(s.message()));
        SetIntraOpThreads(card_threads);
        return;
      }
      SetIntraOpThreads(overlap_.Computing(RoleOverlap::Role::kTrainer)
                            ? rollout_threads
                            : card_threads);
    });
    fo.round_on_own_thread = true;
  }
  // Continuous batching across the steps StaleSync admits at once: only
  // where the engine refills slots (the fused path; the composite one
  // would hand every step over at the end of the round).
  if (engine->fused() && cfg.rollout.cross_step_batching) {
    fo.max_steps_per_round = static_cast<int>(fo.max_policy_lag) + 1;
  }
  CardCounters* counters =
      job_.rollout_counters != nullptr ? job_.rollout_counters : job_.counters;
  CardMemoryManager* rollout_memory = rollout_memory_.get();
  const bool host_memory = policy.device().is_cpu();
  fused_ = std::make_unique<FusedRollout>(
      std::move(snapshot), std::move(engine), fo,
      [this, rollout_memory, host_memory](
          RolloutEngine& engine, const std::vector<StepGroups>& steps, int rank,
          int64_t version, const GroupSampler::DeliverFn& deliver,
          const GroupSampler::SegmentEndFn& segment_end) {
        overlap_.Begin(RoleOverlap::Role::kRollout);
        absl::Cleanup done = [this] {
          if (turns_ != nullptr) turns_->RolloutIdle();
          overlap_.End(RoleOverlap::Role::kRollout);
        };
        return sampler_->SampleSteps(
            engine, steps, rank, version, *rollout_memory,
            [this, rollout_memory, host_memory](const MemoryDecision& kv) {
              if (host_memory) {
                // Host and card are the same memory: only the books move.
                rollout_memory->OptimizerOffloaded(kv.offload_bytes);
                return absl::OkStatus();
              }
              // The trainer moves it before its next step
              // (PrepareOptimizer).
              return rollout_memory->WaitOptimizerOffloaded(clock_.Now() +
                                                            timeout_);
            },
            deliver, segment_end);
      },
      [counters](double seconds) {
        counters->busy_us += static_cast<int64_t>(seconds * 1e6);
      },
      clock_);
  if (trainer_shares) {
    FusedRollout* f = fused_.get();
    CardTurns* turns = turns_.get();
    trainer_->set_compute_hook([f, turns, train_threads, card_threads] {
      const bool alone =
          !f->sampling() || (turns != nullptr && turns->interleaved());
      SetIntraOpThreads(alone ? card_threads : train_threads);
    });
  }
  PublishToRollout();
  return absl::OkStatus();
}

absl::StatusOr<RolloutBatch> CardRunner::SampleHere(
    const std::vector<uint64_t>& groups, const StepPlan& plan) {
  overlap_.Begin(RoleOverlap::Role::kRollout);
  absl::Cleanup done = [this] { overlap_.End(RoleOverlap::Role::kRollout); };
  return sampler_->Sample(
      *rollout_, groups, plan.step, plan.rank, trainer_->version(), *memory_,
      [this](const MemoryDecision&) -> absl::Status {
        FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, c10::kCPU));
        memory_->OptimizerOffloaded(OptimizerStateBytes(*trainer_));
        return absl::OkStatus();
      });
}

absl::Status CardRunner::Run() {
  FUSIONRL_RETURN_IF_ERROR(Setup());
  PolicyModel& policy = *ctx_.policy;
  int64_t next = 0;
  for (;;) {
    Doing(next > 0 ? absl::StrCat("waiting for the plan of step ", next)
                   : std::string("waiting for the first plan"));
    FUSIONRL_ASSIGN_OR_RETURN(StepPlan plan,
                              job_.rendezvous->NextPlan(job_.local_rank, next));
    switch (plan.kind) {
      case PlanKind::kAbandon:
        if (job_.local_rank == 0) {
          spdlog::info("{}: {}", job_.node_id, plan.message);
        }
        if (!plan.checkpoint_name.empty()) SaveEndPrefetch(plan.step - 1);
        return absl::OkStatus();
      case PlanKind::kEnd: {
        // Only card 0 goes on: it writes the last checkpoint if it is the
        // job's lead, or waits for the end (it may become the lead if the
        // lead node is lost first). Every card first keeps what its rollout
        // sampled ahead, for a resume from the end checkpoint.
        SaveEndPrefetch(plan.step - 1);
        if (job_.local_rank != 0) return absl::OkStatus();
        next = plan.step;
        while (plan.kind == PlanKind::kEnd &&
               (plan.rank != 0 || plan.checkpoint_name.empty())) {
          FUSIONRL_ASSIGN_OR_RETURN(plan, job_.rendezvous->GetPlan(0, next));
        }
        if (plan.kind != PlanKind::kEnd) return absl::OkStatus();
        std::string dir;
        absl::Status s = WriteEndCheckpoint(plan, &dir);
        StepReport report = NewReport(plan.step, 0);
        if (!s.ok()) {
          report.error = s;
        } else {
          report.checkpoint_dir = dir;
        }
        FUSIONRL_RETURN_IF_ERROR(Finish(report).status());
        return s;
      }
      case PlanKind::kTrain:
        break;
      case PlanKind::kWait:
        return absl::InternalError("the rendezvous handed out a WAIT plan");
    }
    plan_step_ = plan.step;
    plan_attempt_ = plan.attempt;
    std::optional<HierarchicalSync::DataPlane> data_plane;
    if (plan.c10d_data_plane && plan.nodes > 1) {
      data_plane = HierarchicalSync::DataPlane{plan.rendezvous_generation,
                                               plan.node_rank};
    }
    if (plan.exchange_updates) {
      FUSIONRL_RETURN_IF_ERROR(EnterSkewedStep(plan));
      sync_->BeginSkewedStep(plan.step, plan.updates_due_step, plan.nodes,
                             data_plane);
    } else {
      sync_->BeginAttempt(plan.rank, plan.world_size, plan.nodes, data_plane);
    }
    // Only a synchronous step shared with other nodes can be aborted by a
    // node loss (a StaleSync job fails instead).
    std::optional<StepSnapshot> snapshot;
    if (plan.nodes > 1 && !plan.exchange_updates) {
      FUSIONRL_ASSIGN_OR_RETURN(snapshot,
                                StepSnapshot::Take(policy, *trainer_));
    }
    StepReport report = NewReport(plan.step, plan.attempt);
    absl::Status step = TrainStep(plan, report);
    if (step.ok() && job_.debug_step_delay > absl::ZeroDuration()) {
      SleepOnClock(clock_, job_.debug_step_delay);  // fault injection
    }
    if (plan.exchange_updates && absl::IsAborted(step)) {
      // A collective of the data plane failed, or the job rolled back or
      // ended under us: the controller rolls the job back to its last
      // weight sync (a no-op if it already did), and the next plan says
      // where to go on from.
      if (job_.local_rank == 0) {
        StepReport abort = NewReport(plan.step, plan.attempt);
        abort.abort_reason = std::string(step.message());
        Finish(abort).IgnoreError();
      }
      next = plan.step + 1;
      continue;
    }
    bool committed = false;
    if (step.ok() && job_.local_rank == 0) {
      Doing(absl::StrCat("end of step ", plan.step,
                         ": waiting for the other nodes"));
      absl::StatusOr<bool> done = Finish(report);
      if (done.ok()) {
        committed = *done;
      } else {
        step = done.status();
      }
    }
    if (job_.local_cards > 1 && (step.ok() || absl::IsAborted(step))) {
      // Every card learns the node's outcome of the step.
      std::vector<double> flags = {committed ? 1.0 : 0.0,
                                   step.ok() ? 0.0 : 1.0};
      FUSIONRL_RETURN_IF_ERROR(sync_->LocalSum(flags));
      committed = flags[0] > 0;
      if (flags[1] > 0 && step.ok()) {
        step = absl::AbortedError("another card of this node was aborted");
      }
    }
    if (absl::IsAborted(step) && plan.c10d_data_plane && job_.local_rank == 0) {
      // The data plane's failure is known on the nodes only: the controller
      // aborts and replans the attempt (a no-op if it already did).
      StepReport abort = NewReport(plan.step, plan.attempt);
      abort.abort_reason = std::string(step.message());
      Finish(abort).IgnoreError();
    }
    if (plan.exchange_updates && step.ok()) {
      // Not accepted: the job rolled back meanwhile, and the next plan
      // restores the last weight sync.
      if (committed && plan.sync_weights) {
        FUSIONRL_RETURN_IF_ERROR(KeepSyncPoint(plan.step));
      }
      if (fused_ != nullptr && committed) PublishToRollout();
      next = plan.step + 1;
      continue;
    }
    if (absl::IsAborted(step) || (step.ok() && !committed)) {
      if (!snapshot) {
        return absl::InternalError(
            "a single-node step was aborted; nothing to roll back to");
      }
      spdlog::warn("{} card {}: step {} attempt {} aborted ({}); rolling back",
                   job_.node_id, job_.local_rank, plan.step, plan.attempt,
                   step.ok() ? std::string("not committed")
                             : std::string(step.message()));
      FUSIONRL_RETURN_IF_ERROR(snapshot->Restore(policy, *trainer_));
      if (fused_ != nullptr) {
        // Sample the replanned step afresh from the restored weights.
        PublishToRollout();
        fused_->Reset();
      }
      next = plan.step;
      continue;
    }
    if (!step.ok()) {
      ReportFailure(step, plan.step, plan.attempt);
      return step;
    }
    if (fused_ != nullptr) PublishToRollout();
    next = plan.step + 1;
  }
}

absl::Status CardRunner::KeepSyncPoint(int64_t step) {
  sync_points_.erase(sync_points_.lower_bound(step), sync_points_.end());
  while (sync_points_.size() > 1) sync_points_.erase(sync_points_.begin());
  FUSIONRL_ASSIGN_OR_RETURN(
      StepSnapshot kept,
      StepSnapshot::Take(*ctx_.policy, *trainer_, /*on_host=*/true));
  sync_points_.emplace(step, std::move(kept));
  return absl::OkStatus();
}

absl::Status CardRunner::SavePrefetch(int64_t step) {
  if (fused_ == nullptr) return absl::OkStatus();
  Doing(absl::StrCat("keeping the rollout sampled ahead of step ", step));
  FUSIONRL_ASSIGN_OR_RETURN(std::optional<RolloutPrefetch> pending,
                            fused_->Pending(step, trainer_->version()));
  if (!pending) return absl::OkStatus();
  pending->checkpoint_step = step;
  pending->weights_crc32c = WeightsCrc32c(*ctx_.policy);
  return WriteRolloutPrefetch(
      RolloutPrefetchPath(config().output_dir + "/checkpoints", step,
                          pending->rank),
      *pending);
}

void CardRunner::SaveEndPrefetch(int64_t step) {
  if (end_prefetch_saved_) return;
  end_prefetch_saved_ = true;
  if (absl::Status s = SavePrefetch(step); !s.ok()) {
    spdlog::warn("{} card {}: {}; a resume samples the steps after {} afresh",
                 job_.node_id, job_.local_rank, s.ToString(), step);
  }
}

void CardRunner::RestorePrefetch(const StepPlan& plan) {
  const JobConfig& cfg = config();
  if (cfg.stalesync.rollout_version != RolloutVersion::kLagged) return;
  const std::string path = RolloutPrefetchPath(
      std::filesystem::path(job_.resume_checkpoint).parent_path().string(),
      resumed_step_, plan.rank);
  absl::StatusOr<RolloutPrefetch> saved = ReadRolloutPrefetch(path);
  std::string why;
  if (!saved.ok()) {
    why = std::string(saved.status().message());
  } else if (saved->checkpoint_step != resumed_step_ ||
             saved->rank != plan.rank ||
             saved->weights_crc32c != resumed_crc32c_) {
    why = absl::StrCat(path, " is not this checkpoint's (step ",
                       saved->checkpoint_step, ", rank ", saved->rank,
                       ", weights CRC ", saved->weights_crc32c, ")");
  } else if (saved->max_policy_lag != cfg.stalesync.max_policy_lag ||
             saved->prompts_per_step != cfg.rollout.prompts_per_step ||
             saved->partial_rollout_tokens !=
                 cfg.stalesync.partial_rollout_tokens) {
    why = absl::StrCat(path, " was sampled with max_policy_lag ",
                       saved->max_policy_lag, ", prompts_per_step ",
                       saved->prompts_per_step, " and partial_rollout_tokens ",
                       saved->partial_rollout_tokens);
  }
  if (!why.empty()) {
    spdlog::warn(
        "{} card {}: sampling the steps after {} afresh from the "
        "checkpoint's weights ({}): every prompt group is still trained "
        "once, but from other policy versions than an uninterrupted run",
        job_.node_id, job_.local_rank, resumed_step_, why);
    return;
  }
  spdlog::info(
      "{} card {}: continuing the rollout pipeline of step {} ({} "
      "batch(es) sampled ahead)",
      job_.node_id, job_.local_rank, resumed_step_, saved->batches.size());
  fused_->Restore(*std::move(saved));
}

absl::Status CardRunner::EnterSkewedStep(const StepPlan& plan) {
  if (sync_points_.empty()) {
    // Every super node starts from the same weights: the first sync point.
    FUSIONRL_RETURN_IF_ERROR(KeepSyncPoint(plan.step - 1));
  }
  const bool rolled_back =
      plan.rollback_to_step >= 0 && plan.attempt != skewed_attempt_;
  skewed_attempt_ = plan.attempt;
  if (!rolled_back) return absl::OkStatus();
  auto it = sync_points_.find(plan.rollback_to_step);
  if (it == sync_points_.end()) {
    std::string kept;
    for (const auto& [step, point] : sync_points_) {
      absl::StrAppend(&kept, kept.empty() ? "" : ", ", step);
    }
    return absl::InternalError(
        absl::StrCat("StaleSync roll-back to the weight sync of step ",
                     plan.rollback_to_step, ": this card kept those of steps ",
                     kept, " only"));
  }
  if (job_.local_rank == 0) {
    spdlog::warn("{}: rolling back to the weight sync of step {} (attempt {})",
                 job_.node_id, plan.rollback_to_step, plan.attempt);
  }
  FUSIONRL_RETURN_IF_ERROR(it->second.Restore(*ctx_.policy, *trainer_));
  sync_points_.erase(std::next(it), sync_points_.end());
  if (fused_ != nullptr) {
    // Sample the steps again from the restored weights.
    PublishToRollout();
    fused_->Reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CardRunner::SyncWeights(const StepPlan& plan) {
  if (plan.nodes <= 1) return 0;  // one super node left: nothing to sync
  if (plan.c10d_data_plane) {
    // Broadcast over the nodes' group: no weight goes through the
    // controller.
    std::string blob;
    if (plan.rank == 0) {
      FUSIONRL_ASSIGN_OR_RETURN(blob, SerializeState(*ctx_.policy, *trainer_));
    }
    FUSIONRL_RETURN_IF_ERROR(sync_->BroadcastFromLead(blob));
    if (plan.node_rank != 0) {
      FUSIONRL_RETURN_IF_ERROR(AdoptState(blob, *ctx_.policy, *trainer_));
    }
    return static_cast<int64_t>(blob.size());  // 0 on the lead's other cards
  }
  const std::string key = absl::StrCat(job_.job_id, "/sync");
  // A controller that went away took the weights it held: a restarted one
  // rolls the job back to its last weight sync, so the step is aborted
  // (the next plan restores that sync) rather than the job failed.
  auto lost = [&](const absl::Status& s) {
    return absl::Status(
        absl::IsUnavailable(s) ? absl::StatusCode::kAborted : s.code(),
        absl::StrCat("weight sync after step ", plan.step, ": ", s.message()));
  };
  if (plan.rank == 0) {
    FUSIONRL_ASSIGN_OR_RETURN(std::string blob,
                              SerializeState(*ctx_.policy, *trainer_));
    if (absl::Status s = job_.client->PublishWeights(
            key, plan.step, job_.super_node, blob, timeout_);
        !s.ok()) {
      return lost(s);
    }
    return static_cast<int64_t>(blob.size());
  }
  if (plan.rank < job_.local_cards) {
    return 0;  // the lead's node: identical to the lead card already
  }
  // The lead publishes after its own last exchange round, which waited for
  // ours: poll briefly until it is there.
  const absl::Time deadline = clock_.Now() + timeout_;
  for (;;) {
    absl::StatusOr<std::string> blob =
        job_.client->FetchWeights(key, plan.step, timeout_);
    if (blob.ok()) {
      FUSIONRL_RETURN_IF_ERROR(AdoptState(*blob, *ctx_.policy, *trainer_));
      return static_cast<int64_t>(blob->size());
    }
    if (!absl::IsNotFound(blob.status()) || clock_.Now() >= deadline) {
      return lost(blob.status());
    }
    SleepOnClock(clock_, absl::Milliseconds(20), absl::Milliseconds(20));
  }
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
    FUSIONRL_ASSIGN_OR_RETURN(back,
                              m.WaitOptimizerRestore(clock_.Now() + timeout_));
  }
  if (back > 0) {
    FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, device));
    m.OptimizerRestored(OptimizerStateBytes(*trainer_));
  }
  // On a CPU card a state left "on the host" is the same memory: step on.
  return absl::OkStatus();
}

absl::Status CardRunner::TrainStep(const StepPlan& plan, StepReport& report) {
  const JobConfig& cfg = config();
  const auto& rc = cfg.rollout;
  PolicyModel& policy = *ctx_.policy;
  const bool lead = plan.rank == 0;
  if (lead && plan.eval_before) {
    Doing("evaluation before step 1");
    FUSIONRL_ASSIGN_OR_RETURN(EvalResult initial,
                              EvaluateGreedy(policy, ctx_, rc.max_new_tokens));
    spdlog::info("[{}] initial eval accuracy {:.3f} ({:.1f}s)", cfg.name,
                 initial.accuracy, initial.seconds);
    report.initial_eval_accuracy = initial.accuracy;
  }
  const auto t0 = SteadyClock::now();
  job_.counters->active = true;
  RolloutBatch batch;
  double wait_s = 0;
  int64_t thread_samples = 0;  // sampled by the rollout thread
  if (fused_ != nullptr) {
    if (resumed_step_ >= 0) {
      RestorePrefetch(plan);
      resumed_step_ = -1;
    }
    Doing(absl::StrCat("waiting for the rollout of step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(batch, fused_->Take(plan));
    wait_s = SecondsSince(t0);
    thread_samples = static_cast<int64_t>(batch.samples.size());
  } else {
    Doing(absl::StrCat("rollout of step ", plan.step, " (", plan.groups.size(),
                       " prompt groups)"));
    FUSIONRL_ASSIGN_OR_RETURN(batch, SampleHere(plan.groups, plan));
  }
  std::vector<Sample>& samples = batch.samples;
  const int64_t max_lag = cfg.stalesync.max_policy_lag;
  const StalenessFilter filter(max_lag);
  FUSIONRL_ASSIGN_OR_RETURN(
      std::vector<uint64_t> stale_groups,
      filter.OverStaleGroups(samples, trainer_->version()));
  int64_t over_stale = 0;
  if (!stale_groups.empty()) {
    over_stale = static_cast<int64_t>(stale_groups.size()) * rc.group_size;
    spdlog::warn(
        "{} card {}: step {}: {} prompt group(s) over the policy lag "
        "{}; {}",
        job_.node_id, job_.local_rank, plan.step, stale_groups.size(), max_lag,
        OverStalePolicyName(cfg.stalesync.over_stale));
    if (fused_ != nullptr) thread_samples -= over_stale;
    if (cfg.stalesync.over_stale == OverStalePolicy::kDrop) {
      StalenessFilter::Drop(samples, stale_groups);
    } else {
      FUSIONRL_ASSIGN_OR_RETURN(RolloutBatch fresh,
                                SampleHere(stale_groups, plan));
      StalenessFilter::Replace(samples, stale_groups, std::move(fresh.samples));
      // Recount the batch's totals over what is trained.
      batch.Recount();
    }
  }
  const double rollout_s = batch.seconds;
  int64_t step_tokens = batch.tokens;
  const int64_t max_staleness =
      StalenessFilter::MaxStaleness(samples, trainer_->version());
  FUSIONRL_RETURN_IF_ERROR(PrepareOptimizer());
  const auto t1 = SteadyClock::now();
  TrainStats ts;
  Doing(absl::StrCat("training step ", plan.step));
  {
    // Activations: the bytes the step allocates and holds at its peak.
    ScopedAllocationCounter counted(ctx_.policy->device());
    if (turns_ != nullptr) {
      FUSIONRL_RETURN_IF_ERROR(turns_->TrainerEnter(clock_.Now() + timeout_));
    }
    overlap_.Begin(RoleOverlap::Role::kTrainer);
    absl::StatusOr<TrainStats> stepped = trainer_->Step(samples);
    overlap_.End(RoleOverlap::Role::kTrainer);
    if (turns_ != nullptr) turns_->TrainerExit();
    FUSIONRL_ASSIGN_OR_RETURN(ts, std::move(stepped));
    memory_->Set(MemoryCategory::kActivations, counted.peak_bytes());
  }
  memory_->Set(MemoryCategory::kGradients, GradientBytes(policy));
  if (!memory_->optimizer_offloaded()) {
    memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  }
  const double train_s = SecondsSince(t1);
  std::vector<double> totals = {
      batch.reward_sum, static_cast<double>(batch.correct),
      static_cast<double>(batch.finished), static_cast<double>(step_tokens),
      static_cast<double>(samples.size())};
  // What this card trained, seen from the card (the controller's ledger
  // says what it planned): the prompt groups with a trained sample, as
  // count, sum and sum of squares of their ids, so a test can check over a
  // run that every group was trained exactly once; and the samples the
  // rollout thread sampled (0 unless fused or disaggregated).
  std::set<uint64_t> trained_groups;
  for (const Sample& smp : samples) {
    if (!smp.excluded) trained_groups.insert(smp.group_id);
  }
  const size_t groups_at = totals.size();
  totals.resize(groups_at + 4, 0.0);
  for (uint64_t g : trained_groups) {
    totals[groups_at] += 1;
    totals[groups_at + 1] += static_cast<double>(g);
    totals[groups_at + 2] += static_cast<double>(g) * static_cast<double>(g);
  }
  totals[groups_at + 3] =
      fused_ != nullptr ? static_cast<double>(thread_samples) : 0.0;
  // Staleness histogram: samples with staleness 0..s (summed over cards).
  const int lag = cfg.stalesync.max_policy_lag;
  const size_t hist_at = totals.size();
  totals.resize(hist_at + lag + 1, 0.0);
  for (const Sample& smp : samples) {
    if (smp.excluded) continue;
    totals[hist_at + (trainer_->version() - 1 - smp.behaviour_version)] += 1;
  }
  // Partial rollout: trained samples whose response spans several
  // versions (continued under newer weights), and their tokens sampled by
  // a newer version than the sample's oldest.
  const size_t partial_at = totals.size();
  totals.resize(partial_at + 2, 0.0);
  for (const Sample& smp : samples) {
    if (smp.excluded || smp.token_versions.empty()) continue;
    totals[partial_at] += 1;
    for (int64_t v : smp.token_versions) {
      totals[partial_at + 1] += v != smp.behaviour_version;
    }
  }
  totals.push_back(static_cast<double>(over_stale));
  const bool checkpoint = !plan.checkpoint_name.empty();
  if (checkpoint && !plan.exchange_updates) {
    // Before the step's sum: every card's file is on disk before the lead
    // writes the checkpoint.
    FUSIONRL_RETURN_IF_ERROR(SavePrefetch(plan.step));
  }
  FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_.get(), totals));
  double sync_s = 0;
  int64_t sync_bytes = 0;
  if (plan.sync_weights) {
    const auto ts0 = SteadyClock::now();
    Doing(absl::StrCat("weight sync after step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(sync_bytes, SyncWeights(plan));
    sync_s = SecondsSince(ts0);
  }
  if (checkpoint && plan.exchange_updates) {
    // Across super nodes the checkpoint holds the synced weights.
    FUSIONRL_RETURN_IF_ERROR(SavePrefetch(plan.step));
  }
  if (plan.exchange_updates && job_.local_rank == 0) {
    // Each super node reports its own tokens; the controller adds them up.
    report.rollout_tokens = static_cast<int64_t>(totals[3]);
    report.has_trained_groups = true;
    report.trained_groups = totals[groups_at];
    report.trained_group_id_sum = totals[groups_at + 1];
    report.trained_group_id_sq_sum = totals[groups_at + 2];
    if (plan.sync_weights) {
      report.weights_crc32c = WeightsCrc32c(policy);
      report.has_weights_crc32c = true;
    }
  }
  const double step_s = SecondsSince(t0);
  // The mode this step ran in; the next step's may differ.
  const bool interleaved = turns_ != nullptr && turns_->interleaved();
  if (turns_ != nullptr) turns_->StepDone(step_s, step_tokens);
  job_.counters->busy_us += static_cast<int64_t>(step_s * 1e6);
  // Since the previous step's record (the first one holds the setup).
  const RoleSplit split = overlap_.Take();
  if (!lead) return absl::OkStatus();

  step_tokens = static_cast<int64_t>(totals[3]);
  const double n = totals[4];
  const double reward_mean = totals[0] / n;
  MetricFields rec = {
      {"step", static_cast<double>(plan.step)},
      {"policy_version", static_cast<double>(trainer_->version())},
      {"reward_mean", reward_mean},
      {"train_accuracy", totals[1] / n},
      {"response_len_mean", step_tokens / n},
      {"finished_frac", totals[2] / n},
      {"loss", ts.loss},
      {"pg_loss", ts.pg_loss},
      {"kl", ts.kl},
      {"entropy", ts.entropy},
      {"clip_frac", ts.clip_frac},
      {"grad_norm", ts.grad_norm},
      {"lr", ts.lr},
      {"advantage_abs_mean", ts.advantage_abs_mean},
      {"behaviour_weight_mean", ts.behaviour_weight_mean},
      {"behaviour_weight_truncated", ts.behaviour_weight_truncated},
      {"max_staleness", static_cast<double>(max_staleness)},
      {"over_stale_samples", totals.back()},
      {"partial_rollout_samples", totals[partial_at]},
      {"partial_rollout_newer_tokens", totals[partial_at + 1]},
      {"rollout_tokens", static_cast<double>(step_tokens)},
      {"rollout_seconds", rollout_s},
      {"rollout_wait_seconds", wait_s},
      {"train_seconds", train_s},
      {"step_seconds", step_s},
      {"card_turns_interleaved", interleaved ? 1.0 : 0.0},
      {"cards", static_cast<double>(plan.world_size)},
      {"nodes", static_cast<double>(plan.nodes)},
      {"attempt", static_cast<double>(plan.attempt)},
      {"cross_node_rounds", static_cast<double>(sync_->rounds())},
      {"cross_node_seconds", sync_->cross_node_seconds()},
      {"cross_node_bytes", static_cast<double>(sync_->cross_node_bytes())},
      {"rollout_gate_wait_seconds", batch.gate_wait_seconds},
      {"card_idle_seconds", split.idle},
      {"card_trainer_only_seconds", split.trainer_only},
      {"card_rollout_only_seconds", split.rollout_only},
      {"card_both_seconds", split.both},
      {"updates_received", static_cast<double>(sync_->updates_received())},
      {"max_update_lag", static_cast<double>(sync_->max_update_lag())},
      {"weight_sync_seconds", sync_s},
      {"weight_sync_bytes", static_cast<double>(sync_bytes)},
      {"trained_groups", totals[groups_at]},
      {"trained_group_id_sum", totals[groups_at + 1]},
      {"trained_group_id_sq_sum", totals[groups_at + 2]},
      {"rollout_thread_samples", totals[groups_at + 3]},
      {"rollout_snapshot_updates",
       fused_ != nullptr ? static_cast<double>(fused_->snapshot_updates())
                         : 0.0}};
  for (int i = 0; i <= lag; ++i) {
    rec.push_back({absl::StrCat("staleness_", i), totals[hist_at + i]});
  }
  if (cfg.model.moe_experts > 0) {
    // The lead card's own router statistics (like the other trainer stats).
    rec.push_back({"moe_aux_loss", ts.moe_aux_loss});
    rec.push_back({"moe_z_loss", ts.moe_z_loss});
    rec.push_back({"moe_dropped_frac", ts.moe_dropped_frac});
    for (size_t i = 0; i < ts.moe_expert_load.size(); ++i) {
      rec.push_back({absl::StrCat("moe_load_", i), ts.moe_expert_load[i]});
    }
  }
  if (plan.eval_after) {
    Doing(absl::StrCat("evaluation after step ", plan.step));
    FUSIONRL_ASSIGN_OR_RETURN(EvalResult ev,
                              EvaluateGreedy(policy, ctx_, rc.max_new_tokens));
    report.eval_accuracy = ev.accuracy;
    rec.push_back({"eval_accuracy", ev.accuracy});
    rec.push_back({"eval_seconds", ev.seconds});
  }
  if (!plan.checkpoint_name.empty()) {
    CheckpointMeta meta{"rl", cfg.name, plan.step, trainer_->version(),
                        plan.data_cursor_after};
    const std::string dir =
        cfg.output_dir + "/checkpoints/" + plan.checkpoint_name;
    Doing(absl::StrCat("writing checkpoint ", plan.checkpoint_name));
    FUSIONRL_RETURN_IF_ERROR(
        WriteCheckpoint(dir, policy, trainer_.get(), meta, CheckpointPause()));
    report.checkpoint_dir = dir;
  }
  report.metrics = std::move(rec);
  report.rollout_tokens = step_tokens;
  report.loop_seconds = step_s;
  report.reward_mean = reward_mean;
  report.train_accuracy = totals[1] / n;
  report.policy_version = trainer_->version();
  return absl::OkStatus();
}

absl::Status CardRunner::WriteEndCheckpoint(const StepPlan& plan,
                                            std::string* dir) {
  const JobConfig& cfg = config();
  CheckpointMeta meta{"rl", cfg.name, plan.step - 1, trainer_->version(),
                      plan.data_cursor_after};
  *dir = cfg.output_dir + "/checkpoints/" + plan.checkpoint_name;
  FUSIONRL_RETURN_IF_ERROR(WriteCheckpoint(*dir, *ctx_.policy, trainer_.get(),
                                           meta, CheckpointPause()));
  // A job that ran to its end (not one stopped early) is exported.
  if (cfg.run.export_final && plan.checkpoint_name == "final") {
    FUSIONRL_RETURN_IF_ERROR(
        ExportJobPolicy(cfg, ctx_, *ctx_.policy, cfg.output_dir + "/hf"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCard(const CardJob& job) {
  CardRunner runner(job);
  return runner.Run();
}

}  // namespace fusionrl
