#include "worker/plan_rendezvous.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusionrl {

PlanRendezvous::PlanRendezvous(WorkClient& client, Options options,
                               std::function<bool()> stopping,
                               const Clock& clock)
    : client_(client),
      options_(std::move(options)),
      stopping_(std::move(stopping)),
      clock_(clock),
      seen_(std::max(1, options_.local_cards), 0) {}

absl::StatusOr<StepPlan> PlanRendezvous::GetPlan(int local_rank, int64_t step) {
  return client_.GetStepPlan(options_.job_id, options_.node_id, local_rank,
                             step, options_.plan_wait);
}

void PlanRendezvous::Publish(absl::Status status, std::vector<StepPlan> plans) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  plans_ = std::move(plans);
  ++generation_;
  published_.SignalAll();
}

void PlanRendezvous::Fail(absl::Status status) {
  Publish(std::move(status), {});
}

absl::StatusOr<StepPlan> PlanRendezvous::NextPlan(int local_rank,
                                                  int64_t step) {
  if (local_rank != 0) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = clock_.Now() + options_.timeout;
    int64_t& seen = seen_[local_rank];
    while (generation_ == seen &&
           !WaitOnClock(published_, mu_, clock_, deadline)) {
    }
    if (generation_ == seen) {
      return absl::DeadlineExceededError(absl::StrCat(
          "card ", local_rank, ": no plan from card 0 for step ", step));
    }
    seen = generation_;
    if (!status_.ok()) return status_;
    return plans_[local_rank];
  }
  for (;;) {
    if (stopping_ && stopping_()) {
      absl::Status stop = absl::CancelledError("the worker is stopping");
      Publish(stop, {});
      return stop;
    }
    std::vector<StepPlan> plans;
    absl::Status status;
    for (int r = 0; r < options_.local_cards; ++r) {
      absl::StatusOr<StepPlan> plan = GetPlan(r, step);
      if (!plan.ok()) {
        status = plan.status();
        break;
      }
      plans.push_back(*std::move(plan));
      const PlanKind kind = plans.front().kind;
      if (kind == PlanKind::kWait || kind == PlanKind::kEnd ||
          kind == PlanKind::kAbandon) {
        // Nothing per card: the other cards stop (END, ABANDON) or card 0
        // asks again (WAIT).
        plans.resize(options_.local_cards, plans.front());
        break;
      }
    }
    if (!status.ok()) {
      Publish(status, {});
      return status;
    }
    const StepPlan& first = plans.front();
    if (first.kind == PlanKind::kWait) continue;
    bool same = true;
    for (const StepPlan& p : plans) {
      same = same && p.kind == first.kind && p.step == first.step &&
             p.attempt == first.attempt;
    }
    if (!same) continue;  // an attempt changed between the calls
    StepPlan mine = first;
    Publish(absl::OkStatus(), std::move(plans));
    return mine;
  }
}

}  // namespace fusionrl
