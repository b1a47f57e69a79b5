// JobManager: the controller's jobs and the protocol of one step (see
// proto/fusionrl/v1/work.proto for the message flow).
//
// State: every job, its placement (which nodes and cards), the prompt-group
// ledger, the current step attempt with its collective rounds, run totals,
// events. All of it is guarded by one mutex; calls that wait (long polls,
// collective rounds, the end-of-step barrier) wait on one condition variable
// with a deadline, so every wait ends: with the answer, with ABORTED (the
// attempt was abandoned because a node was lost), or with DEADLINE_EXCEEDED
// naming what it waited for.
//
// Jobs: PENDING -> (WAITING_FOR_CAPACITY ->) RUNNING -> SUCCEEDED | FAILED |
// CANCELLED. A job is placed (Scheduler::Place) on free nodes of the
// registry, one worker node per participant; a node runs one job at a time.
// The job writes <output_dir>/{config.yaml,metrics.jsonl,summary.json}; the
// lead card writes the checkpoints into <output_dir>/checkpoints.
//
// Liveness: NodesLost() (from the controller's sweeper) removes a node from
// its job; the current attempt is aborted and replanned over the live nodes
// with the lost node's groups re-queued (GroupLedger), so every submitted
// group is trained exactly once. The job fails, with the reason, when no
// node is left or the step's groups cannot be split evenly over the cards
// that are left.
//
// Thread safety: all methods may be called from any thread.
#ifndef FUSIONRL_CONTROLLER_JOB_MANAGER_H_
#define FUSIONRL_CONTROLLER_JOB_MANAGER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "core/node_registry.h"
#include "fusionrl/v1/common.pb.h"
#include "fusionrl/v1/job.pb.h"
#include "fusionrl/v1/work.pb.h"

namespace fusionrl {

class JobManager {
 public:
  JobManager(NodeRegistry& registry, const Clock& clock);
  ~JobManager();

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // --- JobService ---------------------------------------------------------
  // Parses and validates the job (InvalidArgument / NotFound with the key,
  // as `fusionrl validate`), checks what this version can run
  // (FailedPrecondition) and queues it. Returns the job id ("job-<n>").
  absl::StatusOr<std::string> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::JobStatus> Status(const std::string& job_id) const;
  std::vector<v1::JobStatus> List() const;
  // Stops the job gracefully: after the current step the lead writes a
  // checkpoint ("step_<n>") and the job ends CANCELLED (resumable).
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id,
                                       const std::string& reason);
  // In-process callers (the embedded `fusionrl run`): `flag` (borrowed, must
  // outlive the job) is read at every step commit; once true, the job stops
  // as with Cancel(). Exact to the step, unlike a CancelJob call racing it.
  absl::Status SetStopFlag(const std::string& job_id,
                           const std::atomic<bool>* flag);
  // Waits until the job changed after `seen_update` (or `deadline`);
  // returns its status and sets `*update` to the current change counter.
  absl::StatusOr<v1::JobStatus> WaitForUpdate(const std::string& job_id,
                                              uint64_t seen_update,
                                              absl::Time deadline,
                                              uint64_t* update) const;

  // --- WorkService --------------------------------------------------------
  absl::StatusOr<v1::GetAssignmentResponse> GetAssignment(
      const v1::GetAssignmentRequest& request);
  absl::StatusOr<v1::StepPlan> GetStepPlan(const v1::GetStepPlanRequest& r);
  // `deadline`: the caller's own deadline (the job's collective timeout
  // applies as well).
  absl::StatusOr<std::string> Reduce(const v1::ReduceRequest& request,
                                     absl::Time deadline);
  absl::StatusOr<v1::FinishStepResponse> FinishStep(
      const v1::FinishStepRequest& request, absl::Time deadline);

  // StaleSync across super nodes: see proto/fusionrl/v1/work.proto. `deadline`:
  // the caller's own (the job's collective timeout applies as well).
  absl::StatusOr<v1::ExchangeUpdatesResponse> ExchangeUpdates(
      const v1::ExchangeUpdatesRequest& request, absl::Time deadline);

  // --- cluster events -----------------------------------------------------
  // Nodes the registry declared lost (or that left).
  void NodesLost(const std::vector<std::string>& node_ids,
                 const std::string& why);
  // Places waiting jobs on free nodes; call after registrations and
  // periodically.
  void Schedule();
  // Stops every running job gracefully and cancels queued ones.
  void StopAll(const std::string& reason);
  // True when no job is pending or running.
  bool Idle() const;
  // Waits until Idle() or `deadline`; returns Idle().
  bool WaitIdle(absl::Time deadline) const;

  // Cards' last reported states, for status (from heartbeats).
  void RecordCardStates(const std::string& node_id,
                        const std::vector<v1::CardState>& cards);

 private:
  struct Job;
  struct Attempt;

  Job* FindLocked(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> JobForNodeLocked(const std::string& job_id,
                                        const std::string& node_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TryPlaceLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans attempt 1 (new step) or the next attempt of the current step.
  void PlanStepLocked(Job& job, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt PlanStepLocked would install (groups taken from the
  // ledger), or null after failing the job.
  std::unique_ptr<Attempt> MakeAttemptLocked(Job& job, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Node `k` of attempt `a`, card `local_rank`: its TRAIN plan.
  void FillTrainPlanLocked(const Job& job, const Attempt& a, int k,
                           int local_rank, v1::StepPlan* plan) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Skewed jobs: the attempt of step `want` for part `index` (planned now if
  // the clock-skew gate lets the node start it), or null to wait.
  absl::StatusOr<const Attempt*> SkewedAttemptLocked(Job& job, int index,
                                                     int64_t want)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::FinishStepResponse> FinishSkewedStepLocked(
      Job& job, const v1::FinishStepRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginEndLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJobLocked(Job& job, v1::JobPhase phase, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Job& job, const std::string& message, int code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EventLocked(Job& job, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobStatus StatusLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Terminal(const Job& job);

  NodeRegistry& registry_;
  const Clock& clock_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;
  std::map<uint64_t, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  // node id -> job id it runs.
  std::map<std::string, std::string> node_job_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::CardState>> card_states_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_JOB_MANAGER_H_
