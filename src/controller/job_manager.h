// JobManager: the controller's jobs and the protocol of one step (see
// proto/fusionrl/v1/work.proto for the message flow).
//
// State: every job, its placement (which nodes and cards), the prompt-group
// ledger, the current step attempt with its collective rounds, run totals,
// events. All of it is guarded by one mutex; calls that wait (long polls,
// collective rounds, the end-of-step barrier) wait on one condition variable
// with a deadline on the injected Clock, so every wait ends: with the
// answer, with ABORTED (the attempt was abandoned because a node was lost),
// or with DEADLINE_EXCEEDED naming what it waited for.
//
// Jobs: PENDING -> (WAITING_FOR_CAPACITY ->) RUNNING -> SUCCEEDED | FAILED |
// CANCELLED. A job is placed (Scheduler::Place) on free nodes of the
// registry, one worker node per participant; a node runs one job at a time.
// The job writes <output_dir>/{config.yaml,metrics.jsonl,summary.json}; the
// lead card writes the checkpoints into <output_dir>/checkpoints.
//
// Outputs and the lock: no file is touched under mu_. The state changes
// queue their writes (JobOutputs, in order), and every call that may have
// queued some flushes the queue after releasing mu_ and before it returns
// (FlushOnExit), so a caller finds its writes done when the call returns.
// A job that ends is over for the protocol at once (its nodes are released,
// its plans say ABANDON), but its terminal phase is published (Status,
// Idle, WaitForUpdate) only once its Close has been written: whoever sees a
// job SUCCEEDED, CANCELLED or FAILED finds every metrics line and
// summary.json on disk. A failure to write summary.json turns the end into
// FAILED ("writing summary: ..."), as before.
//
// Liveness: NodesLost() (from the controller's sweeper) removes a node from
// its job; the current attempt is aborted and replanned over the live nodes
// with the lost node's groups re-queued (GroupLedger), so every submitted
// group is trained exactly once. The job fails, with the reason, when no
// node is left or the step's groups cannot be split evenly over the cards
// that are left.
//
// Rooms. JobManager is a facade in the shape of LevelDB's DBImpl: one class
// that owns the mutex and the jobs, its methods implemented across files
// that each hold one part of the protocol, in the order a step runs:
//   job_queue.cc       submission, the queue, placement, start, the end of
//                      a job (Submit, Schedule, TryPlace, Start, Cancel)
//   sync_step.cc       the synchronous step: attempt planning, the step
//                      plan, the end-of-step barrier, commit
//   skewed_step.cc     StaleSync across super nodes: steps planned as nodes
//                      reach them behind the clock-skew gate, committed in
//                      order
//   reduce_round.cc    a cross-node reduce round (the arithmetic is the pure
//                      SumPayloads of reduce_sum.h)
//   update_exchange.cc StaleSync's update exchange
//   job_outputs.h      config.yaml / metrics.jsonl / summary.json, written
//                      by a queue outside this class's lock
//   status_view.cc     the status views (job_view.h)
//   job_state_io.cc    the state journal's records <-> the jobs
//   job_manager.cc     lookups, events, assignments, lost nodes
// One class rather than helper classes taking `Job&`: every part needs the
// same lock, condition variable, clock, FailLocked() and EventLocked(), and
// the parts call each other (a commit plans the next step, a lost node
// replans the attempt); passing those around would hide the one lock that
// makes the protocol sequential. Pure parts (the sum, the file writer, the
// record formatting) are free functions or classes of their own and are
// tested alone. The job and attempt structs are in job_state.h.
//
// Types: the manager speaks plain structs only: core/step_protocol.h for
// the step protocol, job_view.h for what it reports. In-process callers
// (local/in_process_work_client.h) call it directly; the gRPC services
// convert at their edge (job_manager_proto.h), so every caller runs the
// same code. The one wire type left here is the state journal's record
// (v1::JobState, declared only): the journal's persistent format, made and
// read in job_state_io.cc.
//
// Thread safety: all methods may be called from any thread.
#ifndef FUSIONRL_CONTROLLER_JOB_MANAGER_H_
#define FUSIONRL_CONTROLLER_JOB_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/job_view.h"
#include "controller/outputs/job_outputs.h"
#include "controller/rendezvous_store.h"
#include "core/clock.h"
#include "core/node_registry.h"
#include "core/step_protocol.h"

