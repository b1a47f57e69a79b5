// Job outputs: every job's <output_dir>/{config.yaml, metrics.jsonl,
// summary.json} and the run totals next to its checkpoints (run.json), written
// by a queue that the JobManager fills under its lock and flushes after
// releasing it, so no file I/O happens under the manager's lock.
//
// The manager queues what to write (cheap: the text is prepared, nothing is
// opened) in the order its state changed: a job's Open when it starts, one
// Append per committed step, its Close (with the summary when it succeeded
// or was cancelled) when it ends. Every manager call that may have queued
// something calls Flush() once its lock is released.
//
// Invariants (what the manager relies on):
//   * Order: ops are performed in the order they were queued, one FIFO for
//     all jobs, by one writer at a time. So a job's Open comes before its
//     appends, which come before its Close; and when a second job writes to
//     the same output_dir (a resume after a cancel), the first job's Close
//     comes before the second job's Open (which truncates metrics.jsonl).
//   * A job finishing while its writes are pending: its Close is queued
//     after them, and its Result is reported only once it has been
//     performed. The manager publishes a job's terminal phase only from that
//     Result, so whoever sees a job SUCCEEDED, CANCELLED or FAILED finds all
//     of its metrics lines and its summary.json on disk.
//   * Flush() returns once every op queued before the call (and every op
//     queued by `on_result` meanwhile) has been performed, by this thread or
//     by the writer it waited for. A manager call that flushed before
//     returning has therefore written what it queued, as if it had written
//     it itself.
//
// Thread safety: thread-safe. Lock order: write_mu_ (held while performing
// ops and calling `on_result`) -> whatever `on_result` locks -> queue_mu_
// (taken by the queueing calls). Hence: never call Flush() while holding a
// lock that `on_result` takes, and never from `on_result`.
#ifndef FUSIONRL_CONTROLLER_OUTPUTS_JOB_OUTPUTS_H_
#define FUSIONRL_CONTROLLER_OUTPUTS_JOB_OUTPUTS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "controller/outputs/tensorboard.h"
#include "core/checkpoint_meta.h"
#include "core/metrics.h"
#include "core/step_protocol.h"
#include "fusionrl/job.h"

namespace fusionrl {

class JobOutputs {
 public:
  // What a starting job writes.
  struct OpenSpec {
    std::string output_dir;   // created with its checkpoints/ folder
    std::string config_yaml;  // written to config.yaml (the resolved config)
    // Resuming: keep the metrics records of steps <= this one and append;
    // unset: start metrics.jsonl afresh.
    std::optional<int64_t> resume_after_step;
    // run.tensorboard: also write every record's numbers as TensorBoard
    // scalars to <output_dir>/tensorboard/events.out.tfevents.* (a new file
    // per Open; controller/outputs/tensorboard.h).
    bool tensorboard = false;
  };

  // What an Open or a Close did, for the manager.
  struct Result {
    enum class Kind { kOpened, kClosed };
    std::string job_id;
    Kind kind = Kind::kOpened;
    // kOpened: the outputs could not be created (the job must fail with
    // this status). kClosed: summary.json could not be written.
    absl::Status status;
    bool wrote_summary = false;  // kClosed: summary.json written
    std::string summary_json;    // kClosed: its text, read back once
  };

  JobOutputs() = default;
  JobOutputs(const JobOutputs&) = delete;
  JobOutputs& operator=(const JobOutputs&) = delete;
  // Ops still queued are dropped (the manager flushes before every return).
  ~JobOutputs();

  // --- queueing (no I/O; call in the order the effects must happen) ------
  void Open(const std::string& job_id, OpenSpec spec)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // One metrics.jsonl line (a JSON object, no newline). Lines of a job whose
  // Open failed are dropped; a failed write is logged, as before.
  void Append(const std::string& job_id, std::string json_line)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Drops the metrics records of steps after `last_step` (a StaleSync job
  // rolled back to its last weight sync runs them again); later Appends go
  // after the records kept. A failed rewrite is logged.
  void RollBack(const std::string& job_id, int64_t last_step)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Writes `totals` to <checkpoint_dir>/run.json (core/checkpoint_meta.h); a
  // failed write is logged (a resume from that checkpoint then starts its
  // totals afresh).
  void SaveRunTotals(const std::string& job_id, std::string checkpoint_dir,
                     RunTotals totals) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Closes metrics.jsonl; with `summary`, writes summary.json first
  // (summary->summary_path).
  void Close(const std::string& job_id, std::optional<JobSummary> summary)
      ABSL_LOCKS_EXCLUDED(queue_mu_);

  // --- writing -------------------------------------------------------------
  // Performs the queued ops in order and hands the Result of every Open and
  // Close to `on_result` (with write_mu_ held, in queue order). Returns at
  // once when nothing is queued or being written.
  void Flush(absl::FunctionRef<void(const Result&)> on_result)
      ABSL_LOCKS_EXCLUDED(write_mu_, queue_mu_);

  // Ops queued and not yet performed.
  int64_t pending() const ABSL_LOCKS_EXCLUDED(queue_mu_);

 private:
  struct Op {
    enum class Kind { kOpen, kAppend, kRollBack, kRunTotals, kClose };
    Kind kind = Kind::kAppend;
    std::string job_id;
    OpenSpec open;                      // kOpen
    std::string line;                   // kAppend
    int64_t last_step = 0;              // kRollBack
    std::string checkpoint_dir;         // kRunTotals
    RunTotals totals;                   // kRunTotals
    std::optional<JobSummary> summary;  // kClose
  };

  void Queue(Op op) ABSL_LOCKS_EXCLUDED(queue_mu_);
  std::optional<Result> Perform(Op& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // Held by the one thread performing ops.
  absl::Mutex write_mu_;
  // Open metrics logs by job id (a job whose Open failed has none).
  std::map<std::string, std::unique_ptr<TensorBoardWriter>> tensorboard_
      ABSL_GUARDED_BY(write_mu_);
  std::map<std::string, std::unique_ptr<MetricsLog>> logs_
      ABSL_GUARDED_BY(write_mu_);

  mutable absl::Mutex queue_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::deque<Op> queue_ ABSL_GUARDED_BY(queue_mu_);
  int64_t queued_ ABSL_GUARDED_BY(queue_mu_) = 0;     // ops ever queued
  int64_t performed_ ABSL_GUARDED_BY(queue_mu_) = 0;  // ops ever performed
};

// A committed step's metrics.jsonl line, formatted once (the only place a
// step's record becomes JSON), with the two values of the progress line.
struct StepRecordLine {
  std::string json;  // "" when there is nothing to write
  double response_len_mean = 0;
  double kl = 0;
};

// The record of a step from the lead's typed `metrics`, or, when those are
// empty, from `metrics_json` (a report that came over the wire), followed by
// the controller's own fields of the step (`job_fields`: run-level figures
// such as tokens_per_second, and the StaleSync clock skew). Both forms give
// the same line for the same values (integral values without a fraction,
// non-finite ones as null). No line when there are no metrics, or when
// `metrics_json` is not a JSON object.
StepRecordLine FormatStepRecord(const MetricFields& metrics,
                                const std::string& metrics_json,
                                const MetricFields& job_fields);

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_OUTPUTS_JOB_OUTPUTS_H_
