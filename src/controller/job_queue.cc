// The job queue and placement: submission, the queue in submission order,
// placement on free nodes, the start of a job and its end (the phase, the
// nodes released, the next queued job let in).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "controller/scheduler.h"
#include "core/checkpoint_meta.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

absl::StatusOr<std::string> JobManager::Submit(JobSubmission submission) {
  // Cheap, and a program's struct may have skipped ResolveJobConfig.
  FUSIONRL_RETURN_IF_ERROR(ValidateJobConfig(submission.config));
  JobConfig& config = submission.config;
  const std::string source = !config.source_path.empty() ? config.source_path
                             : !config.name.empty()      ? config.name
                                                         : "<submitted>";
  const PlacementConfig& p = config.placement;
  // Cards that train (disaggregated: the others only sample).
  const int cards =
      p.super_nodes * (p.cards_per_super_node - p.rollout_cards_per_super_node);
  if (config.rollout.prompts_per_step % cards != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": rollout.prompts_per_step: must be a multiple of the job's ",
        cards,
        " training cards (placement.super_nodes x (cards_per_super_node - "
        "rollout_cards_per_super_node)) so every card trains on the same "
        "number of prompt groups, got ",
        config.rollout.prompts_per_step));
  }
  std::optional<CheckpointMeta> resume_meta;
  absl::StatusOr<RunTotals> resume_totals = RunTotals();
  std::string resume_dir;
  std::vector<std::string> uncommitted;  // newer checkpoints, never committed
  if (submission.resume) {
    FUSIONRL_ASSIGN_OR_RETURN(
        resume_dir,
        FindLatestCheckpoint(config.output_dir + "/checkpoints",
                             /*committed_only=*/true, &uncommitted));
    FUSIONRL_ASSIGN_OR_RETURN(CheckpointMeta meta,
                              ReadCheckpointMeta(resume_dir));
    if (meta.kind != "rl") {
      return absl::FailedPreconditionError(
          absl::StrCat("resume: '", resume_dir, "' is a ", meta.kind,
                       " checkpoint, not an RL one"));
    }
    resume_meta = meta;
    resume_totals = ReadRunTotals(resume_dir);
    if (!resume_totals.ok()) return resume_totals.status();
  }
  FlushOnExit flush(*this);
  absl::MutexLock lock(&mu_);
  const uint64_t n = next_job_++;
  auto job = std::make_unique<Job>();
  job->id = absl::StrCat("job-", n);
  job->config = std::move(config);
  job->stop_flag = submission.stop_flag;
  job->config_yaml = JobConfigToYaml(job->config);
  job->submitted = job->updated = clock_.Now();
  job->summary.kind = "rl";
  job->summary.summary_path = job->config.output_dir + "/summary.json";
  if (resume_meta) {
    job->resume_dir = resume_dir;
    job->first_step = resume_meta->step + 1;
    job->base_cursor = resume_meta->data_cursor;
    job->summary.resumed_from_step = resume_meta->step;
    if (resume_totals.ok()) {
      job->summary.initial_eval_accuracy =
          std::max(0.0, resume_totals->initial_eval_accuracy);
      job->summary.rollout_tokens = resume_totals->rollout_tokens;
      job->last_eval = std::max(0.0, resume_totals->last_eval_accuracy);
      job->loop_seconds = resume_totals->loop_seconds;
      job->tensor_bytes = resume_totals->controller_tensor_bytes;
    }
    job->policy_version = resume_meta->policy_version;
    job->last_committed = resume_meta->step;
  }
  const int64_t steps =
      std::max<int64_t>(0, job->config.run.total_steps - job->first_step + 1);
  job->ledger = std::make_unique<GroupLedger>(
      static_cast<uint64_t>(steps) * job->config.rollout.prompts_per_step);
  Job& j = *job;
  jobs_[n] = std::move(job);
  EventLocked(
      j, absl::StrCat("submitted (", j.config.run.total_steps, " steps x ",
                      j.config.rollout.prompts_per_step, " prompt groups",
                      resume_meta ? ", resuming from " + resume_dir : "", ")"));
  if (!uncommitted.empty()) {
    EventLocked(
        j, absl::StrCat("resume: skipped ", absl::StrJoin(uncommitted, ", "),
                        ": written by a step that never committed"));
  }
  TryPlaceLocked(j);
  return j.id;
}

void JobManager::Schedule() {
  FlushOnExit flush(*this);
  absl::MutexLock lock(&mu_);
  for (auto& [n, job] : jobs_) {
    if (job->phase == JobPhase::kPending ||
        job->phase == JobPhase::kWaitingForCapacity) {
      TryPlaceLocked(*job);
    }
  }
}

