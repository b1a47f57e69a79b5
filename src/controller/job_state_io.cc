// A job's state for the controller's journal (proto/fusionrl/v1/state.proto)
// and back: what a restarted controller needs to continue the job from its
// last committed step (docs/cluster.md#controller-restart).
#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_manager_proto.h"
#include "controller/job_state.h"
#include "core/status_macros.h"
#include "fusionrl/config.h"
#include "fusionrl/v1/state.pb.h"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

int64_t Us(absl::Time t) { return absl::ToUnixMicros(t); }
absl::Time FromUs(int64_t us) { return absl::FromUnixMicros(us); }

}  // namespace

void JobManager::SetStateSink(StateSink sink) {
  absl::MutexLock journal(&journal_mu_);
  sink_ = std::move(sink);
  absl::MutexLock lock(&mu_);
  for (auto& [n, job] : jobs_) job->journaled_update = job->update;
}

void JobManager::JournalChanges() {
  absl::MutexLock journal(&journal_mu_);
  if (!sink_) return;
  std::vector<v1::JobState> changed;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [n, job] : jobs_) {
      if (job->update == job->journaled_update) continue;
      changed.push_back(SaveJobLocked(*job));
      job->journaled_update = job->update;
    }
  }
  if (changed.empty()) return;
  if (absl::Status s = sink_(std::move(changed)); !s.ok()) {
    spdlog::error(
        "controller state: {} (the jobs' latest changes are not on disk; a "
        "restart would continue from an older state)",
        std::string(s.message()));
  }
}

std::vector<v1::JobState> JobManager::SaveAll(uint64_t* next_job) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobState> out;
  for (const auto& [n, job] : jobs_) out.push_back(SaveJobLocked(*job));
  *next_job = next_job_;
  return out;
}

v1::JobState JobManager::SaveJobLocked(const Job& job) const {
  v1::JobState s;
  s.set_id(job.id);
  s.set_config_yaml(job.config_yaml);
  s.set_phase(rpc::JobPhaseToProto(job.phase));
  s.set_message(job.message);
  s.set_over(job.over);
  s.set_end_phase(rpc::JobPhaseToProto(job.end_phase));
  s.set_end_message(job.end_message);
  s.set_submitted_us(Us(job.submitted));
  s.set_started_us(Us(job.started));
  for (const JobEvent& e : job.events) {
    *s.add_events() = rpc::JobEventToProto(e);
  }
  for (const Job::Part& part : job.parts) {
    v1::JobState::Part* p = s.add_parts();
    p->set_node_id(part.node_id);
    p->set_super_node(part.super_node);
    for (int c : part.cards) p->add_cards(c);
    p->set_lost(part.lost);
    p->set_rollout_cards(part.rollout_cards);
  }
  s.set_first_step(job.first_step);
  s.set_base_cursor(job.base_cursor);
  s.set_resume_dir(job.resume_dir);
  if (job.ledger != nullptr) {
    const GroupLedger::Saved ledger = job.ledger->Save();
    s.set_ledger_total(ledger.total);
    s.set_next_new(ledger.next_new);
    s.set_requeued_total(ledger.requeued_total);
    for (uint64_t g : ledger.requeued) s.add_requeued(g);
    for (const auto& [begin, end] : ledger.trained) {
      v1::GroupRange* r = s.add_trained();
      r->set_begin(begin);
      r->set_end(end);
    }
    for (const auto& [group, node] : ledger.assigned) {
      v1::JobState::Assigned* a = s.add_assigned();
      a->set_group(group);
      a->set_node_id(node);
    }
  }
  if (job.current != nullptr && !job.current->committed) {
    const Attempt& a = *job.current;
    v1::AttemptState* c = s.mutable_current();
    c->set_step(a.step);
    c->set_attempt(a.attempt);
    c->set_generation(a.generation);
    for (int m : a.members) c->add_members(m);
    for (int r : a.first_rank) c->add_first_rank(r);
    for (const std::vector<uint64_t>& g : a.groups) {
      c->add_groups()->mutable_ids()->Add(g.begin(), g.end());
    }
    c->set_world(a.world);
  }
  s.set_last_committed(job.last_committed);
  s.set_last_committed_attempt(job.last_committed_attempt);
  s.set_rendezvous_generation(job.rendezvous_generation);
  s.set_tensor_bytes(job.tensor_bytes);
  s.set_stop_requested(job.stop_requested);
  s.set_stop_reason(job.stop_reason);
  s.set_ending(job.ending);
  s.set_end_checkpoint(job.end_checkpoint);
  s.set_has_outputs(job.has_outputs);
  s.set_initial_eval_accuracy(job.summary.initial_eval_accuracy);
  s.set_rollout_tokens(job.summary.rollout_tokens);
  s.set_last_eval(job.last_eval);
  s.set_reward_mean(job.reward_mean);
  s.set_train_accuracy(job.train_accuracy);
  s.set_policy_version(job.policy_version);
  s.set_loop_seconds(job.loop_seconds);
  s.set_checkpoint_dir(job.checkpoint_dir);
  s.set_last_metrics_json(job.last_metrics_json);
  s.set_summary_json(job.summary_json);
  s.set_error_code(job.error_code);
  s.set_skewed(job.skew != nullptr);
  if (job.skew != nullptr) SaveSkewed(*job.skew, s);
  return s;
}

