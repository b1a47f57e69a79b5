// FakeWorkClient: a scripted controller for one job on one node, for unit
// tests of the card loop (CardRunner, PlanRendezvous, FusedRollout) without
// gRPC or a JobManager. In the spirit of c10d's FakeProcessGroup, it has
// fault switches: an attempt that another (imaginary) node aborts, an error
// injected into a collective round, slow plans, a failing FinishStep, a
// StaleSync job whose controller restarts after a commit.
//
// Plans: steps 1..total_steps, one card (local rank 0), prompt groups
// (s - 1) * P .. s * P - 1 for step s, then END with the "final"
// checkpoint. A step advances when its FinishStep report arrives.
// An attempt planned "with a twin node" has nodes = world_size = 2; its
// Reduce rounds answer the payload doubled (an identical second node).
//
// Thread safety: every method may be called from any thread.
#ifndef FUSIONRL_WORKER_FAKE_WORK_CLIENT_H_
#define FUSIONRL_WORKER_FAKE_WORK_CLIENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/work_client.h"

namespace fusionrl {

class FakeWorkClient final : public WorkClient {
 public:
  FakeWorkClient(int64_t total_steps, int prompts_per_step)
      : total_steps_(total_steps), prompts_per_step_(prompts_per_step) {}

  // --- fault switches (set before the run) ---------------------------------
  // Attempt 1 of `step` runs with a twin node that is lost once the card
  // trained the step: its FinishStep answers "not committed" (or, with
  // `at_first_round`, its first Reduce round answers ABORTED, before any
  // weight moved) and attempt 2 runs alone.
  void AbortFirstAttemptOf(int64_t step, bool at_first_round = false) {
    absl::MutexLock l(&mu_);
    abort_step_ = step;
    abort_at_first_round_ = at_first_round;
  }
  // `step` runs with a twin node and its first Reduce round answers `error`.
  void FailReduceAt(int64_t step, absl::Status error) {
    absl::MutexLock l(&mu_);
    fail_reduce_step_ = step;
    reduce_error_ = std::move(error);
  }
  // Every GetStepPlan first answers kWait this many times.
  void WaitPlansFirst(int times) {
    absl::MutexLock l(&mu_);
    waits_left_ = times;
  }
  // StaleSync clock skew (k = 1) with a twin super node: every step
  // exchanges its update (nodes = 2; the twin's update equals the card's,
  // so the merged update is the card's own) and syncs the weights at every
  // `sync_every`-th step and the last. With `restart_after` > 0 the
  // controller is killed right after it committed step `restart_after`
  // (attempt 1), before its answer reached the card: the restarted
  // controller rolls the job back to its last weight sync, answers the
  // card's retried report "not committed" (an attempt it rolled back) and
  // plans the step after that sync as attempt 2 with rollback_to_step set.
  void Skewed(int64_t sync_every, int64_t restart_after = -1) {
    absl::MutexLock l(&mu_);
    skew_sync_every_ = sync_every;
    restart_after_ = restart_after;
  }

  // --- what the card sent ----------------------------------------------------
  std::vector<StepReport> reports() const {
    absl::MutexLock l(&mu_);
    return reports_;
  }
  // Committed steps, in order, with the attempt that committed each.
  std::vector<std::pair<int64_t, int>> committed() const {
    absl::MutexLock l(&mu_);
    return committed_;
  }
  int reduce_calls() const {
    absl::MutexLock l(&mu_);
    return reduce_calls_;
  }

  // --- WorkClient ------------------------------------------------------------
  absl::StatusOr<Assignment> GetAssignment(const std::string& node_id,
                                           absl::Duration wait) override;
  absl::StatusOr<StepPlan> GetStepPlan(const std::string& job_id,
                                       const std::string& node_id,
                                       int local_rank, int64_t step,
                                       absl::Duration wait) override;
  absl::StatusOr<std::string> Reduce(ReduceCall call,
                                     absl::Duration timeout) override;
  absl::StatusOr<bool> FinishStep(const StepReport& report,
                                  absl::Duration timeout) override;
  absl::StatusOr<std::vector<ReceivedUpdate>> ExchangeUpdates(
      UpdateCall call, absl::Duration timeout) override;
  absl::Status PublishWeights(const std::string& key, int64_t step,
                              const std::string& super_node,
                              const std::string& blob,
                              absl::Duration timeout) override;
  absl::StatusOr<std::string> FetchWeights(const std::string& key, int64_t step,
                                           absl::Duration timeout) override;
  absl::StatusOr<StoreReply> Store(const StoreCall& call,
                                   absl::Duration timeout) override;

 private:
  bool TwinLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SyncStepLocked(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t total_steps_;
  const int prompts_per_step_;
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 1;  // the step being planned
  int attempt_ ABSL_GUARDED_BY(mu_) = 1;
  bool abort_at_first_round_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  int64_t abort_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t fail_reduce_step_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status reduce_error_ ABSL_GUARDED_BY(mu_);
  int waits_left_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skew_sync_every_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not skewed
  int64_t restart_after_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t last_sync_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rollback_to_ ABSL_GUARDED_BY(mu_) = -1;
  int reduce_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<StepReport> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int>> committed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> weights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_FAKE_WORK_CLIENT_H_
