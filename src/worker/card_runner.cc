#include "worker/card_runner.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/memory_manager.h"
#include "core/status_macros.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"
#include "engine/train/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner_impl.h"
#include "worker/fused_rollout.h"
#include "worker/hier_sync.h"
#include "worker/step/card_turns.h"
#include "worker/step/group_sampler.h"

namespace fusionrl {

CardRunner::CardRunner(const CardJob& job)
    : job_(job),
      clock_(*job.clock),
      timeout_(absl::Seconds(job.config->run.collective_timeout_seconds)),
      overlap_(*job.clock) {}

CardRunner::~CardRunner() {
  if (fused_ != nullptr) fused_->Stop();
}

void CardRunner::Doing(std::string what) {
  job_.counters->SetActivity(std::move(what));
}

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
  report.error = WithExpertGroupNote(job_, status);
  Finish(report).IgnoreError();
}

void CardRunner::PublishToRollout() {
  // Expert parallelism: the gathered model, refreshed after every step, or
  // the card's shard (expert_sampling shard).
  fused_->Publish(RolloutSource().trainable_parameters(), trainer_->version());
}

absl::Status CardRunner::Run() {
  FUSIONRL_RETURN_IF_ERROR(Setup());
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
      case PlanKind::kEnd:
        return OnEnd(std::move(plan));
      case PlanKind::kTrain: {
        FUSIONRL_ASSIGN_OR_RETURN(next, OnTrain(plan));
        break;
      }
      case PlanKind::kWait:
        return absl::InternalError("the rendezvous handed out a WAIT plan");
    }
  }
}

