// A section of the job configuration: the loops (run.*, sft.*).
// Include fusionrl/config.h, which holds every section and the functions
// that load and validate a job.
#ifndef FUSIONRL_CONFIG_RUN_H_
#define FUSIONRL_CONFIG_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

// The RL loop (`fusionrl run`).
// run.data_plane (see RunConfig).
enum class DataPlane { kController, kC10d };
absl::StatusOr<DataPlane> ParseDataPlane(absl::string_view name);
const char* DataPlaneName(DataPlane plane);

struct RunConfig {
  int total_steps = 100;     // RL steps (rollout + train)
  int eval_every = 10;       // greedy eval on the held-out split; 0 = off
  int checkpoint_every = 0;  // 0 = only the final checkpoint
  int log_every = 1;         // progress line period, in steps
  // Deadline of every collective between cards (gradient all-reduce, metric
  // sums): a card that stops answering becomes an error, not a hang.
  double collective_timeout_seconds = 300;
  // Where the gradients of a job spanning several super nodes are summed:
  //   controller: each node's first card sends its node's sum to the
  //               controller (WorkService.Reduce), which adds them up;
  //   c10d:       the nodes' first cards form a c10d process group (Gloo on
  //               CPU), rendezvousing through the controller's store; the
  //               controller carries no tensor bytes (docs/cluster.md).
  // StaleSync jobs with max_clock_skew > 0 exchange their updates through
  // the controller (WorkService.ExchangeUpdates) or, on c10d, with
  // asynchronous all-reduces over that group, and sync their weights by a
  // broadcast over it (docs/stalesync.md).
  DataPlane data_plane = DataPlane::kController;
  // After the final checkpoint (RL and SFT), also write the policy as a
  // Hugging Face directory at <output_dir>/hf (`fusionrl export`), in
  // export_dtype (float32 | bfloat16).
  bool export_final = false;
  std::string export_dtype = "float32";
  // Also write every metrics record's numbers as TensorBoard scalars to
  // <output_dir>/tensorboard/ (RL jobs; docs/observability.md).
  bool tensorboard = false;
};

// Supervised warm start (`fusionrl sft`).
struct SftConfig {
  int steps = 300;        // optimizer steps
  int batch_size = 64;    // sequences per step
  double lr = 1e-3;       // peak learning rate (AdamW; optim.* betas,
                          //   eps, weight_decay, grad_clip apply)
  int warmup_steps = 20;  // linear warm-up of the lr from 0
  int eval_every = 100;   // greedy eval period; 0 = only at the end
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_RUN_H_
