// CardTurns: on an RL Fusion card, whether the trainer and the rollout
// compute at the same time or take turns, and the turn-taking itself.
//
// Running both at once pays where the two roles are bound by different
// resources (a decode step bound by memory bandwidth beside a training step
// bound by FLOPs) and loses where both are bound by the same cores: on two
// CPU cores, a compute-bound trainer on one thread beside a compute-bound
// rollout on the other took 1.7x longer a step and the rollout 5x longer,
// against each on both threads in turn (docs/BENCHMARKS.md "RL Fusion after
// the kernels went parallel"). Which one a card is in depends on the model,
// the batch and the machine, so the card measures it:
//   - concurrent: both compute whenever they have work; each takes the
//     card's threads while the other is idle (card_runner.cc's hooks);
//   - interleaved: the trainer's step and the rollout's decode steps take
//     turns, each on all the card's threads; the rollout samples only while
//     the trainer does not compute (between its steps: waiting for a batch,
//     publishing, evaluating), and a trainer that wants the card waits at
//     most for the decode step in flight.
// Auto (the default): after the first step the card runs a block of steps
// in each mode and keeps the one that generated more rollout tokens per
// second over the block's last steps, and measures again every
// `reprobe_every` steps. The first steps of a block are not counted: the
// rollout runs up to s steps ahead, and a mode that lets it fall behind
// (interleaved) trains from batches the other sampled ahead, fast, until
// the pipeline drains; a comparison of alternating steps picked the
// slower mode that way. Results do not depend on the mode:
// training and the fused decoder do not depend on their thread count, and
// StaleSync's lagged admission fixes which version samples each step
// (docs/stalesync.md), so only the speed changes.
//
// Thread safety: thread-safe. mode()/StepDone() are called by the card's
// main thread; TrainerEnter/TrainerExit by the trainer (the same thread);
// RolloutStep/RolloutIdle by the rollout's sampling thread.
#ifndef FUSIONRL_WORKER_STEP_CARD_TURNS_H_
#define FUSIONRL_WORKER_STEP_CARD_TURNS_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

class CardTurns {
 public:
  enum class Mode { kConcurrent, kInterleaved };

  struct Options {
    bool automatic = true;  // false: always `fixed`
    Mode fixed = Mode::kConcurrent;
    // A probe's block per mode: settle_steps not counted (set it to the
    // policy lag + 1), then counted_steps counted.
    int settle_steps = 3;
    int counted_steps = 3;
    // Steps between probes (after one ends).
    int reprobe_every = 40;
  };

  CardTurns(Options options, const Clock& clock);

  // The mode of the coming step.
  Mode mode() const { return mode_.load(); }
  bool interleaved() const { return mode() == Mode::kInterleaved; }

  // After a training step that ran in mode(): its wall seconds and the
  // tokens its rollout generated. Advances the probe schedule and may
  // change mode().
  void StepDone(double seconds, int64_t tokens);

  // Interleaved: the trainer takes the card (waiting for a decode step in
  // flight, or the rest of a round past its last decode step) and gives it
  // back. DeadlineExceeded after `deadline`, and the card is given back.
  // No-ops while concurrent.
  absl::Status TrainerEnter(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void TrainerExit() ABSL_LOCKS_EXCLUDED(mu_);

  // Interleaved: before each decode step (which also ends the previous
  // one): waits while the trainer has the card. DeadlineExceeded after
  // `deadline`. No-op while concurrent.
  absl::Status RolloutStep(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // The rollout's round ended (no decode step in flight).
  void RolloutIdle() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The mode of a probe's j-th step (0-based), and a block's steps.
  Mode ProbeMode(int64_t j) const;
  int64_t ProbeSteps() const;

  const Options options_;
  const Clock& clock_;
  std::atomic<Mode> mode_;

  // Probe schedule (main thread only).
  int64_t steps_ = 0;           // steps done
  int64_t probe_start_ = 1;     // the step count at which the next probe starts
  double seconds_[2] = {0, 0};  // per mode (0 concurrent), this probe's
  double tokens_[2] = {0, 0};
  Mode chosen_ = Mode::kConcurrent;  // the last probe's pick

  absl::Mutex mu_;
  absl::CondVar changed_;
  bool trainer_ ABSL_GUARDED_BY(mu_) = false;       // has the card
  bool rollout_step_ ABSL_GUARDED_BY(mu_) = false;  // a decode step in flight
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_CARD_TURNS_H_
