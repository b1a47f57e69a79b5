// The step's record (one line of metrics.jsonl, the controller's step
// record): what the lead card reports after a step, built from named parts.
//
// The keys and their meanings are listed in docs/stalesync.md "What a step
// records" and docs/metrics.md; tests and `fusionrl bench` read them by
// name.
#ifndef FUSIONRL_WORKER_STEP_STEP_RECORD_H_
#define FUSIONRL_WORKER_STEP_STEP_RECORD_H_

#include <cstdint>
#include <map>
#include <string>

#include "core/step_protocol.h"
#include "worker/step/role_overlap.h"
#include "worker/step/step_totals.h"

namespace fusionrl {

struct TrainStats;

// Wall seconds of the step's phases on the lead card.
struct StepTimes {
  double rollout = 0;        // sampling the batch (its own rounds)
  double rollout_wait = 0;   // the trainer waiting for the rollout thread
  double train = 0;          // the training step
  double step = 0;           // the whole step on this card
  double weight_sync = 0;    // StaleSync weight sync after the step
  double gate_wait = 0;      // the rollout thread waiting for admission
  double expert_gather = 0;  // expert parallelism: gathering the experts
};

// The data-parallel exchange of the step (HierarchicalSync's counters).
struct StepExchange {
  int64_t cross_node_rounds = 0;
  double cross_node_seconds = 0;
  int64_t cross_node_bytes = 0;
  int64_t updates_received = 0;
  int64_t max_update_lag = 0;
  int64_t weight_sync_bytes = 0;
  // Expert parallelism: the card's token exchanges in the training step
  // (GradientSync::AllToAllTotals): calls, bytes sent to other cards,
  // seconds.
  int64_t expert_alltoall_calls = 0;
  int64_t expert_alltoall_bytes = 0;
  double expert_alltoall_seconds = 0;
  // expert_sampling shard: the card's rollout exchanges in lockstep since
  // the previous record (either thread's): bytes sent, seconds.
  int64_t sampling_alltoall_bytes = 0;
  double sampling_alltoall_seconds = 0;
};

struct StepRecordParts {
  int64_t step = 0;
  int64_t policy_version = 0;  // after the step
  int cards = 0;
  int nodes = 0;
  int attempt = 0;
  const StepTotals* totals = nullptr;  // summed over the job's cards
  const TrainStats* train = nullptr;   // the lead card's
  int64_t max_staleness = 0;
  // rollout_version jit: the lag the step's rollout was admitted with
  // (recorded as rollout_admission_lag); -1: not recorded.
  int64_t admission_lag = -1;
  StepTimes times;
  StepExchange exchange;
  RoleSplit split;           // the lead card's time split since the last one
  bool interleaved = false;  // the card's roles took turns (card_turns.h)
  int64_t snapshot_updates = 0;
  bool moe = false;         // model.moe_experts > 0: router statistics
  int expert_parallel = 1;  // placement.expert_parallel: its exchanges
  // placement.expert_sampling shard: the rollout's exchanges too
  // (StepExchange::sampling_alltoall_*).
  bool samples_shard = false;
  // MoE: the lead card's memory by category (CardMemoryManager::Snapshot),
  // recorded as card_memory_<category>_bytes: what expert parallelism
  // changes.
  std::map<std::string, int64_t> card_memory;
  bool env = false;  // env.name set: the episodes' counts
  // The environments' own metrics (Observation::metrics), mean per episode
  // over the lead card's batch (like its trainer statistics): env_<name>.
  std::map<std::string, double> env_metrics;
  // LoRA (model.lora.rank > 0): the rank and the adapters' parameters,
  // whose bytes are what a weight publish moves (lora_rank,
  // lora_trainable_parameters).
  int lora_rank = 0;
  int64_t trainable_parameters = 0;
};

// The record's fields, in the order metrics.jsonl lists them.
MetricFields StepRecord(const StepRecordParts& parts);

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_STEP_RECORD_H_