namespace fusionrl {
namespace v1 {
class JobState;  // proto/fusionrl/v1/state.proto: the journal's record
class AttemptState;
}  // namespace v1

// A job as the manager takes it. `config` is resolved and valid
// (ParseJobConfig, or ResolveJobConfig for one built in code);
// config.source_path, when set, names it in messages.
struct JobSubmission {
  JobConfig config;
  bool resume = false;  // continue from the newest committed checkpoint
  // In-process callers (the embedded `fusionrl run`): read at every step
  // commit; once true, the job stops as with Cancel(). Borrowed, must
  // outlive the job. Given with the job, so a step that commits before the
  // caller gets the id back still sees it: exact to the step, unlike a
  // CancelJob call racing it.
  const std::atomic<bool>* stop_flag = nullptr;
};

class JobManager {
 public:
  // Borrows both; they must outlive the manager. Every deadline and time
  // stamp is on `clock`.
  JobManager(NodeRegistry& registry, const Clock& clock);
  ~JobManager();

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  const Clock& clock() const { return clock_; }

  // --- JobService ---------------------------------------------------------
  // Checks what this version can run (FailedPrecondition), finds the
  // checkpoint to resume from (NotFound) and queues the job. Returns the job
  // id ("job-<n>"). The config travels as the struct: an in-process caller
  // (the local Job handle) passes its own, resolved (ResolveJobConfig).
  absl::StatusOr<std::string> Submit(JobSubmission submission)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobStatus> Status(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<JobStatus> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every node the registry knows (with the unfinished job it works for and
  // its cards' last states) and every job, newest first; the caller fills
  // version, time and uptime.
  ClusterView Cluster() const ABSL_LOCKS_EXCLUDED(mu_);
  // The job's step records with seq > after_seq (JobHistory's comment).
  absl::StatusOr<JobHistory> History(const std::string& job_id,
                                     int64_t after_seq) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records kept per job (the newest).
  static constexpr size_t kHistoryLimit = 4096;
  // Stops the job gracefully: after the current step the lead writes a
  // checkpoint ("step_<n>") and the job ends CANCELLED (resumable).
  absl::StatusOr<JobStatus> Cancel(const std::string& job_id,
                                   const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the job changed after `seen_update` (or `deadline`, on the
  // manager's clock); returns its status and sets `*update` to the current
  // change counter.
  absl::StatusOr<JobStatus> WaitForUpdate(const std::string& job_id,
                                          uint64_t seen_update,
                                          absl::Time deadline,
                                          uint64_t* update) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- the step protocol (WorkService) --------------------------------------
  // `wait` / `timeout`: how long the call may wait, at most 60 s for the
  // long polls (InvalidArgument otherwise); the job's collective timeout
  // applies as well to Reduce, FinishStep and ExchangeUpdates.
  //
  // The next job for `node_id` (empty job_id: none within `wait`).
  absl::StatusOr<Assignment> GetAssignment(const std::string& node_id,
                                           absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Card `local_rank` of `node_id`: its plan of `step` (0: the job's first),
  // kWait when it is not planned within `wait`.
  absl::StatusOr<StepPlan> GetStepPlan(const std::string& job_id,
                                       const std::string& node_id,
                                       int local_rank, int64_t step,
                                       absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The sum of the attempt's nodes' payloads of `call.round`, in node order.
  absl::StatusOr<std::string> Reduce(ReduceCall call, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The end of an attempt on one node; true when the step committed. The
  // lead's typed metrics are formatted to JSON once, here.
  absl::StatusOr<bool> FinishStep(const StepReport& report,
                                  absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, for a report whose lead metrics arrived formatted (the wire's
  // metrics_json, a JSON object): kept as they came.
  absl::StatusOr<bool> FinishStep(const StepReport& report,
                                  std::string metrics_json,
                                  absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // StaleSync across super nodes: hands in the node's update and returns the
  // other nodes' updates that are due, oldest first per node. A set
  // `call.crc32c` is checked against the payload (DataLoss).
  absl::StatusOr<std::vector<ReceivedUpdate>> ExchangeUpdates(
      UpdateCall call, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // The c10d data plane's rendezvous (controller/rendezvous_store.h): one store
  // operation of a node of the job, on the job's current rendezvous
  // generation. Aborted when `call.generation` is not (or no longer) the
  // current one: the group must be re-formed at the generation of the next
  // plan. Waits (kGet, kWait) end at `timeout`, the job's collective timeout
  // or the generation's end, whichever comes first.
  absl::StatusOr<StoreReply> Store(const StoreCall& call,
                                   absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Tensor bytes that went through this controller (Reduce, ExchangeUpdates
  // payloads in and out), all jobs together. The c10d data plane keeps it
  // at 0; weight versions served by the WeightService are counted by its
  // store (WeightStore::Stats).
  int64_t tensor_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Where a job's WeightService bytes (versions published and fetched
  // through this controller) are counted: they are part of the job's
  // controller_tensor_bytes in its status and records. Set once, before
  // jobs run (Controller::Start).
  void SetWeightBytesSource(std::function<int64_t(const std::string&)> source)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- cluster events -----------------------------------------------------
  // Nodes the registry declared lost (or that left).
  void NodesLost(const std::vector<std::string>& node_ids,
                 const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Places waiting jobs on free nodes; call after registrations and
  // periodically.
  void Schedule() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops every running job gracefully and cancels queued ones.
  void StopAll(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // True when no job is pending or running (every job's end is published,
  // its outputs written).
  bool Idle() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until Idle() or `deadline` (on the manager's clock); returns
  // Idle().
  bool WaitIdle(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

  // The watchdog (called periodically by the controller): a running job
  // with no step committed for `stall_timeout` gets an event naming what
  // each of its cards is doing ("card node-3/0: all-reduce round 2 of step
  // 41 for 95 s", from heartbeats), then, per `action`, its step in flight
  // is replanned (a StaleSync job rolls back to its last weight sync; at
  // most kMaxDataPlaneAborts times in a row) or the job fails with that
  // text. A step on a single node cannot be replanned (it keeps no state
  // to restart from): that job fails. Zero timeout: off.
  enum class StallAction { kReplan, kFail };
  void CheckStalls(absl::Duration stall_timeout, StallAction action)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Cards' last reported states, for status (from heartbeats).
  void RecordCardStates(const std::string& node_id,
                        std::vector<CardReport> cards) ABSL_LOCKS_EXCLUDED(mu_);

  // --- state for a restarted controller (job_state_io.cc) -----------------
  // Receives the whole state of every job that changed, in change order,
  // before any call that changed it returns (so nothing is acknowledged
  // that a crash can take back); an error is logged (the state on disk
  // then lags; docs/cluster.md#controller-restart). Set before serving.
  using StateSink =
      std::function<absl::Status(std::vector<v1::JobState> changed)>;
  void SetStateSink(StateSink sink) ABSL_LOCKS_EXCLUDED(mu_, journal_mu_);
  // Every job's state, and the next job number.
  std::vector<v1::JobState> SaveAll(uint64_t* next_job) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Before serving: puts back the jobs of a controller that stopped. Jobs
  // that were running continue from their last committed step: an attempt
  // spanning several nodes is replanned (its nodes restore the step's
  // start), a single node's attempt is kept (its FinishStep may still
  // arrive), a skewed job rolls back to its last weight sync. Their
  // metrics.jsonl keeps the committed steps' records.
  absl::Status Restore(const std::vector<v1::JobState>& jobs, uint64_t next_job)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job;
  struct Attempt;
  struct ReportedStep;
  struct SkewedProtocol;
  class FlushOnExit;

  // --- job_manager.cc ---
  Job* FindLocked(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's tensor bytes through this controller: its sums and updates
  // (Job::tensor_bytes) and its WeightService bytes.
  int64_t ControllerBytesLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job*> JobForNodeLocked(const std::string& job_id,
                                        const std::string& node_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EventLocked(Job& job, const std::string& text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job is over for the protocol (its terminal phase may still wait
  // for its outputs to be written before it is published).
  static bool Terminal(const Job& job);
  // Its terminal phase is published (Status shows it).
  static bool Settled(const Job& job);
  // Writes the queued outputs and applies their results; called after the
  // lock is released, by every call that may have queued some.
  void FlushOutputs() ABSL_LOCKS_EXCLUDED(mu_);
  void ApplyOutputResultLocked(const JobOutputs::Result& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- job_queue.cc ---
  void TryPlaceLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJobLocked(Job& job, JobPhase phase, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the end decided by FinishJobLocked, once the job's outputs
  // are written (`closed`: the Close result; null when it had none).
  void PublishEndLocked(Job& job, const JobOutputs::Result* closed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Job& job, const std::string& message, int code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- sync_step.cc ---
  // Plans attempt 1 (new step) or the next attempt of the current step.
  void PlanStepLocked(Job& job, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A node could not finish attempt (step, attempt) for a reason a replan
  // may cure (a collective of the data plane failed): the attempt is
  // aborted and the step replanned, at most kMaxDataPlaneAborts times in a
  // row before the job fails.
  void AbortAttemptLocked(Job& job, int64_t step, int attempt,
                          const std::string& node_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr int kMaxDataPlaneAborts = 3;
  // The attempt PlanStepLocked would install (groups taken from the
  // ledger), or null after failing the job.
  std::unique_ptr<Attempt> MakeAttemptLocked(Job& job, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Node `k` of attempt `a`, card `local_rank`: its TRAIN plan.
  StepPlan TrainPlanLocked(const Job& job, const Attempt& a, int k,
                           int local_rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The END plan for card `local_rank` of part `index` (rank 0: it writes
  // the last checkpoint).
  StepPlan EndPlanLocked(const Job& job, int index, int local_rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A synchronous job's TRAIN plan of step `want` for part `index`, or
  // nullopt to wait.
  absl::StatusOr<std::optional<StepPlan>> SyncPlanLocked(const Job& job,
                                                         int index,
                                                         int local_rank,
                                                         int64_t want) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<bool> FinishStepImpl(ReportedStep r, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CommitLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Run totals, the metrics record and the progress line of a committed
  // attempt's lead report.
  // Appends a HistoryRecord (nothing when it carries nothing).
  void AddHistoryLocked(Job& job, int64_t step, std::string metrics_json,
                        double eval_accuracy, std::string checkpoint_dir)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordStepLocked(Job& job, const Attempt& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginEndLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The totals written next to a checkpoint of `job` (run.json).
  RunTotals RunTotalsLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- skewed_step.cc ---
  // Skewed jobs: the attempt of step `want` for part `index` (planned now if
  // the clock-skew gate lets the node start it), or null to wait.
  absl::StatusOr<const Attempt*> SkewedAttemptLocked(Job& job, int index,
                                                     int64_t want)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<bool> FinishSkewedStepLocked(Job& job, ReportedStep& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `step` of a skewed job ends in a weight sync (a checkpoint step
  // or the last one).
  static bool IsSyncStep(const Job& job, int64_t step);
  // Rolls a skewed job back to its last committed weight sync R
  // (docs/stalesync.md#losing-a-super-node): every step after R is
  // uncommitted (its prompt groups pending again, its metrics records
  // dropped), every attempt in flight abandoned, and the live nodes start
  // again at R + 1 in a new attempt (the next skew epoch) and a new
  // rendezvous generation. Fails the job instead after
  // kMaxDataPlaneAborts roll-backs with no step committed in between.
  void RollBackSkewedLocked(Job& job, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- update_exchange.cc ---
  // ExchangeUpdates' steps: part `me` hands in `u` (its payload moved;
  // InvalidArgument unless its key grows and its size matches the others',
  // which fails the job), then waits until every other live part handed
  // in (due_step, round) (Aborted if the job ends or rolls back past
  // `epoch`, DeadlineExceeded naming the missing parts).
  absl::Status HandInUpdateLocked(Job& job, int me, UpdateCall& u, uint32_t crc)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitUpdatesLocked(const Job& job, int me, const UpdateCall& u,
                                  int epoch, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- job_state_io.cc ---
  v1::JobState SaveJobLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreJobLocked(const v1::JobState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The skewed protocol's fields of a job's state.
  static void SaveSkewed(const SkewedProtocol& skew, v1::JobState& s);
  // RestoreJobLocked's steps: the job as `s` says (its config, phase,
  // parts, ledger and totals), then, for a running job, its outputs
  // reopened and its protocol continued (a skewed job rolls back to its
  // last weight sync; a synchronous one continues or replans its attempt).
  absl::StatusOr<std::unique_ptr<Job>> JobFromState(
      const v1::JobState& s) const;
  static absl::Status RestoreLedger(const v1::JobState& s, Job& j);
  static void RestoreTotals(const v1::JobState& s, Job& j);
  void ReopenLocked(Job& j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RestoreSkewedLocked(Job& j, const v1::JobState& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::StatusOr<std::unique_ptr<Attempt>> AttemptFromState(
      const v1::AttemptState& c, const Job& j);
  absl::Status RestoreAttemptLocked(Job& j, const v1::JobState& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the jobs changed since the last call to the sink (FlushOutputs).
  void JournalChanges() ABSL_LOCKS_EXCLUDED(mu_, journal_mu_);

  // --- status_view.cc ---
  JobStatus StatusLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The rendezvous scope of a job's generation ("<job>/<generation>").
  static std::string RendezvousScope(const Job& job, int64_t generation);
  // The job's own scope (kJobRendezvousScope): open until the job ends.
  static std::string JobRendezvousScope(const Job& job);

  NodeRegistry& registry_;
  const Clock& clock_;
  // The c10d data plane's rendezvous (internally synchronised; called with
  // or without mu_, never calls back).
  RendezvousStore rendezvous_;
  // The file writer (internally synchronised; see job_outputs.h for the
  // lock order: its writer lock, then mu_, then its queue lock).
  JobOutputs outputs_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;
  std::map<uint64_t, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  // node id -> job id it runs.
  std::map<std::string, std::string> node_job_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<CardReport>> card_states_
      ABSL_GUARDED_BY(mu_);
  int64_t tensor_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<int64_t(const std::string&)> weight_bytes_ ABSL_GUARDED_BY(mu_);
  // Orders the journal's writers: a job's states reach the sink in the
  // order they were taken (lock order: journal_mu_, then mu_).
  absl::Mutex journal_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  StateSink sink_ ABSL_GUARDED_BY(journal_mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_JOB_MANAGER_H_
