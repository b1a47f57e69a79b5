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
namespace {

// The call's own checks (no job state): its key, its payload's size and,
// when it crossed a wire, its CRC-32C. Returns the payload's CRC-32C.
absl::StatusOr<uint32_t> CheckUpdate(const UpdateCall& u) {
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
  return crc;
}

}  // namespace

absl::StatusOr<std::vector<ReceivedUpdate>> JobManager::ExchangeUpdates(
    UpdateCall u, absl::Duration timeout) {
  absl::Time deadline = clock_.Now() + timeout;
  FUSIONRL_ASSIGN_OR_RETURN(const uint32_t crc, CheckUpdate(u));
  FlushOnExit flush(*this);  // a mismatched update fails the job
  absl::MutexLock lock(&mu_);
  FUSIONRL_ASSIGN_OR_RETURN(Job * job, JobForNodeLocked(u.job_id, u.node_id));
  if (job->skew == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        job->id,
        " does not exchange updates (stalesync.max_clock_skew is 0 or it runs "
        "on one super node); its steps use WorkService.Reduce"));
  }
  if (Terminal(*job)) {
    return absl::AbortedError(absl::StrCat(job->id, " ended"));
  }
  const int epoch = job->skew->epoch;
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
  const SkewedProtocol::Key key{u.step, u.round};
  FUSIONRL_RETURN_IF_ERROR(HandInUpdateLocked(*job, me, u, crc));
  FUSIONRL_RETURN_IF_ERROR(AwaitUpdatesLocked(*job, me, u, epoch, deadline));
  int64_t bytes = 0;
  std::vector<ReceivedUpdate> out =
      job->skew->Deliver(me, key, job->parts, bytes);
  job->tensor_bytes += bytes;
  tensor_bytes_ += bytes;
  return out;
}

absl::Status JobManager::HandInUpdateLocked(Job& job, int me, UpdateCall& u,
                                            uint32_t crc) {
  SkewedProtocol& skew = *job.skew;
  const SkewedProtocol::Key key{u.step, u.round};
  if (key <= skew.handed_in[me]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update: (step, round) must grow; ", u.node_id, " handed in (",
        skew.handed_in[me].first, ", ", skew.handed_in[me].second,
        ") before, got (", u.step, ", ", u.round, ")"));
  }
  if (const size_t others = skew.OtherUpdateSize(u.payload.size());
      others != 0) {
    const std::string msg =
        absl::StrCat("update of ", u.node_id, " step ", u.step, ": ",
                     u.payload.size(), " bytes, others ", others,
                     " (the super nodes run different models or code)");
    FailLocked(job, msg, static_cast<int>(absl::StatusCode::kInvalidArgument));
    return absl::InvalidArgumentError(msg);
  }
  job.tensor_bytes += static_cast<int64_t>(u.payload.size());
  tensor_bytes_ += static_cast<int64_t>(u.payload.size());
  skew.HandIn(me, key, std::move(u.payload), crc);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status JobManager::AwaitUpdatesLocked(const Job& job, int me,
                                            const UpdateCall& u, int epoch,
                                            absl::Time deadline) {
  const SkewedProtocol::Key due{u.due_step, u.round};
  for (;;) {
    if (Terminal(job)) {
      return absl::AbortedError(
          absl::StrCat(job.id, " ended: ", job.end_message));
    }
    if (job.skew->epoch != epoch) {
      return absl::AbortedError(absl::StrCat("update exchange of ", u.node_id,
                                             " at step ", u.step, ": ", job.id,
                                             " rolled back while it waited"));
    }
    std::vector<std::string> missing;
    if (u.due_step >= job.first_step) {
      missing = job.skew->Missing(me, due, job.parts);
    }
    if (missing.empty()) return absl::OkStatus();
    if (clock_.Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "update exchange of ", u.node_id, " at step ", u.step, " round ",
          u.round, ": waited for step ", u.due_step, " round ", u.round, " of ",
          absl::StrJoin(missing, ", ")));
    }
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
}

size_t JobManager::SkewedProtocol::OtherUpdateSize(size_t size) const {
  for (const std::deque<Update>& box : outbox) {
    if (!box.empty() && box.front().payload.size() != size) {
      return box.front().payload.size();
    }
  }
  return 0;
}

void JobManager::SkewedProtocol::HandIn(int me, Key key, std::string payload,
                                        uint32_t crc32c) {
  outbox[me].push_back({key, std::move(payload), crc32c});
  handed_in[me] = key;
}

std::vector<std::string> JobManager::SkewedProtocol::Missing(
    int me, Key due, const std::vector<Job::Part>& parts) const {
  std::vector<std::string> missing;
  for (size_t m = 0; m < parts.size(); ++m) {
    if (static_cast<int>(m) == me || parts[m].lost) continue;
    if (handed_in[m] < due) {
      missing.push_back(absl::StrCat(parts[m].node_id, " (at step ",
                                     handed_in[m].first, " round ",
                                     handed_in[m].second, ")"));
    }
  }
  return missing;
}

std::vector<ReceivedUpdate> JobManager::SkewedProtocol::Deliver(
    int me, Key key, const std::vector<Job::Part>& parts, int64_t& bytes) {
  std::vector<ReceivedUpdate> out;
  const int n = static_cast<int>(parts.size());
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    Key& mark = delivered[me][m];
    for (const Update& up : outbox[m]) {
      if (up.key <= mark) continue;
      if (up.key > key) break;
      out.push_back({up.key.first, up.payload, parts[m].node_id, up.key.second,
                     up.crc32c});
      bytes += static_cast<int64_t>(up.payload.size());
      mark = up.key;
    }
    // Drop the updates every other live part has received.
    std::deque<Update>& box = outbox[m];
    while (!box.empty()) {
      bool everyone = true;
      for (int q = 0; q < n; ++q) {
        if (q != m && !parts[q].lost && delivered[q][m] < box.front().key) {
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
