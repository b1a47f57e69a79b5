#include "worker/step/card_turns.h"

#include <algorithm>

namespace fusionrl {

CardTurns::CardTurns(Options options, const Clock& clock)
    : options_(options),
      clock_(clock),
      mode_(options.automatic ? Mode::kConcurrent : options.fixed) {}

CardTurns::Mode CardTurns::ProbeMode(int64_t j) const {
  return j < ProbeSteps() ? Mode::kConcurrent : Mode::kInterleaved;
}

int64_t CardTurns::ProbeSteps() const {
  return std::max(0, options_.settle_steps) +
         std::max(1, options_.counted_steps);
}

void CardTurns::StepDone(double seconds, int64_t tokens) {
  if (!options_.automatic) return;
  const int64_t p = ProbeSteps();
  const int64_t k = steps_++;  // the step just done (0-based)
  const int64_t at = k - probe_start_;
  if (at >= 0 && at < 2 * p && at % p >= options_.settle_steps) {
    const int m = at < p ? 0 : 1;
    seconds_[m] += seconds;
    tokens_[m] += static_cast<double>(tokens);
  }
  Mode next;
  const int64_t n = steps_ - probe_start_;  // the coming step's place
  if (n == 2 * p) {
    // The probe is over: keep the mode of the higher throughput (rollout
    // tokens per second over its counted steps) until the next one.
    auto rate = [&](int m) {
      return seconds_[m] > 0 ? tokens_[m] / seconds_[m] : 0.0;
    };
    chosen_ = rate(1) > rate(0) ? Mode::kInterleaved : Mode::kConcurrent;
    next = chosen_;
    seconds_[0] = seconds_[1] = tokens_[0] = tokens_[1] = 0;
    probe_start_ = steps_ + options_.reprobe_every;
  } else if (n >= 0 && n < 2 * p) {
    next = ProbeMode(n);
  } else {
    next = chosen_;
  }
  // Under the lock: a role waiting for its turn sees the new mode.
  absl::MutexLock lock(&mu_);
  mode_ = next;
  changed_.SignalAll();
}

absl::Status CardTurns::TrainerEnter(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  trainer_ = true;
  // The rollout's next hook sees trainer_ and waits; the decode step in
  // flight is short (milliseconds).
  while (rollout_step_ && interleaved()) {
    if (WaitOnClock(changed_, mu_, clock_, deadline)) {
      trainer_ = false;
      changed_.SignalAll();
      return absl::DeadlineExceededError(
          "fused trainer: the rollout's decode step did not end within "
          "run.collective_timeout_seconds");
    }
  }
  return absl::OkStatus();
}

void CardTurns::TrainerExit() {
  absl::MutexLock lock(&mu_);
  trainer_ = false;
  changed_.SignalAll();
}

absl::Status CardTurns::RolloutStep(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  rollout_step_ = false;
  changed_.SignalAll();
  while (trainer_ && interleaved()) {
    if (WaitOnClock(changed_, mu_, clock_, deadline)) {
      return absl::DeadlineExceededError(
          "fused rollout: the trainer held the card past the deadline "
          "(run.collective_timeout_seconds)");
    }
  }
  rollout_step_ = interleaved();
  return absl::OkStatus();
}

void CardTurns::RolloutIdle() {
  absl::MutexLock lock(&mu_);
  rollout_step_ = false;
  changed_.SignalAll();
}

}  // namespace fusionrl
