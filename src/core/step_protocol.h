// The step protocol between the controller and a worker's cards, as plain
// structs (no Protobuf, no LibTorch): what the controller plans, what a card
// reports. The gRPC adapters (worker/grpc_work_client.*, the controller's
// services) convert them to and from proto/fusionrl/v1/work.proto; in-process
// callers pass them as they are.
//
// The data path of one step:
//   StepPlan (controller -> card: which prompt groups, which attempt)
//   -> RolloutBatch (worker/step/group_sampler.h: completions and rewards)
//   -> TrainStats (engine/train/trainer.h) -> StepReport (card -> controller).
#ifndef FUSIONRL_CORE_STEP_PROTOCOL_H_
#define FUSIONRL_CORE_STEP_PROTOCOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace fusionrl {

struct JobConfig;  // fusionrl/config.h

// How long one GetStepPlan call may wait at the controller for the next
// plan (the worker's long poll, worker/plan_rendezvous.h; the simulator
// sends one message per this much waiting too).
inline constexpr int64_t kPlanWaitSeconds = 5;

// A job the controller placed on this node.
struct Assignment {
  std::string job_id;  // empty: nothing to run yet
  // The job's resolved config, as the controller holds it. In-process it is
  // shared as it is; the gRPC adapters send it as YAML and parse it again
  // on the worker, where a config that does not parse leaves `config` null
  // and says why in `config_error` (the node then fails the job).
  std::shared_ptr<const JobConfig> config;
  absl::Status config_error;
  std::vector<int> card_indices;  // rollout-only cards first
  std::string resume_checkpoint;
  int rollout_cards = 0;
  // The job's training cards on the nodes placed before this one (in
  // placement order, super node by super node): local training card r is
  // the job's card train_rank_offset + r while no node is lost.
  int train_rank_offset = 0;
};

enum class PlanKind {
  kWait,     // ask again (the step is not planned yet)
  kTrain,    // run `step`, attempt `attempt`
  kEnd,      // the job ends: the lead writes the last checkpoint
  kAbandon,  // this node leaves the job (message says why)
};

// One card's part of one attempt of one step.
struct StepPlan {
  PlanKind kind = PlanKind::kWait;
  int64_t step = 0;
  int attempt = 0;
  int rank = 0;                  // global rank of the card in the attempt
  int world_size = 1;            // cards in the attempt
  int nodes = 1;                 // super nodes in the attempt
  std::vector<uint64_t> groups;  // prompt groups this card samples and trains
  bool eval_before = false;
  bool eval_after = false;
  // "" = none after this step. The checkpoint holds the policy (written by
  // rank 0; every fused or disaggregated card adds what it sampled ahead);
  // the controller adds the run totals (run.json) when it commits the step.
  // kEnd: the end checkpoint, on every card's plan (the lead, rank 0, writes
  // it; an expert shard writes its optimizer state into it). kAbandon: set
  // (with step = its step + 1) when the job ended with this end checkpoint,
  // for the cards' part.
  std::string checkpoint_name;
  std::string message;             // kAbandon: why
  uint64_t data_cursor_after = 0;  // the next unseen prompt group
  // StaleSync across super nodes (max_clock_skew): exchange this step's
  // update instead of a synchronous all-reduce; updates of other nodes are
  // due before step `updates_due_step`.
  bool exchange_updates = false;
  int64_t updates_due_step = 0;
  bool sync_weights = false;  // weights converge after this step
  // The c10d data plane (run.data_plane = c10d): the cross-node group of
  // this attempt's nodes is the one formed for `rendezvous_generation`. The
  // controller starts a new generation whenever the nodes of an attempt
  // differ from the previous attempt's or the previous attempt was aborted,
  // so every node re-forms (or keeps) the group by the same rule.
  bool c10d_data_plane = false;
  int64_t rendezvous_generation = 0;
  int node_rank = 0;  // the card's node among the attempt's nodes
  // StaleSync after a roll-back (docs/stalesync.md#losing-a-super-node):
  // `attempt` counts the job's roll-backs from 1, and a card whose previous
  // plan had another attempt first restores the state it kept at the
  // weight sync of step `rollback_to_step` and drops every update in
  // flight. -1: nothing to restore.
  int64_t rollback_to_step = -1;
};

