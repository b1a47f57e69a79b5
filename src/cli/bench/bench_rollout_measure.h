// `fusionrl bench-rollout --measure ENGINE`: one C++ rollout engine
// measured in a fresh process, the child side of bench_rollout_cli.cc (which
// starts one such process per engine and repeat, and sums them up).
#ifndef FUSIONRL_CLI_BENCH_ROLLOUT_MEASURE_H_
#define FUSIONRL_CLI_BENCH_ROLLOUT_MEASURE_H_

#include <string>

#include "cli/bench/bench_rollout_cli.h"

namespace fusionrl::cli {

// Measures engine `name` (fused, composite or static) on the job of `args`:
// rollout and training steps on random prompts, cross-step batching (with
// --cross-steps), ops and allocations per decode step, and this machine's
// sgemm. Prints one JSON line on stdout; returns the exit code.
int MeasureRolloutEngine(const BenchRolloutArgs& args, const std::string& name);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_ROLLOUT_MEASURE_H_
