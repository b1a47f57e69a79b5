// The synchronous step protocol: an attempt is planned over the live nodes
// (prompt groups from the ledger), each card asks for its plan, the nodes
// meet at the end-of-step barrier, and the step commits (totals, the
// metrics record, the next step or the job's end).
#include <algorithm>
#include <climits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

void JobManager::PlanStepLocked(Job& job, int64_t step) {
  std::unique_ptr<Attempt> a = MakeAttemptLocked(job, step);
  if (a == nullptr) return;
  // The data plane's group lives as long as its nodes and their attempts
  // do: a new generation (and a closed old one) whenever the nodes change
  // or the previous attempt was aborted.
  const Attempt* prev = job.current.get();
  if (prev != nullptr && !prev->aborted && prev->members == a->members &&
      job.rendezvous_generation > 0) {
    a->generation = job.rendezvous_generation;
  } else {
    if (job.rendezvous_generation > 0) {
      rendezvous_.CloseScope(RendezvousScope(job, job.rendezvous_generation));
    }
    a->generation = ++job.rendezvous_generation;
  }
  if (prev == nullptr || prev->step != step) job.data_plane_aborts = 0;
  job.current = std::move(a);
  ++job.update;
  changed_.SignalAll();
}

std::string JobManager::RendezvousScope(const Job& job, int64_t generation) {
  return absl::StrCat(job.id, "/", generation);
}

std::string JobManager::JobRendezvousScope(const Job& job) {
  return absl::StrCat(job.id, "/job");
}

void JobManager::AbortAttemptLocked(Job& job, int64_t step, int attempt,
                                    const std::string& node_id,
                                    const std::string& why) {
  Attempt* a = job.current.get();
  if (job.skew != nullptr) {
    // A failed collective of a skewed job loses the sums in flight: every
    // node goes back to the last weight sync (unless that already happened
    // for this attempt).
    if (!job.ending && attempt == job.skew->attempt()) {
      RollBackSkewedLocked(
          job, absl::StrCat("step ", step, " on ", node_id, ": ", why));
    }
    return;
  }
  if (job.ending || a == nullptr || a->step != step || a->attempt != attempt ||
      a->aborted || a->committed) {
    return;  // already replanned (or nothing to replan)
  }
  a->aborted = true;
  ++job.data_plane_aborts;
  if (job.data_plane_aborts > kMaxDataPlaneAborts) {
    FailLocked(
        job,
        absl::StrCat("step ", step, ": the data plane failed ",
                     job.data_plane_aborts, " attempts in a row; last, on ",
                     node_id, ": ", why),
        static_cast<int>(absl::StatusCode::kUnavailable));
    return;
  }
  EventLocked(job,
              absl::StrCat("step ", step, " attempt ", attempt, " aborted by ",
                           node_id, " (", why, "); replanning"));
  PlanStepLocked(job, step);
  changed_.SignalAll();
}