// The card's typed metrics of one step (formatted to JSON once, where the
// record is written).
using MetricFields = std::vector<std::pair<std::string, double>>;

// Card -> controller at the end of an attempt (the lead card reports the
// metrics; the first card of every other node reports its outcome).
struct StepReport {
  std::string job_id;
  std::string node_id;
  int64_t step = 0;
  int attempt = 0;
  MetricFields metrics;  // empty unless the lead card
  int64_t rollout_tokens = 0;
  double loop_seconds = 0;
  double initial_eval_accuracy = -1;  // >= 0 when evaluated before the step
  double eval_accuracy = -1;          // >= 0 when evaluated after the step
  std::string checkpoint_dir;
  double reward_mean = 0;
  double train_accuracy = 0;
  int64_t policy_version = 0;
  absl::Status error;  // non-OK: the node failed the step (the job fails)
  // Not empty: the node could not finish the attempt for a reason a replan
  // may cure (a collective of the c10d data plane failed); the controller
  // aborts the attempt and replans the step.
  std::string abort_reason;
  // StaleSync clock skew: the prompt groups this super node trained (count,
  // sum and sum of squares of their ids), summed by the controller into the
  // step's record.
  bool has_trained_groups = false;
  double trained_groups = 0;
  double trained_group_id_sum = 0;
  double trained_group_id_sq_sum = 0;
  bool has_weights_crc32c = false;
  uint32_t weights_crc32c = 0;
};

enum class ReduceDtype { kFloat32, kFloat64 };

// What a Reduce round and an update exchange share: which node sends the
// round `round` of step `step` of job `job_id`, under which attempt (the
// plan's: a call of a rolled-back or replanned attempt gets Aborted).
struct StepCallHeader {
  std::string job_id;
  std::string node_id;
  int64_t step = 0;
  int attempt = 0;
  int64_t round = 0;
};

// One cross-node collective round of an attempt (node-level sum).
struct ReduceCall : StepCallHeader {
  ReduceDtype dtype = ReduceDtype::kFloat32;
  std::string payload;  // little-endian values of `dtype`
};

// StaleSync: this node's update of (step, round), due at the other nodes
// before `due_step`.
struct UpdateCall : StepCallHeader {
  int64_t due_step = 0;
  std::string payload;  // float32 values
  // The payload's CRC-32C as its sender computed it, when it crossed a wire:
  // the controller checks it (DataLoss). In process: unset.
  std::optional<uint32_t> crc32c;
};

// Another super node's update, checked end to end (CRC-32C) by the client.
struct ReceivedUpdate {
  int64_t step = 0;
  std::string payload;  // float32 values, as sent
  std::string node_id;  // the node that sent it
  int64_t round = 0;
  uint32_t crc32c = 0;  // of `payload`, as the controller received it
};

// The rendezvous store of the c10d data plane (controller/rendezvous_store.h):
// one operation on a key of the job's scope, with c10d Store semantics.
enum class StoreOp { kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kDelete };

// A StoreCall's generation naming the job's own scope instead of one
// rendezvous generation: open from the job's placement to its end, for
// groups formed once when the cards set up (an expert group spanning
// nodes), which later generations must not close.
inline constexpr int64_t kJobRendezvousScope = -1;

struct StoreCall {
  std::string job_id;
  std::string node_id;
  // StepPlan::rendezvous_generation, or kJobRendezvousScope.
  int64_t generation = 0;
  StoreOp op = StoreOp::kGet;
  std::vector<std::string> keys;  // one key, except kCheck / kWait
  std::string value;              // kSet, kCompareSet (desired)
  std::string expected;           // kCompareSet
  int64_t delta = 0;              // kAdd
};

struct StoreReply {
  std::string value;   // kGet, kCompareSet
  int64_t number = 0;  // kAdd
  bool flag = false;   // kCheck, kDelete
};

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_STEP_PROTOCOL_H_
