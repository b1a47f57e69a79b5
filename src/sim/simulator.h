// The discrete-event simulator of `fusionrl simulate`: the real controller
// (JobManager: placement, the clock-skew gate, the prompt-group ledger, the
// step protocols, commit, metrics outputs) driven by simulated super nodes
// and cards on a virtual clock (docs/simulate.md).
//
// One run: N super nodes are registered (one worker node of C cards each),
// the job is submitted and placed, and every simulated node then speaks the
// step protocol as the real worker does (worker/node_job.cc,
// plan_rendezvous.cc, card_runner.cc): GetAssignment; card 0 asks
// GetStepPlan for each local rank; the node's first card reports
// FinishStep, the lead card with the step's metrics. Compute and collective
// times come from the cost model (sim/cost_model.h); nothing sleeps: a
// FakeClock is moved to each event's time, and every JobManager call is
// made with wait 0 (GetStepPlan answers WAIT, FinishStep records and
// answers DEADLINE_EXCEEDED until the step commits), so no call blocks.
//
// Thread safety: RunSimulation is reentrant (each run owns its controller);
// a run uses only the calling thread.
#ifndef FUSIONRL_SIM_SIMULATOR_H_
#define FUSIONRL_SIM_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mode_spec.h"
#include "fusionrl/config.h"
#include "sim/cost_model.h"

namespace fusionrl::sim {

// `fusionrl simulate`'s modes: colocated-sync | fused |
// fused+stalesync[:s[:k]], s stalesync.max_policy_lag and k
// stalesync.max_clock_skew (both 2 when omitted, k = s when only s is
// given; fused+stalesync:2:1 is the s = 2, k = 1). The grammar
// ModeGrammar::kSimulate of core/mode_spec.h.
using SimMode = ModeSpec;

// InvalidArgument "--modes: ..." naming the bad mode.
absl::StatusOr<SimMode> ParseSimMode(const std::string& text);

struct SimRunSpec {
  // The `job:` section: an ordinary job config describing ONE super node's
  // share of the work (its rollout.prompts_per_step is per super node; a
  // run over N super nodes submits N x that, weak scaling).
  std::string job_yaml;
  std::vector<std::string> job_overrides;  // "key.path=value", after it
  std::string source_name = "<simulate>";  // for the controller's messages
  CostModel cost;
  SimMode mode;
  int super_nodes = 1;
  int cards_per_super_node = 1;
  std::string output_dir;  // the job's output_dir (metrics.jsonl, ...)
};

struct SimRunResult {
  std::string mode;
  int super_nodes = 0;
  int cards = 0;  // all cards of the run
  // Response tokens trained per second of virtual time (job start to the
  // commit of the last step).
  double tokens_per_second = 0;
  // Card time spent sampling or training, over cards x the run's time.
  double card_busy_fraction = 0;
  int64_t max_staleness = 0;   // over every card and step
  int64_t max_clock_skew = 0;  // the controller's max_clock_skew_seen
  double controller_messages_per_step = 0;
  double controller_cpu_seconds_per_step = 0;
  double controller_tensor_bytes_per_step = 0;
  // Details.
  int64_t steps = 0;                      // committed, from the controller
  int64_t groups_submitted = 0;           // from the controller's ledger
  int64_t groups_trained = 0;             // from the controller's ledger
  int64_t controller_rollout_tokens = 0;  // the controller's total
  int64_t tokens = 0;                     // the simulator's own count
  double seconds = 0;                     // virtual time of the run
  double mean_step_seconds = 0;           // seconds / steps
  std::string job_phase;                  // "SUCCEEDED" (JobPhaseText)
};

// Runs one simulation. InvalidArgument / FailedPrecondition for a job the
// controller refuses; Internal when the protocol stalls (with the nodes'
// states).
absl::StatusOr<SimRunResult> RunSimulation(const SimRunSpec& spec);

}  // namespace fusionrl::sim

#endif  // FUSIONRL_SIM_SIMULATOR_H_
