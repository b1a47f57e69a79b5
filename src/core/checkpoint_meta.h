// Checkpoint metadata (meta.json) and the lookup of the newest checkpoint:
// the torch-free part of checkpoints, so the controller can plan a resumed
// job without loading any tensor. Writing and loading the tensors is
// engine/train/checkpoint.h.
#ifndef FUSIONRL_CORE_CHECKPOINT_META_H_
#define FUSIONRL_CORE_CHECKPOINT_META_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace fusionrl {

struct CheckpointMeta {
  std::string kind;  // "rl" | "sft"
  std::string job_name;
  int64_t step = 0;  // steps completed
  int64_t policy_version = 0;
  uint64_t data_cursor = 0;  // next Task::TrainProblem index
  // LoRA: the base model the adapters apply to (written to meta.json's
  // "lora" section); "" = the model's hf_path.
  std::string lora_base{};
  // Expert parallelism: the shards the optimizer state is split into
  // (placement.expert_parallel).
  int expert_parallel = 1;
  // Where the weights are: false, model.pt holds every parameter; true
  // (written by cards sampling from their shards, placement.expert_sampling
  // shard, so that no card gathers the whole model), model.pt holds the
  // dense parameters and shard 0's experts and model.expert-shard-<r>.pt
  // shard r's experts (engine/train/checkpoint.h).
  bool expert_weights_split = false;
};

// The run totals at a checkpoint, carried across a resume so that the final
// summary covers the whole run. The controller keeps them (the cards never
// see them) and writes them next to the checkpoint, as <dir>/run.json, when
// it commits the step that wrote it.
struct RunTotals {
  double initial_eval_accuracy = -1;  // -1: not evaluated
  double last_eval_accuracy = -1;
  int64_t rollout_tokens = 0;
  double loop_seconds = 0;  // time in rollout + train so far
  // Tensor bytes of the job through the controller so far (0 on the c10d
  // data plane for synchronous steps).
  int64_t controller_tensor_bytes = 0;
};

// The file name of the run totals inside a checkpoint directory.
inline constexpr char kRunTotalsFile[] = "run.json";

std::string RunTotalsToJson(const RunTotals& totals);

// The run totals of checkpoint `dir`: its run.json, or, for a checkpoint
// written before run.json existed, the same keys in its meta.json. NotFound
// when neither has them (the controller stopped before it committed the
// step); DataLoss when run.json does not parse.
absl::StatusOr<RunTotals> ReadRunTotals(const std::string& dir);

// The newest checkpoint directory under `checkpoints_dir` (the one with the
// highest meta.json step; "final" included). NotFound if there is none.
// `committed_only` (what a resume wants): only checkpoints whose step the
// controller committed, i.e. with run totals (ReadRunTotals). The lead
// writes a step's checkpoint before the step commits; if the step is then
// aborted (a node lost, the controller killed), the checkpoint holds a
// step no record and no ledger knows. Such newer checkpoints are skipped
// and named in `*skipped` when it is given.
absl::StatusOr<std::string> FindLatestCheckpoint(
    const std::string& checkpoints_dir, bool committed_only = false,
    std::vector<std::string>* skipped = nullptr);

// <dir>/meta.json, parsed (the one reader of the file:
// engine/train/checkpoint.cc checks its model section, this file its fields).
// NotFound when there is no meta.json, DataLoss when it does not parse.
absl::StatusOr<nlohmann::json> ReadCheckpointMetaJson(const std::string& dir);

// The fields above from <dir>/meta.json. NotFound when there is no
// meta.json, DataLoss when it does not parse.
absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir);

// The fields above from an already parsed meta.json of checkpoint `dir`
// (named in errors): missing keys are zero, a key of the wrong type is
// DataLoss.
absl::StatusOr<CheckpointMeta> CheckpointMetaFromJson(const nlohmann::json& j,
                                                      const std::string& dir);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_CHECKPOINT_META_H_
