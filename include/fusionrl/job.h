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
// Calls block until the job ends; they may run concurrently on different
// output directories.
#ifndef FUSIONRL_JOB_H_
#define FUSIONRL_JOB_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"

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
};

// The synchronous on-policy RL loop: rollout a batch, score, train, repeat.
absl::StatusOr<JobSummary> RunRlJob(const JobConfig& config,
                                    const RunOptions& options = {});

// Supervised warm start on the task's reference solutions.
absl::StatusOr<JobSummary> RunSftJob(const JobConfig& config);

// Greedy accuracy of config.init_checkpoint (or a random init) on the task's
// held-out split.
absl::StatusOr<double> EvaluateJob(const JobConfig& config);

}  // namespace fusionrl

#endif  // FUSIONRL_JOB_H_
