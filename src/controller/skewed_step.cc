// The skewed (StaleSync) step protocol across super nodes: each node asks
// for its next step as it reaches it, a new step is planned only while the
// node is at most max_clock_skew steps ahead of the slowest (the gate),
// every node finishes its steps on its own, and steps commit in order once
// all their nodes have finished them. The updates travel through the
// exchange (update_exchange.cc).
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "core/status_macros.h"

namespace fusionrl {

absl::StatusOr<const JobManager::Attempt*> JobManager::SkewedAttemptLocked(
    Job& job, int index, int64_t want) {
  const Job::Part& part = job.parts[index];
  SkewedProtocol& skew = *job.skew;
  if (want != part.clock + 1) {
    if (skew.epoch == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step: ", part.node_id, " finished step ", part.clock,
          " and may ask only for step ", part.clock + 1, ", got ", want));
    }
    // The job rolled back under a node that had run ahead (or was
    // aborted): it gets the step after its rolled-back clock, whose plan
    // (a new attempt) tells it to restore the last weight sync. A node of
    // the current epoch always asks for clock + 1.
    want = part.clock + 1;
  }
  if (job.current && job.current->step == want) return job.current.get();
  if (auto it = skew.ahead.find(want); it != skew.ahead.end()) {
    return it->second.get();
  }
  // A new step: only within the run, not after a stop, and only while the
  // node is at most k steps ahead of the slowest.
  if (want > job.config.run.total_steps || job.stop_requested ||
      !skew.gate.MayStart(part.node_id)) {
    return nullptr;
  }
  const int64_t planned =
      skew.ahead.empty() ? job.current->step : skew.ahead.rbegin()->first;
  if (want != planned + 1) {
    return absl::InternalError(absl::StrCat("step ", want, " of ", job.id,
                                            " asked for before step ",
                                            planned + 1, " was planned"));
  }
  std::unique_ptr<Attempt> a = MakeAttemptLocked(job, want);
  if (a == nullptr) return absl::AbortedError(job.end_message);
  // The nodes never change while a skewed job runs: one rendezvous
  // generation (planned with its first step) serves all its steps.
  a->generation = job.rendezvous_generation;
  const Attempt* out = a.get();
  skew.ahead[want] = std::move(a);
  ++job.update;
  changed_.SignalAll();
  return out;
}

absl::StatusOr<bool> JobManager::FinishSkewedStepLocked(Job& job,
                                                        ReportedStep& r) {
  const std::string& node_id = r.report.node_id;
  const int64_t step = r.report.step;
  const int index = job.PartIndex(node_id);
  SkewedProtocol& skew = *job.skew;
  Attempt* a = nullptr;
  if (job.current && job.current->step == step) {
    a = job.current.get();
  } else if (auto it = skew.ahead.find(step); it != skew.ahead.end()) {
    a = it->second.get();
  }
  if (r.report.attempt != skew.attempt()) {
    // A step of an attempt the job rolled back: not counted; the node asks
    // for its next plan, which restores the last weight sync.
    return false;
  }
  const int k = a == nullptr ? -1 : a->Member(index);
  if (k < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: ", step, " of ", job.id,
                     " is not a step planned for ", node_id));
  }
  if (a->finished[k]) return true;  // a retried call
  absl::Status advanced = skew.gate.Advance(node_id, step);
  if (!advanced.ok()) {
    // The plans are handed out through the gate: a bug, not bad input.
    FailLocked(job, absl::StrCat("internal: ", advanced.message()),
               static_cast<int>(absl::StatusCode::kInternal));
    return advanced;
  }
  a->finished[k] = true;
  job.parts[index].clock = step;
  if (r.report.has_weights_crc32c) {
    skew.weights_crc[job.parts[index].super_node] = r.report.weights_crc32c;
  }
  if (k == 0) {
    a->lead_report = r;
    a->have_lead_report = true;
  }
  a->reports[k] = std::move(r);
  // Commit, in order, every step all its nodes have finished.
  while (!Terminal(job) && !job.ending && job.current &&
         std::all_of(job.current->finished.begin(), job.current->finished.end(),
                     [](bool b) { return b; })) {
    CommitLocked(job);
  }
  ++job.update;
  changed_.SignalAll();
  return true;
}

absl::StatusOr<std::unique_ptr<JobManager::SkewedProtocol>>
JobManager::SkewedProtocol::Create(int64_t max_clock_skew,
                                   const std::vector<std::string>& node_ids,
                                   int64_t clock) {
  FUSIONRL_ASSIGN_OR_RETURN(
      ClockSkewGate gate,
      ClockSkewGate::Create(max_clock_skew, node_ids, clock));
  auto skew = std::make_unique<SkewedProtocol>(std::move(gate));
  skew->outbox.resize(node_ids.size());
  skew->ResetExchange(clock);
  skew->last_sync = clock;
  return skew;
}

