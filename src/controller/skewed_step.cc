// The skewed (StaleSync) step protocol across super nodes: each node asks
// for its next step as it reaches it, a new step is planned only while the
// node is at most max_clock_skew steps ahead of the slowest (the gate),
// every node finishes its steps on its own, and steps commit in order once
// all their nodes have finished them. The updates travel through the
// exchange (update_exchange.cc).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"

namespace fusionrl {

absl::StatusOr<const JobManager::Attempt*> JobManager::SkewedAttemptLocked(
    Job& job, int index, int64_t want) {
  const Job::Part& part = job.parts[index];
  if (want != part.clock + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", part.node_id, " finished step ", part.clock,
        " and may ask only for step ", part.clock + 1, ", got ", want));
  }
  if (job.current && job.current->step == want) return job.current.get();
  if (auto it = job.ahead.find(want); it != job.ahead.end()) {
    return it->second.get();
  }
  // A new step: only within the run, not after a stop, and only while the
  // node is at most k steps ahead of the slowest.
  if (want > job.config.run.total_steps || job.stop_requested ||
      !job.skew_gate->MayStart(part.node_id)) {
    return nullptr;
  }
  const int64_t planned =
      job.ahead.empty() ? job.current->step : job.ahead.rbegin()->first;
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
  job.ahead[want] = std::move(a);
  ++job.update;
  changed_.SignalAll();
  return out;
}

absl::StatusOr<bool> JobManager::FinishSkewedStepLocked(Job& job,
                                                        ReportedStep& r) {
  const std::string& node_id = r.report.node_id;
  const int64_t step = r.report.step;
  const int index = job.PartIndex(node_id);
  Attempt* a = nullptr;
  if (job.current && job.current->step == step) {
    a = job.current.get();
  } else if (auto it = job.ahead.find(step); it != job.ahead.end()) {
    a = it->second.get();
  }
  const int k = a == nullptr ? -1 : a->Member(index);
  if (k < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: ", step, " of ", job.id,
                     " is not a step planned for ", node_id));
  }
  if (a->finished[k]) return true;  // a retried call
  absl::Status advanced = job.skew_gate->Advance(node_id, step);
  if (!advanced.ok()) {
    // The plans are handed out through the gate: a bug, not bad input.
    FailLocked(job, absl::StrCat("internal: ", advanced.message()),
               static_cast<int>(absl::StatusCode::kInternal));
    return advanced;
  }
  a->finished[k] = true;
  job.parts[index].clock = step;
  if (r.report.has_weights_crc32c) {
    job.weights_crc[job.parts[index].super_node] = r.report.weights_crc32c;
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

}  // namespace fusionrl
