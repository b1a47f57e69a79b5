// The status view: a job as JobService shows it (phase, totals, nodes and
// their cards, events, the last metrics record, summary.json once done).
#include <optional>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"

namespace fusionrl {

absl::StatusOr<v1::JobStatus> JobManager::Status(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  return StatusLocked(*job);
}

std::vector<v1::JobStatus> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobStatus> out;
  for (const auto& [n, job] : jobs_) out.push_back(StatusLocked(*job));
  return out;
}

absl::StatusOr<v1::JobStatus> JobManager::WaitForUpdate(
    const std::string& job_id, uint64_t seen_update, absl::Time deadline,
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

v1::ClusterStatus JobManager::ClusterStatus() const {
  v1::ClusterStatus out;
  absl::MutexLock lock(&mu_);
  for (const NodeView& view : registry_.List()) {
    v1::NodeStatus* n = out.add_nodes();
    n->set_node_id(view.id);
    n->set_host(view.spec.host);
    n->set_super_node(view.spec.super_node);
    n->set_state(std::string(NodeStateName(view.state)));
    n->set_heartbeat_age_ms(absl::ToInt64Milliseconds(view.heartbeat_age));
    n->set_version(view.spec.version);
    if (auto job = node_job_.find(view.id); job != node_job_.end()) {
      const Job* j = FindLocked(job->second);
      if (j != nullptr && !Terminal(*j)) {
        n->set_job_id(j->id);
        if (j->skewed) {
          for (const Job::Part& part : j->parts) {
            if (part.node_id == view.id) n->set_clock(part.clock);
          }
        }
      }
    }
    auto states = card_states_.find(view.id);
    for (const CardSpec& card : view.spec.cards) {
      v1::Card* spec = n->add_card_specs();
      spec->set_index(card.index);
      spec->set_device(card.device);
      spec->set_memory_bytes(card.memory_bytes);
      v1::CardState state;
      state.set_index(card.index);
      state.set_role(v1::CARD_ROLE_IDLE);
      if (states != card_states_.end() && view.state == NodeState::kAlive) {
        for (const v1::CardState& c : states->second) {
          if (c.index() == card.index) state = c;
        }
      }
      *n->add_cards() = std::move(state);
    }
  }
  for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it) {
    *out.add_jobs() = StatusLocked(*it->second);
  }
  return out;
}

absl::StatusOr<v1::JobHistory> JobManager::History(const std::string& job_id,
                                                   int64_t after_seq) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  v1::JobHistory out;
  out.set_first_seq(job->history.empty() ? job->history_seq + 1
                                         : job->history.front().seq());
  for (const v1::StepRecord& r : job->history) {
    if (r.seq() > after_seq) *out.add_records() = r;
  }
  return out;
}

v1::JobStatus JobManager::StatusLocked(const Job& job) const {
  v1::JobStatus s;
  s.set_job_id(job.id);
  s.set_name(job.config.name);
  s.set_phase(job.phase);
  s.set_message(job.message);
  s.set_step(job.last_committed);
  s.set_total_steps(job.config.run.total_steps);
  s.set_policy_version(job.policy_version);
  s.set_reward_mean(job.reward_mean);
  s.set_train_accuracy(job.train_accuracy);
  s.set_initial_eval_accuracy(job.summary.initial_eval_accuracy);
  s.set_eval_accuracy(job.last_eval);
  s.set_rollout_tokens(job.summary.rollout_tokens);
  s.set_tokens_per_second(
      job.loop_seconds > 0 ? job.summary.rollout_tokens / job.loop_seconds : 0);
  s.set_groups_submitted(static_cast<int64_t>(job.ledger->total()));
  s.set_groups_trained(static_cast<int64_t>(job.ledger->trained()));
  s.set_groups_requeued(static_cast<int64_t>(job.ledger->requeued_total()));
  s.set_submitted_at_us(absl::ToUnixMicros(job.submitted));
  s.set_updated_at_us(absl::ToUnixMicros(job.updated));
  for (const Job::Part& part : job.parts) {
    std::optional<NodeView> view = registry_.Get(part.node_id);
    v1::NodeStatus* n = s.add_nodes();
    n->set_node_id(part.node_id);
    n->set_super_node(part.super_node);
    if (view) {
      n->set_host(view->spec.host);
      n->set_heartbeat_age_ms(absl::ToInt64Milliseconds(view->heartbeat_age));
    }
    n->set_state(part.lost ? "lost" : (view ? "alive" : "gone"));
    if (job.skewed) n->set_clock(part.clock);
    auto it = card_states_.find(part.node_id);
    for (int index : part.cards) {
      v1::CardState state;
      state.set_index(index);
      state.set_role(v1::CARD_ROLE_COLOCATED);
      if (it != card_states_.end()) {
        for (const v1::CardState& c : it->second) {
          if (c.index() == index) state = c;
        }
      }
      if (part.lost) state.set_role(v1::CARD_ROLE_IDLE);
      *n->add_cards() = state;
      v1::CardStatus* cs = s.add_cards();
      cs->set_node_id(part.node_id);
      *cs->mutable_state() = state;
    }
  }
  for (const v1::JobEvent& e : job.events) *s.add_events() = e;
  s.set_error_code(job.error_code);
  s.set_last_metrics_json(job.last_metrics_json);
  s.set_controller_tensor_bytes(ControllerBytesLocked(job));
  s.set_placement(PlacementModeName(job.config.placement.mode));
  if (job.skewed) {
    s.set_max_clock_skew(job.config.stalesync.max_clock_skew);
    s.set_max_clock_skew_seen(job.skew_gate->MaxSkewSeen());
  }
  if (job.phase == v1::JOB_PHASE_SUCCEEDED ||
      job.phase == v1::JOB_PHASE_CANCELLED) {
    s.set_summary_json(job.summary_json);
  }
  return s;
}

}  // namespace fusionrl