std::unique_ptr<JobManager::Attempt> JobManager::MakeAttemptLocked(
    Job& job, int64_t step) {
  const int prompts = job.config.rollout.prompts_per_step;
  auto a = std::make_unique<Attempt>();
  a->step = step;
  if (job.skew != nullptr) {
    a->attempt = job.skew->attempt();  // one attempt per step and epoch
  } else {
    a->attempt = (job.current && job.current->step == step)
                     ? job.current->attempt + 1
                     : 1;
  }
  int cards = 0;
  for (size_t i = 0; i < job.parts.size(); ++i) {
    if (job.parts[i].lost) continue;
    a->members.push_back(static_cast<int>(i));
    cards += job.parts[i].train_cards();
  }
  if (cards == 0) {
    FailLocked(job,
               absl::StrCat("no node left to run step ", step,
                            "; resubmit with resume to continue from the last "
                            "checkpoint"),
               static_cast<int>(absl::StatusCode::kUnavailable));
    return nullptr;
  }
  if (prompts % cards != 0) {
    FailLocked(job,
               absl::StrCat("step ", step, ": ", prompts,
                            " prompt groups cannot be split evenly over "
                            "the ",
                            cards,
                            " cards left; resubmit with resume to "
                            "continue from the last checkpoint"),
               static_cast<int>(absl::StatusCode::kFailedPrecondition));
    return nullptr;
  }
  const int per_card = prompts / cards;
  int rank = 0;
  for (int m : a->members) {
    const Job::Part& part = job.parts[m];
    const int want = per_card * part.train_cards();
    std::vector<uint64_t> held;
    if (job.current && job.current->step == step) {
      // Keep the groups this node already holds for the step.
      const int k = job.current->Member(m);
      if (k >= 0) held = job.current->groups[k];
    }
    std::vector<uint64_t> extra =
        job.ledger->Assign(part.node_id, want - static_cast<int>(held.size()));
    held.insert(held.end(), extra.begin(), extra.end());
    std::sort(held.begin(), held.end());
    a->first_rank.push_back(rank);
    rank += part.train_cards();
    a->groups.push_back(std::move(held));
  }
  a->world = cards;
  a->finished.assign(a->members.size(), false);
  a->reports.resize(a->members.size());
  return a;
}

StepPlan JobManager::TrainPlanLocked(const Job& job, const Attempt& a, int k,
                                     int local_rank) const {
  const int cards = job.parts[a.members[k]].train_cards();
  const int per_card = static_cast<int>(a.groups[k].size()) / cards;
  StepPlan plan;
  plan.kind = PlanKind::kTrain;
  plan.step = a.step;
  plan.attempt = a.attempt;
  plan.rank = a.first_rank[k] + local_rank;
  plan.world_size = a.world;
  plan.nodes = static_cast<int>(a.members.size());
  plan.c10d_data_plane = job.config.run.data_plane == DataPlane::kC10d;
  plan.rendezvous_generation = a.generation;
  plan.node_rank = k;
  for (int g = 0; g < per_card; ++g) {
    plan.groups.push_back(job.base_cursor +
                          a.groups[k][local_rank * per_card + g]);
  }
  const RunConfig& run = job.config.run;
  const bool checkpoint = run.checkpoint_every > 0 &&
                          a.step % run.checkpoint_every == 0 &&
                          a.step != run.total_steps;
  // The lead evaluates; with expert shards sampling in lockstep
  // (placement.expert_sampling shard) its expert group's cards join it.
  const bool lead_group =
      plan.rank == 0 ||
      (job.config.placement.expert_sampling == ExpertSampling::kShard &&
       plan.rank < job.config.placement.expert_parallel);
  if (lead_group) {
    plan.eval_before = a.step == job.first_step && job.resume_dir.empty();
    plan.eval_after = (run.eval_every > 0 && a.step % run.eval_every == 0) ||
                      a.step == run.total_steps;
  }
  // Every card: the lead writes the checkpoint, each fused or disaggregated
  // card what it sampled ahead (worker/step/rollout_prefetch.h).
  if (checkpoint) plan.checkpoint_name = absl::StrCat("step_", a.step);
  if (job.skew != nullptr) {
    // Checkpoints and the last step are taken from one set of weights.
    const bool sync = IsSyncStep(job, a.step);
    plan.exchange_updates = true;
    plan.rollback_to_step = job.skew->rollback_step;
    plan.sync_weights = sync;
    plan.updates_due_step =
        sync ? a.step : a.step - job.config.stalesync.max_clock_skew;
  }
  plan.data_cursor_after =
      job.base_cursor + static_cast<uint64_t>(a.step - job.first_step + 1) *
                            job.config.rollout.prompts_per_step;
  return plan;
}