void JobManager::TryPlaceLocked(Job& job) {
  // Jobs run in submission order: a later job waits while an earlier one
  // is still waiting (no starvation of big jobs by small ones).
  for (auto& [n, other] : jobs_) {
    if (other.get() == &job) break;
    if (other->phase == JobPhase::kPending ||
        other->phase == JobPhase::kWaitingForCapacity) {
      if (job.message.empty()) {
        job.phase = JobPhase::kPending;
        job.message = absl::StrCat("queued behind ", other->id);
        ++job.update;
      }
      return;
    }
  }
  // A node runs one job: every card of a busy node is busy.
  BusyCards busy;
  const std::vector<NodeView> nodes = registry_.List();
  for (const NodeView& node : nodes) {
    if (node_job_.count(node.id) == 0) continue;
    for (const CardSpec& c : node.spec.cards) busy.insert({node.id, c.index});
  }
  absl::StatusOr<Placement> placement =
      Place(job.config.placement, nodes, busy);
  if (!placement.ok()) {
    const std::string reason(placement.status().message());
    if (job.config.placement.fail_if_unplaceable) {
      FailLocked(job, absl::StrCat("cannot be placed: ", reason),
                 static_cast<int>(absl::StatusCode::kFailedPrecondition));
      return;
    }
    if (job.phase != JobPhase::kWaitingForCapacity || job.message != reason) {
      job.phase = JobPhase::kWaitingForCapacity;
      job.message = reason;
      EventLocked(job, absl::StrCat("waiting for capacity: ", reason));
    }
    return;
  }
  job.parts.clear();
  for (const SuperNodeAssignment& sn : placement->super_nodes) {
    for (const CardAssignment& card : sn.cards) {
      if (job.parts.empty() || job.parts.back().node_id != card.node_id) {
        Job::Part part;
        part.node_id = card.node_id;
        part.super_node = sn.super_node;
        job.parts.push_back(part);
      }
      job.parts.back().cards.push_back(card.card_index);
      if (card.role == CardRole::kRollout) ++job.parts.back().rollout_cards;
    }
  }
  for (const Job::Part& part : job.parts) {
    if (part.rollout_cards > 0 && part.train_cards() == 0) {
      // A super node spread over several workers: the rollout cards must
      // share a worker with the training cards they serve.
      FailLocked(job,
                 absl::StrCat("cannot be placed: disaggregated needs each "
                              "super node's cards on one worker; ",
                              part.node_id, " got only rollout cards"),
                 static_cast<int>(absl::StatusCode::kFailedPrecondition));
      return;
    }
  }
  for (const Job::Part& part : job.parts) node_job_[part.node_id] = job.id;
  EventLocked(job, absl::StrCat("placed: ", PlacementDebugString(*placement)));
  absl::Status started = StartLocked(job);
  if (!started.ok()) {
    FailLocked(job, std::string(started.message()),
               static_cast<int>(started.code()));
  }
}

absl::Status JobManager::StartLocked(Job& job) {
  job.phase = JobPhase::kRunning;
  job.message.clear();
  job.started = clock_.Now();
  job.progress_at = job.started;
  // The output files are written by the queue, after the lock is released
  // and before this call returns; a failure there fails the job
  // (ApplyOutputResultLocked).
  JobOutputs::OpenSpec outputs;
  outputs.output_dir = job.config.output_dir;
  outputs.config_yaml = job.config_yaml;
  if (!job.resume_dir.empty()) outputs.resume_after_step = job.first_step - 1;
  outputs.tensorboard = job.config.run.tensorboard;
  outputs_.Open(job.id, std::move(outputs));
  job.has_outputs = true;
  const int64_t k = job.config.stalesync.max_clock_skew;
  if (k > 0 && job.parts.size() > 1) {
    std::vector<std::string> names;
    for (Job::Part& part : job.parts) {
      names.push_back(part.node_id);
      part.clock = job.first_step - 1;
    }
    FUSIONRL_ASSIGN_OR_RETURN(
        job.skew, SkewedProtocol::Create(k, names, job.first_step - 1));
    // Every super node starts from the same weights: the first sync point.
    job.skew->tokens_at_sync = job.summary.rollout_tokens;
    job.skew->last_eval_at_sync = job.last_eval;
    const size_t n = job.parts.size();
    EventLocked(job, absl::StrCat("StaleSync across ", n,
                                  " super nodes: max_clock_skew ", k));
  }
  if (job.first_step > job.config.run.total_steps) {
    BeginEndLocked(job);
  } else {
    PlanStepLocked(job, job.first_step);
  }
  return absl::OkStatus();
}

