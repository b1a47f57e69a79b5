// A cross-node reduce round of a synchronous attempt: every node of the
// attempt hands in its payload for (step, attempt, round); once all are in,
// their sum (SumPayloads, in node order, so every node gets the same bytes)
// is handed back to each of them.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "controller/reduce_sum.h"
#include "core/status_macros.h"

namespace fusionrl {

absl::StatusOr<std::string> JobManager::Reduce(ReduceCall r,
                                               absl::Duration timeout) {
  absl::Time deadline = clock_.Now() + timeout;
  const size_t width = DtypeWidth(r.dtype);
  if (r.payload.size() % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload: ", r.payload.size(), " bytes is not a whole number of ",
        width, "-byte values"));
  }
  if (r.round < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("round: must be >= 0, got ", r.round));
  }
  FlushOnExit flush(*this);  // a mismatched round fails the job
  absl::MutexLock lock(&mu_);
  FUSIONRL_ASSIGN_OR_RETURN(Job * job, JobForNodeLocked(r.job_id, r.node_id));
  deadline = std::min(
      deadline,
      clock_.Now() + absl::Seconds(job->config.run.collective_timeout_seconds));
  Attempt* a = job->current.get();
  if (a == nullptr || a->step != r.step || a->attempt != r.attempt ||
      a->aborted || Terminal(*job)) {
    return absl::AbortedError(
        absl::StrCat("step ", r.step, " attempt ", r.attempt, " of ", job->id,
                     " is no longer current; restore and ask for a new plan"));
  }
  const int k = a->Member(job->PartIndex(r.node_id));
  if (k < 0) {
    return absl::AbortedError(absl::StrCat(r.node_id, " is not in step ",
                                           r.step, " attempt ", r.attempt));
  }
  ReduceRound& round = a->rounds[r.round];
  if (round.parts.empty()) {
    round.parts.resize(a->members.size());
    round.dtype = r.dtype;
  }
  if (round.parts[k].has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("round: ", r.round, " was already sent by ", r.node_id));
  }
  for (const auto& p : round.parts) {
    if (p.has_value() &&
        (p->size() != r.payload.size() || round.dtype != r.dtype)) {
      const std::string msg = absl::StrCat(
          "round ", r.round, " of step ", r.step, ": ", r.node_id, " sent ",
          r.payload.size(), " bytes of ", DtypeName(r.dtype), ", others ",
          p->size(), " bytes of ", DtypeName(round.dtype),
          " (the nodes run different code or configs)");
      FailLocked(*job, msg,
                 static_cast<int>(absl::StatusCode::kInvalidArgument));
      return absl::InvalidArgumentError(msg);
    }
  }
  const int64_t bytes = static_cast<int64_t>(r.payload.size());
  job->tensor_bytes += bytes;
  tensor_bytes_ += bytes;
  round.parts[k] = std::move(r.payload);
  if (++round.received == static_cast<int>(round.parts.size())) {
    std::vector<std::string> payloads;
    payloads.reserve(round.parts.size());
    for (auto& p : round.parts) {
      payloads.push_back(std::move(*p));
      p.reset();
    }
    absl::StatusOr<std::string> sum = SumPayloads(round.dtype, payloads);
    if (!sum.ok()) {
      // Every part was checked against the others as it came in.
      const std::string msg =
          absl::StrCat("internal: round ", r.round, " of step ", r.step, ": ",
                       sum.status().message());
      FailLocked(*job, msg, static_cast<int>(absl::StatusCode::kInternal));
      return absl::InternalError(msg);
    }
    round.sum = *std::move(sum);
    round.done = true;
    changed_.SignalAll();
  }
  // `a` stays valid while we hold the lock or while it is job->current;
  // re-find it after every wait.
  const int64_t step = r.step;
  const int attempt = r.attempt;
  for (;;) {
    Attempt* cur = job->current.get();
    if (cur == nullptr || cur->step != step || cur->attempt != attempt ||
        cur->aborted || Terminal(*job)) {
      return absl::AbortedError(
          absl::StrCat("step ", step, " attempt ", attempt, " of ", job->id,
                       " was aborted (a node was lost or the job ended)"));
    }
    ReduceRound& rd = cur->rounds[r.round];
    if (rd.done) {
      std::string out = rd.sum;
      job->tensor_bytes += static_cast<int64_t>(out.size());
      tensor_bytes_ += static_cast<int64_t>(out.size());
      if (++rd.fetched == static_cast<int>(cur->members.size())) {
        cur->rounds.erase(r.round);
      }
      return out;
    }
    if (clock_.Now() >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < rd.parts.size(); ++i) {
        if (!rd.parts[i].has_value()) {
          missing.push_back(job->parts[cur->members[i]].node_id);
        }
      }
      return absl::DeadlineExceededError(
          absl::StrCat("round ", r.round, " of step ", step, ": waited for ",
                       absl::StrJoin(missing, ", ")));
    }
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
}

}  // namespace fusionrl