absl::Status CardRunner::OnEnd(StepPlan plan) {
  // Only card 0 goes on: it writes the last checkpoint if it is the job's
  // lead, or waits for the end (it may become the lead if the lead node is
  // lost first). Every card first keeps what its rollout sampled ahead, for
  // a resume from the end checkpoint.
  SaveEndPrefetch(plan.step - 1);
  // Every card has card 0's plan: on the lead's node (rank 0) the lead's
  // expert group writes its shards' optimizer states, which card 0 waits
  // for. A group spanning nodes knows its cards by their job rank (no node
  // was lost, or the job would have failed).
  if (job_.experts_span_nodes) {
    FUSIONRL_RETURN_IF_ERROR(
        SaveExpertShard(plan.checkpoint_name, job_.job_rank, plan.step - 1));
  } else if (plan.rank == 0) {
    FUSIONRL_RETURN_IF_ERROR(
        SaveExpertShard(plan.checkpoint_name, job_.local_rank, plan.step - 1));
  }
  if (job_.local_rank != 0) return absl::OkStatus();
  const int64_t next = plan.step;
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

absl::StatusOr<int64_t> CardRunner::OnTrain(const StepPlan& plan) {
  plan_step_ = plan.step;
  plan_attempt_ = plan.attempt;
  if (absl::Status same = CheckExpertWorld(plan); !same.ok()) {
    ReportFailure(same, plan.step, plan.attempt);
    return same;
  }
  FUSIONRL_RETURN_IF_ERROR(BeginStep(plan));
  // Only a synchronous step shared with other nodes can be aborted by a
  // node loss (a StaleSync job fails instead).
  std::optional<StepSnapshot> snapshot;
  if (plan.nodes > 1 && !plan.exchange_updates) {
    FUSIONRL_ASSIGN_OR_RETURN(snapshot,
                              StepSnapshot::Take(*ctx_.policy, *trainer_));
  }
  StepReport report = NewReport(plan.step, plan.attempt);
  absl::Status step = TrainStep(plan, report);
  if (step.ok() && job_.debug_step_delay > absl::ZeroDuration()) {
    SleepOnClock(clock_, job_.debug_step_delay);  // fault injection
  }
  if (plan.exchange_updates && absl::IsAborted(step)) {
    // A collective of the data plane failed, or the job rolled back or
    // ended under us: the controller rolls the job back to its last weight
    // sync (a no-op if it already did), and the next plan says where to go
    // on from.
    ReportAbort(plan, step);
    return plan.step + 1;
  }
  FUSIONRL_ASSIGN_OR_RETURN(const StepOutcome outcome,
                            NodeOutcome(plan, report, std::move(step)));
  if (plan.exchange_updates && outcome.status.ok()) {
    return AfterSkewedStep(plan, outcome.committed);
  }
  if (absl::IsAborted(outcome.status) ||
      (outcome.status.ok() && !outcome.committed)) {
    return RollBack(plan, snapshot, outcome.status);
  }
  if (!outcome.status.ok()) {
    ReportFailure(outcome.status, plan.step, plan.attempt);
    return outcome.status;
  }
  if (fused_ != nullptr) PublishToRollout();
  return plan.step + 1;
}

absl::Status CardRunner::CheckExpertWorld(const StepPlan& plan) {
  if (!job_.experts_span_nodes) return absl::OkStatus();
  if (expert_world_ == 0) expert_world_ = plan.world_size;
  if (plan.rank == job_.job_rank && plan.world_size == expert_world_) {
    return absl::OkStatus();
  }
  // A node left the job: an expert group spanning nodes has lost
  // experts no other card holds (or its members moved).
  return absl::FailedPreconditionError(absl::StrCat(
      "placement.expert_parallel: the job's cards changed (card ", plan.rank,
      " of ", plan.world_size, " now, card ", job_.job_rank, " of ",
      expert_world_, " when the expert group formed): a node was lost"));
}

absl::Status CardRunner::BeginStep(const StepPlan& plan) {
  std::optional<HierarchicalSync::DataPlane> data_plane;
  if (plan.c10d_data_plane && plan.nodes > 1) {
    data_plane =
        HierarchicalSync::DataPlane{plan.rendezvous_generation, plan.node_rank};
  }
  if (plan.exchange_updates) {
    FUSIONRL_RETURN_IF_ERROR(EnterSkewedStep(plan));
    sync_->BeginSkewedStep(plan.step, plan.updates_due_step, plan.nodes,
                           data_plane);
  } else {
    sync_->BeginAttempt(plan.rank, plan.world_size, plan.nodes, data_plane);
  }
  return absl::OkStatus();
}

void CardRunner::ReportAbort(const StepPlan& plan, const absl::Status& step) {
  if (job_.local_rank != 0) return;
  StepReport abort = NewReport(plan.step, plan.attempt);
  abort.abort_reason = std::string(step.message());
  Finish(abort).IgnoreError();
}

absl::StatusOr<CardRunner::StepOutcome> CardRunner::NodeOutcome(
    const StepPlan& plan, const StepReport& report, absl::Status step) {
  StepOutcome outcome;
  if (step.ok() && job_.local_rank == 0) {
    Doing(absl::StrCat("end of step ", plan.step,
                       ": waiting for the other nodes"));
    absl::StatusOr<bool> done = Finish(report);
    if (done.ok()) {
      outcome.committed = *done;
    } else {
      step = done.status();
    }
  }
  if (job_.local_cards > 1 && (step.ok() || absl::IsAborted(step))) {
    // Every card learns the node's outcome of the step.
    std::vector<double> flags = {outcome.committed ? 1.0 : 0.0,
                                 step.ok() ? 0.0 : 1.0};
    FUSIONRL_RETURN_IF_ERROR(sync_->LocalSum(flags));
    outcome.committed = flags[0] > 0;
    if (flags[1] > 0 && step.ok()) {
      step = absl::AbortedError("another card of this node was aborted");
    }
  }
  if (absl::IsAborted(step) && plan.c10d_data_plane) {
    // The data plane's failure is known on the nodes only: the controller
    // aborts and replans the attempt (a no-op if it already did).
    ReportAbort(plan, step);
  }
  outcome.status = std::move(step);
  return outcome;
}

absl::StatusOr<int64_t> CardRunner::AfterSkewedStep(const StepPlan& plan,
                                                    bool committed) {
  // Keep the sync whatever the answer: the controller commits it once
  // every node reported it and then may roll back to it, while this
  // answer can say "not committed" although it committed (a controller
  // killed before its answer left rolls back on restart, and answers the
  // retried report as one of an attempt it rolled back). A sync that
  // never committed is dropped by the roll-back to an older one.
  if (plan.sync_weights) {
    FUSIONRL_RETURN_IF_ERROR(KeepSyncPoint(plan.step));
  }
  // Not accepted: the job rolled back meanwhile, and the next plan
  // restores the last weight sync.
  if (fused_ != nullptr && committed) PublishToRollout();
  return plan.step + 1;
}

absl::StatusOr<int64_t> CardRunner::RollBack(
    const StepPlan& plan, std::optional<StepSnapshot>& snapshot,
    const absl::Status& step) {
  if (!snapshot) {
    return absl::InternalError(
        "a single-node step was aborted; nothing to roll back to");
  }
  spdlog::warn(
      "{} card {}: step {} attempt {} aborted ({}); rolling back", job_.node_id,
      job_.local_rank, plan.step, plan.attempt,
      step.ok() ? std::string("not committed") : std::string(step.message()));
  FUSIONRL_RETURN_IF_ERROR(snapshot->Restore(*ctx_.policy, *trainer_));
  FUSIONRL_RETURN_IF_ERROR(GatherExperts());
  if (fused_ != nullptr) {
    // Sample the replanned step afresh from the restored weights.
    PublishToRollout();
    fused_->Reset();
  }
  return plan.step;
}

absl::Status WithExpertGroupNote(const CardJob& job, absl::Status status) {
  constexpr absl::string_view kNote =
      " (this card's expert group spans worker processes, and a lost "
      "member's experts are on no other card: resubmit the job with --resume "
      "to continue from its last checkpoint)";
  if (!job.experts_span_nodes || status.ok() || absl::IsCancelled(status) ||
      absl::StrContains(status.message(), kNote)) {
    return status;
  }
  return absl::Status(status.code(), absl::StrCat(status.message(), kNote));
}

absl::Status RunCard(const CardJob& job) {
  CardRunner runner(job);
  return runner.Run();
}

}  // namespace fusionrl
