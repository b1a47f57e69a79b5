// Running FusionRL jobs from C++ (what `fusionrl run` and `fusionrl sft` do).
//
//   auto config = fusionrl::LoadJobConfig("job.yaml", {"run.total_steps=50"});
//   if (!config.ok()) { ... }
//   auto summary = fusionrl::RunRlJob(*config);
//
// Each call owns its model, optimizer and files under config.output_dir:
//   metrics.jsonl        one JSON object per step
//   config.yaml          the resolved config
//   checkpoints/<name>/  model.pt, optim.pt, meta.json (atomic directories)
//   summary.json         the JobSummary below, written last
// RunRlJob, RunSftJob and EvaluateJob block until the job ends; Job (below)
// runs an RL job without blocking. Jobs may run concurrently on different
// output directories.
#ifndef FUSIONRL_JOB_H_
#define FUSIONRL_JOB_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fusionrl/config.h"
#include "fusionrl/observer.h"

namespace fusionrl {

struct JobSummary {
  std::string kind;                  // "rl" or "sft"
  double initial_eval_accuracy = 0;  // greedy, held-out split, before step 1
  double final_eval_accuracy = 0;    // greedy, held-out split, after the last
  int64_t steps = 0;                 // RL steps or SFT optimizer steps
  int64_t rollout_tokens = 0;        // response tokens sampled for training
  double wall_seconds = 0;           // whole job, evaluation included
  double tokens_per_second = 0;      // rollout_tokens / time in rollout+train
  double final_train_reward = 0;     // mean reward of the last step's batch
  int64_t policy_version = 0;        // trainer version at the end
  std::string checkpoint_dir;        // the last checkpoint written
  std::string summary_path;          // <output_dir>/summary.json
  bool interrupted = false;          // stopped early on request
  int64_t resumed_from_step = 0;     // 0 = a fresh run
  // StaleSync across super nodes (stalesync.max_clock_skew > 0): the
  // largest difference of two super nodes' training clocks seen, and per
  // super node the CRC-32C of its weights after the last weight sync (all
  // equal: the super nodes adopted the lead's weights).
  int64_t max_clock_skew_seen = 0;
  std::map<std::string, uint32_t> final_weights_crc32c;
};

struct RunOptions {
  // Continue from the newest checkpoint under <output_dir>/checkpoints
  // (written by checkpoint_every, an interruption or the end of a shorter
  // run): weights, optimizer, policy version, data cursor and step. The
  // continuation is exactly the run that was not interrupted.
  bool resume = false;
  // Polled between steps; when it becomes true the job finishes the current
  // step, writes a checkpoint and summary.json (interrupted: true) and
  // returns. Must outlive the call. May be null.
  const std::atomic<bool>* stop_requested = nullptr;
  // Sees every step, evaluation and checkpoint (fusionrl/observer.h) on the
  // job's observer thread. Borrowed: must outlive the job. May be null.
  StepObserver* observer = nullptr;
  // Job::Start only: "host:port" where its in-process controller serves the
  // dashboard, /api/status and /metrics (docs/observability.md); "" = none.
  std::string http_address;
  // Job::Submit only: the controller's shared token ("" = none).
  std::string auth_token;
  // The handle hears of every change of the job as it happens (a watch
  // stream); it renews the stream, and checks stop_requested, this often.
  absl::Duration poll_interval = absl::Seconds(1);
};

// Where a job is in its life (JobStatus.phase in proto/fusionrl/v1/job.proto).
enum class JobPhase {
  kPending,             // accepted, not placed yet
  kWaitingForCapacity,  // its placement cannot be met yet (see message)
  kRunning,
  kSucceeded,  // all steps done
  kFailed,     // stopped by an error (see message)
  kCancelled,  // stopped on request, with a checkpoint
};
const char* JobPhaseName(JobPhase phase);  // "pending", "running", ...

// A snapshot of a job, as the controller last reported it.
struct JobProgress {
  std::string job_id;
  JobPhase phase = JobPhase::kPending;
  std::string message;  // why it waits or failed
  int64_t step = 0;     // steps committed
  int64_t total_steps = 0;
  int64_t policy_version = 0;
  double reward_mean = 0;    // last step's samples
  double eval_accuracy = 0;  // latest held-out accuracy
  double tokens_per_second = 0;
  int64_t groups_trained = 0;
};

// A running RL job that the program can watch, stop and wait for while it
// does other work: the non-blocking form of RunRlJob. Modelled on
// LevelDB's DB: an abstract class made by a static factory that returns a
// status; every method is thread-safe.
//
//   auto job = fusionrl::Job::Start(config, options);
//   if (!job.ok()) { ... }
//   while (...) { auto p = (*job)->Progress(); ... }
//   absl::StatusOr<fusionrl::JobSummary> summary = (*job)->Wait();
//
// Destroying a handle whose job still runs stops the job as Cancel() does
// and waits for it (bounded by run.collective_timeout_seconds per step).
class Job {
 public:
  // Validates `config` (InvalidArgument / NotFound naming the key, as
  // RunRlJob), then starts an in-process controller and one worker per
  // super node and submits the job to them; returns once it is submitted.
  // The workers run on threads of this process, so tasks and rewards
  // registered here are used.
  static absl::StatusOr<std::unique_ptr<Job>> Start(
      const JobConfig& config, const RunOptions& options = {});

  // Submits `config` to a running controller (`fusionrl controller`, or a
  // ControllerServer of fusionrl/cluster.h) at "host:port" over plain-text
  // gRPC, with options.auth_token. Errors: Unavailable when the controller
  // cannot be reached, InvalidArgument for a config it rejects (its
  // message names the key). `options.resume`, `observer`, `stop_requested`
  // and `poll_interval` apply as for Start.
  static absl::StatusOr<std::unique_ptr<Job>> Submit(
      const std::string& controller_address, const JobConfig& config,
      const RunOptions& options = {});

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  virtual ~Job() = default;

  // "job-<n>", as the controller named it.
  virtual std::string id() const = 0;

  // The latest progress the handle has seen (at most one poll interval
  // old). Does not block on the job.
  virtual JobProgress Progress() const = 0;

  // Asks the job to stop after its current step with a checkpoint (it ends
  // CANCELLED; a job not placed yet ends at once). Returns at once;
  // Wait() tells when it has stopped. Idempotent. Unavailable when the
  // controller cannot be told.
  virtual absl::Status Cancel() = 0;

  // Blocks until the job ends and every observer callback has run, or
  // `timeout` passes (DeadlineExceeded; the job goes on). Returns the
  // summary of a SUCCEEDED or CANCELLED job (interrupted: true for the
  // latter) and the job's error for a FAILED one (its canonical code:
  // InvalidArgument for bad input, Internal/Unavailable for faults).
  virtual absl::StatusOr<JobSummary> Wait(
      absl::Duration timeout = absl::InfiniteDuration()) = 0;
};

// The RL job, blocking: Job::Start(config, options) then Wait().
absl::StatusOr<JobSummary> RunRlJob(const JobConfig& config,
                                    const RunOptions& options = {});

// Supervised warm start on the task's reference solutions.
absl::StatusOr<JobSummary> RunSftJob(const JobConfig& config);

// Greedy accuracy of config.init_checkpoint (or a random init) on the task's
// held-out split.
absl::StatusOr<double> EvaluateJob(const JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_JOB_H_