StepPlan JobManager::EndPlanLocked(const Job& job, int index,
                                   int local_rank) const {
  StepPlan plan;
  plan.kind = PlanKind::kEnd;
  plan.step = job.last_committed + 1;
  // The lead is the first card of the first live node.
  int lead = -1;
  for (size_t i = 0; i < job.parts.size() && lead < 0; ++i) {
    if (!job.parts[i].lost) lead = static_cast<int>(i);
  }
  // Every card learns the checkpoint's name (an expert shard of another
  // node writes its part of it); the lead, rank 0, writes it.
  plan.checkpoint_name = job.end_checkpoint;
  plan.rank = index == lead && local_rank == 0 ? 0 : 1;
  plan.data_cursor_after =
      job.base_cursor +
      static_cast<uint64_t>(job.last_committed - job.first_step + 1) *
          job.config.rollout.prompts_per_step;
  return plan;
}

absl::StatusOr<std::optional<StepPlan>> JobManager::SyncPlanLocked(
    const Job& job, int index, int local_rank, int64_t want) const {
  const Attempt* a = job.current.get();
  if (a != nullptr && job.phase == JobPhase::kRunning && a->step == want &&
      !a->aborted) {
    const int k = a->Member(index);
    if (k >= 0) return TrainPlanLocked(job, *a, k, local_rank);
  }
  if (a != nullptr && want < a->step - 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", want, " is long over; ", job.id, " is at step ", a->step));
  }
  return std::nullopt;
}

absl::StatusOr<StepPlan> JobManager::GetStepPlan(const std::string& job_id,
                                                 const std::string& node_id,
                                                 int local_rank, int64_t step,
                                                 absl::Duration wait) {
  FUSIONRL_RETURN_IF_ERROR(CheckPollWait(wait));
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be >= 0, got ", step));
  }
  const absl::Time deadline = clock_.Now() + wait;
  FlushOnExit flush(*this);  // planning a skewed step may fail the job
  absl::MutexLock lock(&mu_);
  for (;;) {
    FUSIONRL_ASSIGN_OR_RETURN(Job * job, JobForNodeLocked(job_id, node_id));
    const int index = job->PartIndex(node_id);
    const int cards = job->parts[index].train_cards();
    if (local_rank < 0 || local_rank >= cards) {
      return absl::InvalidArgumentError(
          absl::StrCat("local_rank: must be in 0..", cards - 1, " for ",
                       node_id, " in ", job->id, ", got ", local_rank));
    }
    if (Terminal(*job)) {
      StepPlan plan;
      plan.kind = PlanKind::kAbandon;
      plan.message =
          absl::StrCat(job->id, " ended: ", JobPhaseText(job->end_phase), " ",
                       job->end_message);
      if (job->ending && job->end_phase != JobPhase::kFailed) {
        // It ended with its end checkpoint after this step: the cards keep
        // what they sampled ahead of it (worker/step/rollout_prefetch.h).
        plan.step = job->last_committed + 1;
        plan.checkpoint_name = job->end_checkpoint;
      }
      return plan;
    }
    if (job->ending) {
      StepPlan plan = EndPlanLocked(*job, index, local_rank);
      // Not the lead: wait for the end (or to become the lead, if the lead
      // is lost before it has written the last checkpoint).
      if (plan.rank != 0 && clock_.Now() < deadline) {
        WaitOnClock(changed_, mu_, clock_, deadline);
        continue;
      }
      return plan;
    }
    const int64_t want = step == 0 ? job->first_step : step;
    std::optional<StepPlan> plan;
    if (job->skew != nullptr && job->phase == JobPhase::kRunning) {
      FUSIONRL_ASSIGN_OR_RETURN(const Attempt* a,
                                SkewedAttemptLocked(*job, index, want));
      if (a != nullptr) {
        plan = TrainPlanLocked(*job, *a, a->Member(index), local_rank);
      }
    } else {
      FUSIONRL_ASSIGN_OR_RETURN(plan,
                                SyncPlanLocked(*job, index, local_rank, want));
    }
    if (plan.has_value()) return *std::move(plan);
    if (clock_.Now() >= deadline) {
      StepPlan wait_plan;
      wait_plan.kind = PlanKind::kWait;
      return wait_plan;
    }
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
}

