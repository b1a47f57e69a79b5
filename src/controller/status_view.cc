// The status views (job_view.h): a job as JobService shows it (phase,
// totals, nodes and their cards, events, the last metrics record,
// summary.json once done), the cluster, a job's step records.
#include <optional>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"

namespace fusionrl {

absl::StatusOr<JobStatus> JobManager::Status(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  return StatusLocked(*job);
}

std::vector<JobStatus> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobStatus> out;
  for (const auto& [n, job] : jobs_) out.push_back(StatusLocked(*job));
  return out;
}

absl::StatusOr<JobStatus> JobManager::WaitForUpdate(const std::string& job_id,
                                                    uint64_t seen_update,
                                                    absl::Time deadline,
                                                    uint64_t* update) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  while (job->update == seen_update && !Settled(*job) &&
         clock_.Now() < deadline) {
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
  *update = job->update;
  return StatusLocked(*job);
}

ClusterView JobManager::Cluster() const {
  ClusterView out;
  absl::MutexLock lock(&mu_);
  for (const NodeView& view : registry_.List()) {
    NodeStatus& n = out.nodes.emplace_back();
    n.node_id = view.id;
    n.host = view.spec.host;
    n.super_node = view.spec.super_node;
    n.state = std::string(NodeStateName(view.state));
    n.heartbeat_age = view.heartbeat_age;
    n.version = view.spec.version;
    if (auto job = node_job_.find(view.id); job != node_job_.end()) {
      const Job* j = FindLocked(job->second);
      if (j != nullptr && !Terminal(*j)) {
        n.job_id = j->id;
        if (j->skew != nullptr) {
          for (const Job::Part& part : j->parts) {
            if (part.node_id == view.id) n.clock = part.clock;
          }
        }
      }
    }
    n.card_specs = view.spec.cards;
    auto states = card_states_.find(view.id);
    for (const CardSpec& card : view.spec.cards) {
      CardReport state;
      state.index = card.index;
      state.role = CardRole::kIdle;
      if (states != card_states_.end() && view.state == NodeState::kAlive) {
        for (const CardReport& c : states->second) {
          if (c.index == card.index) state = c;
        }
      }
      n.cards.push_back(std::move(state));
    }
  }
  for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
    out.jobs.push_back(StatusLocked(*it->second));
  }
  return out;
}

absl::StatusOr<JobHistory> JobManager::History(const std::string& job_id,
                                               int64_t after_seq) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  JobHistory out;
  out.first_seq =
      job->history.empty() ? job->history_seq + 1 : job->history.front().seq;
  for (const HistoryRecord& r : job->history) {
    if (r.seq > after_seq) out.records.push_back(r);
  }
  return out;
}

JobStatus JobManager::StatusLocked(const Job& job) const {
  JobStatus s;
  s.job_id = job.id;
  s.name = job.config.name;
  s.phase = job.phase;
  s.message = job.message;
  s.step = job.last_committed;
  s.total_steps = job.config.run.total_steps;
  s.policy_version = job.policy_version;
  s.reward_mean = job.reward_mean;
  s.train_accuracy = job.train_accuracy;
  s.initial_eval_accuracy = job.summary.initial_eval_accuracy;
  s.eval_accuracy = job.last_eval;
  s.rollout_tokens = job.summary.rollout_tokens;
  s.tokens_per_second =
      job.loop_seconds > 0 ? job.summary.rollout_tokens / job.loop_seconds : 0;
  s.groups_submitted = static_cast<int64_t>(job.ledger->total());
  s.groups_trained = static_cast<int64_t>(job.ledger->trained());
  s.groups_requeued = static_cast<int64_t>(job.ledger->requeued_total());
  s.submitted_at = job.submitted;
  s.updated_at = job.updated;
  for (const Job::Part& part : job.parts) {
    std::optional<NodeView> view = registry_.Get(part.node_id);
    NodeStatus& n = s.nodes.emplace_back();
    n.node_id = part.node_id;
    n.super_node = part.super_node;
    if (view) {
      n.host = view->spec.host;
      n.heartbeat_age = view->heartbeat_age;
    }
    n.state = part.lost ? "lost" : (view ? "alive" : "gone");
    if (job.skew != nullptr) n.clock = part.clock;
    auto it = card_states_.find(part.node_id);
    for (int index : part.cards) {
      CardReport state;
      state.index = index;
      state.role = CardRole::kColocated;
      if (it != card_states_.end()) {
        for (const CardReport& c : it->second) {
          if (c.index == index) state = c;
        }
      }
      if (part.lost) state.role = CardRole::kIdle;
      n.cards.push_back(std::move(state));
    }
  }
  s.events.assign(job.events.begin(), job.events.end());
  s.error_code = job.error_code;
  s.last_metrics_json = job.last_metrics_json;
  s.controller_tensor_bytes = ControllerBytesLocked(job);
  s.placement = std::string(PlacementModeName(job.config.placement.mode));
  if (job.skew != nullptr) {
    s.max_clock_skew = job.config.stalesync.max_clock_skew;
    s.max_clock_skew_seen = job.skew->gate.MaxSkewSeen();
  }
  if (job.phase == JobPhase::kSucceeded || job.phase == JobPhase::kCancelled) {
    s.summary_json = job.summary_json;
  }
  return s;
}

}  // namespace fusionrl