void JobManager::SaveSkewed(const SkewedProtocol& skew, v1::JobState& s) {
  s.set_skew_epoch(skew.epoch);
  s.set_last_sync(skew.last_sync);
  s.mutable_groups_since_sync()->Add(skew.groups_since_sync.begin(),
                                     skew.groups_since_sync.end());
  s.set_tokens_at_sync(skew.tokens_at_sync);
  s.set_last_eval_at_sync(skew.last_eval_at_sync);
  s.set_steps_rolled_back(skew.steps_rolled_back);
  s.set_max_clock_skew_seen(skew.gate.MaxSkewSeen());
  for (const auto& [sn, crc] : skew.weights_crc) {
    (*s.mutable_weights_crc())[sn] = crc;
  }
}

absl::Status JobManager::Restore(const std::vector<v1::JobState>& jobs,
                                 uint64_t next_job) {
  {
    FlushOnExit flush(*this);
    absl::MutexLock lock(&mu_);
    for (const v1::JobState& state : jobs) {
      if (absl::Status s = RestoreJobLocked(state); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("restoring ", state.id(),
                                                   ": ", s.message()));
      }
    }
    next_job_ = std::max(next_job_, next_job);
  }
  Schedule();
  return absl::OkStatus();
}

absl::Status JobManager::RestoreJobLocked(const v1::JobState& s) {
  uint64_t n = 0;
  if (!absl::StartsWith(s.id(), "job-") ||
      !absl::SimpleAtoi(absl::string_view(s.id()).substr(4), &n) ||
      jobs_.count(n) > 0) {
    return absl::InvalidArgumentError("a bad or repeated job id");
  }
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, JobFromState(s));
  Job& j = *job;
  const bool running = j.phase == JobPhase::kRunning && !j.over;
  if (j.over) {
    // Ended: its outputs were written or are lost with the old process;
    // status shows how it ended.
    j.phase = j.end_phase;
    j.message = j.end_message;
  } else if (!running) {
    // Queued: placed again by Schedule().
    j.phase = JobPhase::kPending;
    j.parts.clear();
  }
  if (running) ReopenLocked(j);
  jobs_[n] = std::move(job);
  next_job_ = std::max(next_job_, n + 1);
  if (!running || j.ending) {
    if (running) EventLocked(j, "controller restarted: ending the job");
    return absl::OkStatus();
  }
  if (s.skewed()) return RestoreSkewedLocked(j, s);
  return RestoreAttemptLocked(j, s);
}

