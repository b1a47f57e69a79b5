// `fusionrl simulate --calibrate-from RUN_DIR`: per-card decode and train
// costs fitted to the metrics.jsonl of a real `fusionrl run`
// (docs/simulate.md "Calibration").
#ifndef FUSIONRL_SIM_CALIBRATION_H_
#define FUSIONRL_SIM_CALIBRATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "sim/cost_model.h"

namespace fusionrl::sim {

struct Calibration {
  CostModel cost;      // `base` with the fitted fields replaced
  int steps_used = 0;  // metrics records fitted (the first step is skipped)
  int cards = 0;       // cards of the run (all super nodes)
  int threads_per_card = 0;
  double tokens_per_card = 0;    // mean response tokens per card, step
  double mean_step_seconds = 0;  // measured, over the steps used
  double mean_rollout_seconds = 0;
  double mean_train_seconds = 0;
  std::string rollout_fit;  // "least squares" | "ratio"
  std::string train_fit;
};

// Reads RUN_DIR/config.yaml (the run's resolved job) and
// RUN_DIR/metrics.jsonl. Fits, over the steps after the first (warm-up):
//   rollout_seconds = a + b x tokens per card  -> decode_seconds_per_token
//       = b, decode_seconds_per_step_base = a / decode steps
//   train_seconds = c + d x tokens per card    -> train_seconds_per_token
//       = d, train_seconds_per_step_base = c
//   step_overhead_seconds = mean(step - rollout - train seconds)
// by least squares when the tokens vary (coefficient of variation >= 10%)
// and both coefficients come out >= 0, else as a ratio (a = c = 0). Prompt
// costs are inside these (prompt_length 0, prefill 0); timing becomes
// linear (measured seconds, both roles on the host's cores); response lengths
// become fixed at the run's mean (sigma 0, max = max_new_tokens);
// calibration_threads is the run's threads per card. NotFound / Invalid-
// Argument naming the file and line for missing or bad input.
absl::StatusOr<Calibration> CalibrateFromRun(const std::string& run_dir,
                                             const CostModel& base);

}  // namespace fusionrl::sim

#endif  // FUSIONRL_SIM_CALIBRATION_H_
