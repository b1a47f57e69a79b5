// Watching a job from the program that runs it: a StepObserver sees every
// committed step, evaluation and checkpoint, and can stop the job.
//
//   class StopAt : public fusionrl::StepObserver {
//    public:
//     fusionrl::ObserverAction OnStep(const fusionrl::StepMetrics& m) override
//     {
//       return m.reward_mean >= 0.9 ? fusionrl::ObserverAction::kStop
//                                   : fusionrl::ObserverAction::kContinue;
//     }
//   };
//   StopAt observer;
//   fusionrl::RunOptions options;
//   options.observer = &observer;
//   fusionrl::RunRlJob(config, options);
//
// Threading: every callback of one job runs on that job's observer thread
// (a thread the Job handle owns, named in docs/embedding.md), one at a time,
// in the order things happened, and never while a lock of the job or the
// controller is held: a callback may block, call the Job handle
// (Progress(), Cancel()) or do I/O, but not Wait() or destroy the handle
// (both wait for the callbacks to finish). A slow callback delays later
// callbacks, not the job.
// Callbacks run after the fact: when OnStep(k) runs, step k is committed
// and written to metrics.jsonl, and step k + 1 may already be running.
#ifndef FUSIONRL_OBSERVER_H_
#define FUSIONRL_OBSERVER_H_

#include <cstdint>
#include <map>
#include <string>

namespace fusionrl {

// One committed RL step, from its metrics.jsonl record.
struct StepMetrics {
  int64_t step = 0;
  int64_t policy_version = 0;    // trainer version after the step
  double reward_mean = 0;        // mean reward of the step's samples
  double train_accuracy = 0;     // fraction of the step's samples correct
  double tokens_per_second = 0;  // the run's rollout tokens / loop time
  int64_t max_staleness = 0;     // largest version lag trained on
  double rollout_seconds = 0;    // time sampling this step's batch
  double train_seconds = 0;      // time training on it
  double step_seconds = 0;       // the whole step
  int64_t rollout_tokens = 0;    // response tokens in the batch
  double loss = 0;
  double kl = 0;
  // Every numeric field of the record ("entropy", "grad_norm",
  // "staleness_0", "moe_load_3", ...; docs/config.md lists them).
  std::map<std::string, double> fields;
  // The record itself (one JSON object, as in metrics.jsonl).
  std::string json;
};

// A greedy evaluation on the task's held-out split.
struct EvalMetrics {
  int64_t step = 0;  // 0: before step 1 (the initial evaluation)
  double accuracy = 0;
};

// A checkpoint the job wrote (every run.checkpoint_every steps, and at the
// end or a stop).
struct CheckpointInfo {
  int64_t step = 0;  // the last step it contains
  std::string path;  // <output_dir>/checkpoints/<name>
};

enum class ObserverAction {
  kContinue,
  // Stop the job gracefully: it finishes the step in progress, writes a
  // checkpoint and summary.json and ends CANCELLED (resumable with
  // RunOptions::resume). Asking again changes nothing.
  kStop,
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual ObserverAction OnStep(const StepMetrics& metrics) {
    return ObserverAction::kContinue;
  }
  virtual ObserverAction OnEval(const EvalMetrics& eval) {
    return ObserverAction::kContinue;
  }
  virtual void OnCheckpoint(const CheckpointInfo& checkpoint) {}
};

}  // namespace fusionrl

#endif  // FUSIONRL_OBSERVER_H_
