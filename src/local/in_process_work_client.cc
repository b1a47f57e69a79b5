#include "local/in_process_work_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "core/weight_store.h"

namespace fusionrl {
namespace {

// `s` with "<what>: " before its message (OK stays OK).
absl::Status Named(const absl::Status& s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// As the weight client: a weight call needs a finite, positive timeout.
absl::Status CheckTimeout(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline: must be finite and > 0, got ",
                     absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace

InProcessWorkClient::InProcessWorkClient(JobManager& jobs, WeightStore& weights)
    : jobs_(jobs), weights_(weights) {}

absl::StatusOr<Assignment> InProcessWorkClient::GetAssignment(
    const std::string& node_id, absl::Duration wait) {
  absl::StatusOr<Assignment> a = jobs_.GetAssignment(node_id, wait);
  if (!a.ok()) return Named(a.status(), "GetAssignment");
  return a;
}

absl::StatusOr<StepPlan> InProcessWorkClient::GetStepPlan(
    const std::string& job_id, const std::string& node_id, int local_rank,
    int64_t step, absl::Duration wait) {
  absl::StatusOr<StepPlan> plan =
      jobs_.GetStepPlan(job_id, node_id, local_rank, step, wait);
  if (!plan.ok()) {
    return Named(plan.status(), absl::StrCat("GetStepPlan(step ", step, ")"));
  }
  return plan;
}

absl::StatusOr<std::string> InProcessWorkClient::Reduce(
    ReduceCall call, absl::Duration timeout) {
  return jobs_.Reduce(std::move(call), timeout);
}

absl::StatusOr<bool> InProcessWorkClient::FinishStep(const StepReport& report,
                                                     absl::Duration timeout) {
  absl::StatusOr<bool> committed = jobs_.FinishStep(report, timeout);
  if (!committed.ok()) {
    return Named(committed.status(),
                 absl::StrCat("FinishStep(step ", report.step, ")"));
  }
  return committed;
}

absl::StatusOr<std::vector<ReceivedUpdate>>
InProcessWorkClient::ExchangeUpdates(UpdateCall call, absl::Duration timeout) {
  return jobs_.ExchangeUpdates(std::move(call), timeout);
}

absl::Status InProcessWorkClient::PublishWeights(const std::string& key,
                                                 int64_t step,
                                                 const std::string& super_node,
                                                 const std::string& blob,
                                                 absl::Duration timeout) {
  const std::string what =
      absl::StrCat("PublishWeights(", key, " version ", step, ")");
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return Named(s, what);
  return Named(weights_.Put(key, step, super_node, blob), what);
}

absl::StatusOr<std::string> InProcessWorkClient::FetchWeights(
    const std::string& key, int64_t step, absl::Duration timeout) {
  const std::string what =
      absl::StrCat("FetchWeights(", key, " version ", step, ")");
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return Named(s, what);
  absl::StatusOr<WeightVersion> version = weights_.Get(key, step);
  if (!version.ok()) return Named(version.status(), what);
  return *version->bytes;
}

absl::StatusOr<StoreReply> InProcessWorkClient::Store(const StoreCall& call,
                                                      absl::Duration timeout) {
  return jobs_.Store(call, timeout);
}

}  // namespace fusionrl
