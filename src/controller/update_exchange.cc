// StaleSync's update exchange across super nodes: a node hands in its
// update of (step, round), waits for every other live node's update of
// (due_step, round), and gets what it has not received yet up to its own
// key, each update exactly once, oldest first per node; an update every
// other node has received is dropped.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "core/crc32c.h"
#include "core/status_macros.h"

namespace fusionrl {

absl::StatusOr<std::vector<ReceivedUpdate>> JobManager::ExchangeUpdates(
    UpdateCall u, absl::Duration timeout) {
  absl::Time deadline = clock_.Now() + timeout;
  if (u.step < 1 || u.round < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update: step must be >= 1 and round >= 0, got step ",
                     u.step, " round ", u.round));
  }
  if (u.payload.empty() || u.payload.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update.payload: ", u.payload.size(),
                     " bytes is not a non-empty whole number of float32"));
  }
  // Kept with the update: receivers over the wire check it end to end.
  const uint32_t crc = Crc32c(u.payload);
  if (u.crc32c.has_value() && crc != *u.crc32c) {
    return absl::DataLossError(absl::StrFormat(
        "update of %s step %d round %d: CRC-32C of the %d bytes is 0x%08x, "
        "expected 0x%08x",
        u.node_id, u.step, u.round, u.payload.size(), crc, *u.crc32c));
  }
  FlushOnExit flush(*this);  // a mismatched update fails the job
  absl::MutexLock lock(&mu_);
  FUSIONRL_ASSIGN_OR_RETURN(Job * job, JobForNodeLocked(u.job_id, u.node_id));
  if (!job->skewed) {
    return absl::FailedPreconditionError(absl::StrCat(
        job->id,
        " does not exchange updates (stalesync.max_clock_skew is 0 or it runs "
        "on one super node); its steps use WorkService.Reduce"));
  }
  if (Terminal(*job)) {
    return absl::AbortedError(absl::StrCat(job->id, " ended"));
  }
  const int epoch = job->skew_epoch;
  if (u.attempt != epoch + 1) {
    return absl::AbortedError(
        absl::StrCat("update exchange of ", u.node_id, " at step ", u.step,
                     ": attempt ", u.attempt, " was rolled back (", job->id,
                     " is at attempt ", epoch + 1, ")"));
  }
  deadline = std::min(
      deadline,
      clock_.Now() + absl::Seconds(job->config.run.collective_timeout_seconds));
  const int me = job->PartIndex(u.node_id);
  const Job::Key key{u.step, u.round};
  if (key <= job->handed_in[me]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update: (step, round) must grow; ", u.node_id, " handed in (",
        job->handed_in[me].first, ", ", job->handed_in[me].second,
        ") before, got (", u.step, ", ", u.round, ")"));
  }
  for (const auto& box : job->outbox) {
    if (!box.empty() && box.front().payload.size() != u.payload.size()) {
      const std::string msg = absl::StrCat(
          "update of ", u.node_id, " step ", u.step, ": ", u.payload.size(),
          " bytes, others ", box.front().payload.size(),
          " (the super nodes run different models or code)");
      FailLocked(*job, msg,
                 static_cast<int>(absl::StatusCode::kInvalidArgument));
      return absl::InvalidArgumentError(msg);
    }
  }
  job->tensor_bytes += static_cast<int64_t>(u.payload.size());
  tensor_bytes_ += static_cast<int64_t>(u.payload.size());
  job->outbox[me].push_back({key, std::move(u.payload), crc});
  job->handed_in[me] = key;
  changed_.SignalAll();

  // Wait for every other live node's update of (due_step, round).
  const Job::Key due{u.due_step, u.round};
  for (;;) {
    if (Terminal(*job)) {
      return absl::AbortedError(
          absl::StrCat(job->id, " ended: ", job->end_message));
    }
    if (job->skew_epoch != epoch) {
      return absl::AbortedError(absl::StrCat("update exchange of ", u.node_id,
                                             " at step ", u.step, ": ", job->id,
                                             " rolled back while it waited"));
    }
    std::vector<std::string> missing;
    for (size_t m = 0; m < job->parts.size(); ++m) {
      if (static_cast<int>(m) == me || job->parts[m].lost) continue;
      if (u.due_step >= job->first_step && job->handed_in[m] < due) {
        missing.push_back(absl::StrCat(job->parts[m].node_id, " (at step ",
                                       job->handed_in[m].first, " round ",
                                       job->handed_in[m].second, ")"));
      }
    }
    if (missing.empty()) break;
    if (clock_.Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "update exchange of ", u.node_id, " at step ", u.step, " round ",
          u.round, ": waited for step ", u.due_step, " round ", u.round, " of ",
          absl::StrJoin(missing, ", ")));
    }
    WaitOnClock(changed_, mu_, clock_, deadline);
  }

  // Hand over what this node has not received, up to its own key; drop
  // updates every other node has received.
  std::vector<ReceivedUpdate> out;
  const int n = static_cast<int>(job->parts.size());
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    Job::Key& mark = job->delivered[me][m];
    for (const Job::Update& up : job->outbox[m]) {
      if (up.key <= mark) continue;
      if (up.key > key) break;
      out.push_back({up.key.first, up.payload, job->parts[m].node_id,
                     up.key.second, up.crc32c});
      job->tensor_bytes += static_cast<int64_t>(up.payload.size());
      tensor_bytes_ += static_cast<int64_t>(up.payload.size());
      mark = up.key;
    }
    std::deque<Job::Update>& box = job->outbox[m];
    while (!box.empty()) {
      bool everyone = true;
      for (int q = 0; q < n; ++q) {
        if (q != m && !job->parts[q].lost &&
            job->delivered[q][m] < box.front().key) {
          everyone = false;
        }
      }
      if (!everyone) break;
      box.pop_front();
    }
  }
  return out;
}

}  // namespace fusionrl