absl::StatusOr<bool> JobManager::FinishStep(const StepReport& report,
                                            absl::Duration timeout) {
  return FinishStep(report, /*metrics_json=*/"", timeout);
}

absl::StatusOr<bool> JobManager::FinishStep(const StepReport& report,
                                            std::string metrics_json,
                                            absl::Duration timeout) {
  ReportedStep r;
  r.report = report;
  r.metrics_json = std::move(metrics_json);
  return FinishStepImpl(std::move(r), clock_.Now() + timeout);
}

absl::StatusOr<bool> JobManager::FinishStepImpl(ReportedStep r,
                                                absl::Time deadline) {
  FlushOnExit flush(*this);
  absl::MutexLock lock(&mu_);
  const std::string node_id = r.report.node_id;
  const int64_t step = r.report.step;
  const int attempt = r.report.attempt;
  FUSIONRL_ASSIGN_OR_RETURN(Job * job,
                            JobForNodeLocked(r.report.job_id, node_id));
  if (!r.report.error.ok()) {
    FailLocked(*job, absl::StrCat(node_id, ": ", r.report.error.message()),
               static_cast<int>(r.report.error.code()));
    return false;
  }
  if (Terminal(*job)) return false;
  if (!r.report.abort_reason.empty()) {
    AbortAttemptLocked(*job, step, attempt, node_id, r.report.abort_reason);
    return false;
  }
  deadline = std::min(
      deadline,
      clock_.Now() + absl::Seconds(job->config.run.collective_timeout_seconds));
  if (job->ending) {
    if (step != job->last_committed + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: the end of ", job->id, " is reported as step ",
                       job->last_committed + 1, ", got ", step));
    }
    if (!r.report.checkpoint_dir.empty()) {
      job->checkpoint_dir = r.report.checkpoint_dir;
      outputs_.SaveRunTotals(job->id, r.report.checkpoint_dir,
                             RunTotalsLocked(*job));
      AddHistoryLocked(*job, job->last_committed, "", -1,
                       r.report.checkpoint_dir);
    }
    FinishJobLocked(
        *job,
        job->stop_requested && job->last_committed < job->config.run.total_steps
            ? JobPhase::kCancelled
            : JobPhase::kSucceeded,
        job->stop_requested ? job->stop_reason : "");
    return true;
  }
  if (job->skew != nullptr) return FinishSkewedStepLocked(*job, r);
  if (step == job->last_committed && attempt == job->last_committed_attempt) {
    return true;  // a retried call (the answer was lost, or the controller
                  // restarted after committing)
  }
  Attempt* a = job->current.get();
  if (a == nullptr || a->step != step || a->attempt != attempt || a->aborted) {
    return false;  // not committed: restore and replan
  }
  const int k = a->Member(job->PartIndex(node_id));
  if (k < 0) return false;
  if (k == 0) {
    a->lead_report = std::move(r);
    a->have_lead_report = true;
  }
  a->finished[k] = true;
  if (std::all_of(a->finished.begin(), a->finished.end(),
                  [](bool b) { return b; })) {
    CommitLocked(*job);
    return true;
  }
  for (;;) {
    // Committed: the job has moved past this attempt without aborting it.
    if (job->last_committed >= step) return true;
    Attempt* cur = job->current.get();
    if (Terminal(*job) || cur == nullptr || cur->step != step ||
        cur->attempt != attempt || cur->aborted) {
      return false;
    }
    if (clock_.Now() >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < cur->finished.size(); ++i) {
        if (!cur->finished[i]) {
          missing.push_back(job->parts[cur->members[i]].node_id);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "end of step ", step, ": waited for ", absl::StrJoin(missing, ", ")));
    }
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
}

