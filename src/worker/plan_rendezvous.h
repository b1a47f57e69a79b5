// PlanRendezvous: how the training cards of one node move in lock-step.
//
// Card 0 asks the controller for every card's plan of the next step,
// retrying until all of them carry the same attempt, and publishes them
// here; the other cards take theirs. So the cards always run the same
// attempt and reach their collectives in the same order, and card 0
// decides, for all, to stop (END, ABANDON, an error, the worker stopping).
//
// Thread safety: one thread per local rank calls NextPlan(); Fail() may be
// called from any thread.
#ifndef FUSIONRL_WORKER_PLAN_RENDEZVOUS_H_
#define FUSIONRL_WORKER_PLAN_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "worker/work_client.h"

namespace fusionrl {

class PlanRendezvous {
 public:
  struct Options {
    std::string job_id;
    std::string node_id;
    int local_cards = 1;
    // How long a card waits for card 0's next publication.
    absl::Duration timeout = absl::Seconds(300);
    // How long one GetStepPlan call may wait at the controller.
    absl::Duration plan_wait = absl::Seconds(kPlanWaitSeconds);
  };

  // `client`, `clock` borrowed; `stopping` is polled by card 0 between
  // calls (the worker is shutting down).
  PlanRendezvous(WorkClient& client, Options options,
                 std::function<bool()> stopping, const Clock& clock);

  // Card `local_rank`'s plan for `step`. Card 0 fetches and publishes every
  // card's plan; the others wait for it (DeadlineExceeded after `timeout`).
  // Cancelled when the worker is stopping.
  absl::StatusOr<StepPlan> NextPlan(int local_rank, int64_t step);

  // One card's plan for `step`, straight from the controller (card 0's END
  // handling asks again by itself).
  absl::StatusOr<StepPlan> GetPlan(int local_rank, int64_t step);

  // Card 0 failed: every waiting and future NextPlan of the other cards
  // returns `status`.
  void Fail(absl::Status status);

 private:
  void Publish(absl::Status status, std::vector<StepPlan> plans);

  WorkClient& client_;
  const Options options_;
  const std::function<bool()> stopping_;
  const Clock& clock_;

  absl::Mutex mu_;
  absl::CondVar published_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<StepPlan> plans_ ABSL_GUARDED_BY(mu_);  // per local rank
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // non-OK: every card returns it
  // The generation each card took last.
  std::vector<int64_t> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_PLAN_RENDEZVOUS_H_