void JobManager::SkewedProtocol::ResetExchange(int64_t clock) {
  const size_t n = outbox.size();
  const Key none{clock, -1};
  for (std::deque<Update>& box : outbox) box.clear();
  handed_in.assign(n, none);
  delivered.assign(n, std::vector<Key>(n, none));
}

void JobManager::SkewedProtocol::RecordCommit(const Attempt& a, bool sync,
                                              int64_t tokens,
                                              double last_eval) {
  if (sync) {
    last_sync = a.step;
    groups_since_sync.clear();
    tokens_at_sync = tokens;
    last_eval_at_sync = last_eval;
    return;
  }
  for (const std::vector<uint64_t>& g : a.groups) {
    groups_since_sync.insert(groups_since_sync.end(), g.begin(), g.end());
  }
}

std::unique_ptr<JobManager::Attempt> JobManager::SkewedProtocol::TakeAhead(
    int64_t step) {
  auto it = ahead.find(step);
  if (it == ahead.end()) return nullptr;
  std::unique_ptr<Attempt> a = std::move(it->second);
  ahead.erase(it);
  return a;
}

void JobManager::SkewedProtocol::End() {
  ahead.clear();
  outbox.clear();
}

void JobManager::SkewedProtocol::RollBack(int64_t r, int64_t undone) {
  steps_rolled_back += undone;
  groups_since_sync.clear();
  ahead.clear();
  gate.RollBack(r);
  ResetExchange(r);
  ++epoch;
  rollback_step = r;
}

bool JobManager::IsSyncStep(const Job& job, int64_t step) {
  const RunConfig& run = job.config.run;
  return step == run.total_steps ||
         (run.checkpoint_every > 0 && step % run.checkpoint_every == 0);
}

void JobManager::RollBackSkewedLocked(Job& job, const std::string& why) {
  ++job.data_plane_aborts;
  if (job.data_plane_aborts > kMaxDataPlaneAborts) {
    FailLocked(job,
               absl::StrCat("StaleSync: rolled back ", job.data_plane_aborts,
                            " times with no step committed in between; "
                            "last: ",
                            why),
               static_cast<int>(absl::StatusCode::kUnavailable));
    return;
  }
  SkewedProtocol& skew = *job.skew;
  const int64_t r = skew.last_sync;
  // Every prompt group of the steps after R goes back to the front of the
  // queue, in ledger order: the committed ones, those of the steps in
  // flight (the lost node's included).
  std::vector<uint64_t> groups = skew.groups_since_sync;
  auto add = [&groups](const Attempt* a) {
    if (a == nullptr || a->committed) return;
    for (const std::vector<uint64_t>& g : a->groups) {
      groups.insert(groups.end(), g.begin(), g.end());
    }
  };
  add(job.current.get());
  for (const auto& [step, a] : skew.ahead) add(a.get());
  std::sort(groups.begin(), groups.end());
  if (absl::Status s = job.ledger->Reclaim(groups); !s.ok()) {
    FailLocked(job, absl::StrCat("internal: rolling back: ", s.message()),
               static_cast<int>(absl::StatusCode::kInternal));
    return;
  }
  const int64_t undone = job.last_committed - r;
  job.current.reset();
  job.last_committed = r;
  job.summary.rollout_tokens = skew.tokens_at_sync;
  job.last_eval = skew.last_eval_at_sync;
  if (undone > 0) outputs_.RollBack(job.id, r);
  while (!job.history.empty() && job.history.back().step > r) {
    job.history.pop_back();  // seq stays: observers see the steps again
  }
  // The clocks, the gate and the controller data plane's exchange start
  // again from R; the lost node's updates are dropped with the rest.
  for (Job::Part& part : job.parts) {
    if (!part.lost) part.clock = r;
  }
  skew.RollBack(r, undone);
  EventLocked(
      job, absl::StrCat("StaleSync roll-back ", skew.epoch, " (", why,
                        "): back to the weight sync of step ", r, "; ", undone,
                        " committed step(s) and ", groups.size(),
                        " prompt group(s) to run again"));
  // With no current attempt PlanStepLocked closes the old rendezvous
  // generation (every collective still waiting on it gives up through its
  // probe) and opens a new one. It restarts the abort count of a new step;
  // a roll-back keeps it.
  const int aborts = job.data_plane_aborts;
  PlanStepLocked(job, r + 1);
  job.data_plane_aborts = aborts;
  ++job.update;
  changed_.SignalAll();
}

}  // namespace fusionrl