void JobManager::CommitLocked(Job& job) {
  Attempt& a = *job.current;
  a.committed = true;
  for (size_t k = 0; k < a.members.size(); ++k) {
    absl::Status s =
        job.ledger->MarkTrained(job.parts[a.members[k]].node_id, a.groups[k]);
    if (!s.ok()) {
      // The ledger and the attempt disagree: a bug, never data to train on.
      FailLocked(job,
                 absl::StrCat("internal: step ", a.step, ": ", s.message()),
                 static_cast<int>(absl::StatusCode::kInternal));
      return;
    }
  }
  job.last_committed = a.step;
  job.last_committed_attempt = a.attempt;
  job.progress_at = clock_.Now();
  if (a.have_lead_report) RecordStepLocked(job, a);
  if (job.skew != nullptr) {
    // What a roll-back to the last weight sync would undo.
    job.data_plane_aborts = 0;
    job.skew->RecordCommit(a, IsSyncStep(job, a.step),
                           job.summary.rollout_tokens, job.last_eval);
  }
  ++job.update;
  job.updated = clock_.Now();
  if (job.stop_flag != nullptr && job.stop_flag->load() &&
      !job.stop_requested) {
    job.stop_requested = true;
    job.stop_reason = "interrupted";
  }
  // A skewed job stops after the steps its nodes already started.
  const bool stop_now =
      job.stop_requested && (job.skew == nullptr || job.skew->ahead.empty());
  std::unique_ptr<Attempt> next;
  if (a.step >= job.config.run.total_steps || stop_now) {
    BeginEndLocked(job);
  } else if (job.skew != nullptr &&
             (next = job.skew->TakeAhead(a.step + 1)) != nullptr) {
    job.current = std::move(next);
    ++job.update;
  } else {
    PlanStepLocked(job, a.step + 1);
  }
  changed_.SignalAll();
}

void JobManager::AddHistoryLocked(Job& job, int64_t step,
                                  std::string metrics_json,
                                  double eval_accuracy,
                                  std::string checkpoint_dir) {
  if (metrics_json.empty() && eval_accuracy < 0 && checkpoint_dir.empty()) {
    return;
  }
  HistoryRecord& rec = job.history.emplace_back();
  rec.seq = ++job.history_seq;
  rec.step = step;
  rec.time = clock_.Now();
  rec.metrics_json = std::move(metrics_json);
  rec.eval_accuracy = eval_accuracy;
  rec.checkpoint_dir = std::move(checkpoint_dir);
  while (job.history.size() > kHistoryLimit) job.history.pop_front();
}