absl::StatusOr<std::unique_ptr<JobManager::Job>> JobManager::JobFromState(
    const v1::JobState& s) const {
  FUSIONRL_ASSIGN_OR_RETURN(
      JobConfig config,
      ParseJobConfig(s.config_yaml(), absl::StrCat(s.id(), " (restored)"), {}));
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.id = s.id();
  j.config = std::move(config);
  j.config_yaml = s.config_yaml();
  j.phase = rpc::JobPhaseFromProto(s.phase());
  j.message = s.message();
  j.over = s.over();
  j.end_phase = rpc::JobPhaseFromProto(s.end_phase());
  j.end_message = s.end_message();
  j.submitted = FromUs(s.submitted_us());
  j.started = FromUs(s.started_us());
  j.updated = clock_.Now();
  j.progress_at = j.updated;
  for (const v1::JobEvent& e : s.events()) {
    j.events.push_back(rpc::JobEventFromProto(e));
  }
  for (const v1::JobState::Part& p : s.parts()) {
    Job::Part part;
    part.node_id = p.node_id();
    part.super_node = p.super_node();
    part.cards.assign(p.cards().begin(), p.cards().end());
    part.lost = p.lost();
    part.assigned = true;
    part.rollout_cards = p.rollout_cards();
    part.clock = s.last_committed();
    j.parts.push_back(std::move(part));
  }
  j.first_step = s.first_step();
  j.base_cursor = s.base_cursor();
  j.resume_dir = s.resume_dir();
  FUSIONRL_RETURN_IF_ERROR(RestoreLedger(s, j));
  RestoreTotals(s, j);
  return job;
}

absl::Status JobManager::RestoreLedger(const v1::JobState& s, Job& j) {
  GroupLedger::Saved ledger;
  ledger.total = s.ledger_total();
  ledger.next_new = s.next_new();
  ledger.requeued_total = s.requeued_total();
  ledger.requeued.assign(s.requeued().begin(), s.requeued().end());
  for (const v1::GroupRange& r : s.trained()) {
    if (r.end() < r.begin()) {
      return absl::InvalidArgumentError(
          "a trained range ends before it begins");
    }
    ledger.trained.emplace_back(r.begin(), r.end());
  }
  for (const v1::JobState::Assigned& a : s.assigned()) {
    ledger.assigned.emplace_back(a.group(), a.node_id());
  }
  FUSIONRL_ASSIGN_OR_RETURN(j.ledger, GroupLedger::Load(ledger));
  return absl::OkStatus();
}

void JobManager::RestoreTotals(const v1::JobState& s, Job& j) {
  j.last_committed = s.last_committed();
  j.last_committed_attempt = s.last_committed_attempt();
  j.rendezvous_generation = s.rendezvous_generation();
  j.tensor_bytes = s.tensor_bytes();
  j.stop_requested = s.stop_requested();
  j.stop_reason = s.stop_reason();
  j.ending = s.ending();
  j.end_checkpoint = s.end_checkpoint();
  j.summary.kind = "rl";
  j.summary.summary_path = j.config.output_dir + "/summary.json";
  j.summary.initial_eval_accuracy = s.initial_eval_accuracy();
  j.summary.rollout_tokens = s.rollout_tokens();
  if (!j.resume_dir.empty()) j.summary.resumed_from_step = j.first_step - 1;
  j.last_eval = s.last_eval();
  j.reward_mean = s.reward_mean();
  j.train_accuracy = s.train_accuracy();
  j.policy_version = s.policy_version();
  j.loop_seconds = s.loop_seconds();
  j.checkpoint_dir = s.checkpoint_dir();
  j.last_metrics_json = s.last_metrics_json();
  j.summary_json = s.summary_json();
  j.error_code = s.error_code();
}