absl::StatusOr<JobStatus> JobManager::Cancel(const std::string& job_id,
                                             const std::string& reason) {
  FlushOnExit flush(*this);
  absl::MutexLock lock(&mu_);
  Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  if (Terminal(*job)) {
    return absl::FailedPreconditionError(absl::StrCat(
        job_id, " already ended (", JobPhaseText(job->end_phase), ")"));
  }
  const std::string why = reason.empty() ? "cancelled" : reason;
  if (job->phase != JobPhase::kRunning) {
    // Not started: no outputs, so the end is published at once.
    FinishJobLocked(*job, JobPhase::kCancelled, why);
  } else if (!job->stop_requested) {
    job->stop_requested = true;
    job->stop_reason = why;
    EventLocked(*job, absl::StrCat("stop requested: ", why));
  }
  return StatusLocked(*job);
}

void JobManager::StopAll(const std::string& reason) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [n, job] : jobs_) {
      if (!Terminal(*job)) ids.push_back(job->id);
    }
  }
  for (const std::string& id : ids) Cancel(id, reason).IgnoreError();
}

bool JobManager::Idle() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [n, job] : jobs_) {
    if (!Settled(*job)) return false;
  }
  return true;
}

bool JobManager::WaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [n, job] : jobs_) {
      if (!Settled(*job)) return false;
    }
    return true;
  };
  while (!idle() && clock_.Now() < deadline) {
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
  return idle();
}

void JobManager::FinishJobLocked(Job& job, JobPhase phase,
                                 const std::string& message) {
  job.over = true;
  job.end_phase = phase;
  job.end_message = message;
  if (job.rendezvous_generation > 0) {
    // Wakes any card still in the data plane's rendezvous.
    rendezvous_.CloseScope(RendezvousScope(job, job.rendezvous_generation));
  }
  rendezvous_.CloseScope(JobRendezvousScope(job));
  for (const Job::Part& part : job.parts) {
    auto it = node_job_.find(part.node_id);
    if (it != node_job_.end() && it->second == job.id) node_job_.erase(it);
  }
  if (job.skew != nullptr) job.skew->End();
  if (job.has_outputs) {
    std::optional<JobSummary> summary;
    if (phase == JobPhase::kSucceeded || phase == JobPhase::kCancelled) {
      JobSummary& s = job.summary;
      s.final_eval_accuracy = job.last_eval;
      s.steps = job.last_committed;
      s.policy_version = job.policy_version;
      s.final_train_reward = job.reward_mean;
      s.checkpoint_dir = job.checkpoint_dir;
      s.interrupted = phase == JobPhase::kCancelled;
      s.tokens_per_second =
          job.loop_seconds > 0 ? s.rollout_tokens / job.loop_seconds : 0;
      s.wall_seconds = absl::ToDoubleSeconds(clock_.Now() - job.started);
      if (job.skew != nullptr) {
        s.max_clock_skew_seen = job.skew->gate.MaxSkewSeen();
        s.final_weights_crc32c = job.skew->weights_crc;
      }
      summary = s;
    }
    // Published when the Close has been performed: after every metrics line
    // queued before it, and summary.json, are on disk.
    outputs_.Close(job.id, std::move(summary));
  } else {
    PublishEndLocked(job, nullptr);
  }
  // Let the next queued job in.
  for (auto& [n, other] : jobs_) {
    if (other->phase == JobPhase::kPending ||
        other->phase == JobPhase::kWaitingForCapacity) {
      other->message.clear();
      TryPlaceLocked(*other);
      break;
    }
  }
}

void JobManager::PublishEndLocked(Job& job, const JobOutputs::Result* closed) {
  if (Settled(job)) return;
  const std::string message = job.end_message;
  job.phase = job.end_phase;
  job.message = job.end_message;
  if (closed != nullptr && job.end_phase != JobPhase::kFailed) {
    if (closed->wrote_summary) {
      job.summary_json = closed->summary_json;
      const JobSummary& s = job.summary;
      spdlog::info("[{}] done: eval accuracy {:.3f} -> {:.3f} in {} ({} tok/s)",
                   job.config.name, s.initial_eval_accuracy,
                   s.final_eval_accuracy, FormatDuration(s.wall_seconds),
                   FormatCount(s.tokens_per_second));
    } else if (!closed->status.ok()) {
      job.phase = JobPhase::kFailed;
      job.message = absl::StrCat("writing summary: ", closed->status.message());
      job.end_phase = job.phase;
      job.end_message = job.message;
    }
  }
  EventLocked(job, absl::StrCat(JobPhaseText(job.phase),
                                message.empty() ? "" : ": ", message));
}

void JobManager::FailLocked(Job& job, const std::string& message, int code) {
  if (Terminal(job)) return;
  job.error_code = code;
  if (job.current) job.current->aborted = true;
  spdlog::error("[{}] {} failed: {}", job.config.name, job.id, message);
  FinishJobLocked(job, JobPhase::kFailed, message);
}

}  // namespace fusionrl