void JobManager::RecordStepLocked(Job& job, const Attempt& a) {
  const StepReport& r = a.lead_report.report;
  if (r.initial_eval_accuracy >= 0) {
    job.summary.initial_eval_accuracy = r.initial_eval_accuracy;
    job.last_eval = r.initial_eval_accuracy;
  }
  if (r.eval_accuracy >= 0) job.last_eval = r.eval_accuracy;
  if (job.skew != nullptr) {
    // Each super node reports its own tokens (no cross-node sums).
    for (const ReportedStep& m : a.reports) {
      job.summary.rollout_tokens += m.report.rollout_tokens;
    }
  } else {
    job.summary.rollout_tokens += r.rollout_tokens;
  }
  job.loop_seconds += r.loop_seconds;
  job.reward_mean = r.reward_mean;
  job.train_accuracy = r.train_accuracy;
  job.policy_version = r.policy_version;
  if (!r.checkpoint_dir.empty()) {
    job.checkpoint_dir = r.checkpoint_dir;
    outputs_.SaveRunTotals(job.id, r.checkpoint_dir, RunTotalsLocked(job));
  }
  if (r.initial_eval_accuracy >= 0) {
    AddHistoryLocked(job, 0, "", r.initial_eval_accuracy, "");
  }
  if (r.metrics.empty() && a.lead_report.metrics_json.empty()) {
    AddHistoryLocked(job, a.step, "", r.eval_accuracy, r.checkpoint_dir);
    return;
  }
  const double tps =
      job.loop_seconds > 0 ? job.summary.rollout_tokens / job.loop_seconds : 0;
  // The run-level fields of the record come from the controller's totals.
  MetricFields job_fields = {{"tokens_per_second", tps}};
  if (job.parts.size() > 1) {
    // What of the job's tensors went through this process so far (0 on
    // the c10d data plane, docs/cluster.md).
    job_fields.emplace_back("controller_tensor_bytes",
                            static_cast<double>(ControllerBytesLocked(job)));
  }
  if (job.skew != nullptr) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (const Job::Part& part : job.parts) {
      if (part.lost) continue;
      lo = std::min(lo, part.clock);
      hi = std::max(hi, part.clock);
    }
    job_fields.emplace_back("clock_skew", static_cast<double>(hi - lo));
    job_fields.emplace_back("max_clock_skew_seen",
                            static_cast<double>(job.skew->gate.MaxSkewSeen()));
    // Each super node commits on its own: the groups the step trained are
    // every super node's (the lead's metrics count its own only).
    double groups[3] = {0, 0, 0};
    bool all = !a.reports.empty();
    for (const ReportedStep& m : a.reports) {
      all = all && m.report.has_trained_groups;
      groups[0] += m.report.trained_groups;
      groups[1] += m.report.trained_group_id_sum;
      groups[2] += m.report.trained_group_id_sq_sum;
    }
    if (all) {
      job_fields.emplace_back("trained_groups", groups[0]);
      job_fields.emplace_back("trained_group_id_sum", groups[1]);
      job_fields.emplace_back("trained_group_id_sq_sum", groups[2]);
    }
  }
  // Formatted here, under the lock (no I/O); appended by the output queue
  // after the lock is released, in commit order.
  StepRecordLine line =
      FormatStepRecord(r.metrics, a.lead_report.metrics_json, job_fields);
  AddHistoryLocked(job, a.step, line.json, r.eval_accuracy, r.checkpoint_dir);
  if (!line.json.empty()) {
    job.last_metrics_json = line.json;
    outputs_.Append(job.id, std::move(line.json));
  }
  const int64_t total = job.config.run.total_steps;
  if (a.step % job.config.run.log_every == 0 || a.step == total ||
      r.eval_accuracy >= 0) {
    const double per_step =
        job.loop_seconds / std::max<int64_t>(1, a.step - job.first_step + 1);
    spdlog::info(
        "[{}] step {}/{} | reward {:.3f} | acc {:.3f} | eval {:.3f} | "
        "len {:.1f} | kl {:.4f} | {} tok/s | ETA {}",
        job.config.name, a.step, total, r.reward_mean, r.train_accuracy,
        job.last_eval, line.response_len_mean, line.kl, FormatCount(tps),
        FormatDuration(per_step * (total - a.step)));
  }
}

RunTotals JobManager::RunTotalsLocked(const Job& job) const {
  RunTotals t;
  t.initial_eval_accuracy = job.summary.initial_eval_accuracy;
  t.last_eval_accuracy = job.last_eval;
  t.rollout_tokens = job.summary.rollout_tokens;
  t.loop_seconds = job.loop_seconds;
  t.controller_tensor_bytes = ControllerBytesLocked(job);
  return t;
}

void JobManager::BeginEndLocked(Job& job) {
  job.ending = true;
  const bool early = job.last_committed < job.config.run.total_steps;
  job.end_checkpoint =
      early ? absl::StrCat("step_", job.last_committed) : std::string("final");
  if (early) {
    EventLocked(job,
                absl::StrCat("stopping after step ", job.last_committed, " (",
                             job.stop_reason, "); writing checkpoint ",
                             job.end_checkpoint));
  }
  ++job.update;
  changed_.SignalAll();
}

}  // namespace fusionrl