void JobManager::ReopenLocked(Job& j) {
  for (const Job::Part& part : j.parts) {
    if (!part.lost) node_job_[part.node_id] = j.id;
  }
  // metrics.jsonl keeps the committed steps' records, then grows again.
  JobOutputs::OpenSpec outputs;
  outputs.output_dir = j.config.output_dir;
  outputs.config_yaml = j.config_yaml;
  outputs.resume_after_step = j.last_committed;
  outputs.tensorboard = j.config.run.tensorboard;
  outputs_.Open(j.id, std::move(outputs));
  j.has_outputs = true;
}

absl::Status JobManager::RestoreSkewedLocked(Job& j, const v1::JobState& s) {
  std::vector<std::string> names;
  for (const Job::Part& part : j.parts) names.push_back(part.node_id);
  FUSIONRL_ASSIGN_OR_RETURN(
      j.skew, SkewedProtocol::Create(j.config.stalesync.max_clock_skew, names,
                                     std::max<int64_t>(0, s.last_committed())));
  SkewedProtocol& skew = *j.skew;
  for (const Job::Part& part : j.parts) {
    if (part.lost) skew.gate.Remove(part.node_id);
  }
  skew.ResetExchange(s.last_committed());
  skew.epoch = s.skew_epoch();
  skew.last_sync = s.last_sync();
  skew.groups_since_sync.assign(s.groups_since_sync().begin(),
                                s.groups_since_sync().end());
  skew.tokens_at_sync = s.tokens_at_sync();
  skew.last_eval_at_sync = s.last_eval_at_sync();
  skew.steps_rolled_back = s.steps_rolled_back();
  for (const auto& [sn, crc] : s.weights_crc()) skew.weights_crc[sn] = crc;
  // The steps in flight: their groups go back (after the committed ones
  // RollBackSkewedLocked reclaims, which come first).
  std::vector<uint64_t> in_flight;
  for (const v1::JobState::Assigned& a : s.assigned()) {
    in_flight.push_back(a.group());
  }
  std::sort(in_flight.begin(), in_flight.end());
  FUSIONRL_RETURN_IF_ERROR(j.ledger->Reclaim(in_flight));
  RollBackSkewedLocked(j, "controller restarted");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JobManager::Attempt>>
JobManager::AttemptFromState(const v1::AttemptState& c, const Job& j) {
  auto a = std::make_unique<Attempt>();
  a->step = c.step();
  a->attempt = c.attempt();
  a->generation = c.generation();
  a->members.assign(c.members().begin(), c.members().end());
  a->first_rank.assign(c.first_rank().begin(), c.first_rank().end());
  for (const auto& g : c.groups()) {
    a->groups.emplace_back(g.ids().begin(), g.ids().end());
  }
  a->world = c.world();
  if (a->members.size() != a->groups.size() ||
      a->members.size() != a->first_rank.size()) {
    return absl::InvalidArgumentError("an attempt's members and groups differ");
  }
  for (int m : a->members) {
    if (m < 0 || m >= static_cast<int>(j.parts.size())) {
      return absl::InvalidArgumentError("an attempt names an unknown part");
    }
  }
  a->finished.assign(a->members.size(), false);
  a->reports.resize(a->members.size());
  return a;
}

absl::Status JobManager::RestoreAttemptLocked(Job& j, const v1::JobState& s) {
  if (!s.has_current()) {
    EventLocked(j, "controller restarted");
    PlanStepLocked(j, j.last_committed + 1);
    return absl::OkStatus();
  }
  FUSIONRL_ASSIGN_OR_RETURN(j.current, AttemptFromState(s.current(), j));
  const Attempt& a = *j.current;
  if (a.members.size() <= 1) {
    EventLocked(j, absl::StrCat("controller restarted: step ", a.step,
                                " attempt ", a.attempt, " continues"));
    return absl::OkStatus();
  }
  // Its rounds and barrier lived in the old process: the nodes restore the
  // step's start and run the next attempt.
  j.current->aborted = true;
  EventLocked(j, absl::StrCat("controller restarted: step ", a.step,
                              " attempt ", a.attempt, " replanned"));
  PlanStepLocked(j, a.step);
  return absl::OkStatus();
}

}  // namespace fusionrl
