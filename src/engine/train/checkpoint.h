// Checkpoints: one directory per checkpoint, written atomically.
//
//   <dir>/model.pt    policy weights (torch archive, named tensors)
//   <dir>/optim.pt    AdamW state (RL and SFT checkpoints; optional to read)
//   <dir>/meta.json   kind, job name, step, policy version, data cursor and
//                     the model config, so a mismatching config is reported
//                     before any tensor is touched
// The directory is assembled as "<dir>.tmp" and renamed into place; an older
// checkpoint of the same name is replaced only after the new one is complete.
// All randomness in FusionRL derives from (seed, step, index), so step and
// data cursor are the whole RNG state: resuming continues exactly.
#ifndef FUSIONRL_ENGINE_TRAIN_CHECKPOINT_H_
#define FUSIONRL_ENGINE_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/checkpoint_meta.h"
#include "engine/model/model.h"
#include "engine/train/trainer.h"

namespace fusionrl {

//   <dir>/optim.expert-shard-<r>.pt  expert parallelism (meta
//                     expert_parallel E > 1): the optimizer state of the card
//                     holding expert shard r, for r in 1..E-1 (shard 0's is
//                     optim.pt); model.pt holds every expert, unless
//   <dir>/model.expert-shard-<r>.pt  (meta expert_weights_split) shard r's
//                     experts: model.pt then holds the dense parameters and
//                     shard 0's experts, `model` being shard 0 itself
//
// `trainer` may be null (no optim.pt is written). `before_swap`, when set,
// is called once every file is written and before the directory is moved
// into place (fault injection: a crash there must leave the previous
// checkpoints as they were).
absl::Status WriteCheckpoint(const std::string& dir, const PolicyModel& model,
                             const Trainer* trainer, const CheckpointMeta& meta,
                             const std::function<void()>& before_swap = {});

// Expert parallelism: where the card holding shard `shard` (> 0) writes its
// part of the checkpoint `dir` of step `step` before the lead writes it
// ("<dir>.shards/<name>.step-<step>.pt", each whole or not at all): its
// optimizer state, and with `weights` (its expert shard; the checkpoint's
// expert_weights_split) its experts' weights, written first, so the
// optimizer file's arrival (ExpertShardOptimizerPath, which the lead waits
// for) means both are in place. WriteCheckpoint with
// meta.expert_parallel E moves those of shards 1..E-1 and meta.step in,
// and fails naming a missing one.
std::string ExpertShardOptimizerPath(const std::string& dir, int shard,
                                     int64_t step);
absl::Status WriteExpertShard(const std::string& dir, int shard, int64_t step,
                              const Trainer& trainer,
                              const PolicyModel* weights);

// Reads meta.json, checks its model config against `model`'s, loads the
// weights and, when `trainer` is non-null and optim.pt exists, the optimizer
// (an expert shard's model: its own experts of model.pt, and its shard's
// optimizer file; the checkpoint must have as many shards).
// NotFound / FailedPrecondition / DataLoss with the path and the reason.
absl::StatusOr<CheckpointMeta> ReadCheckpoint(const std::string& dir,
                                              PolicyModel& model,
                                              Trainer* trainer);

// What a checkpoint says about its model without loading any tensor: the
// shape (meta.json's "model"), the vocabulary size and where the model and
// tokenizer came from ("source"; empty for a built-in model).
struct CheckpointModel {
  ModelConfig model;  // shape keys set; training knobs at their defaults
  int vocab_size = 0;
  std::string hf_path;    // model.hf_path of the run, or ""
  std::string tokenizer;  // model.tokenizer of the run, or ""
  // A LoRA checkpoint (model.lora set): the base model its adapters apply
  // to, a Hugging Face directory or a full FusionRL checkpoint.
  std::string lora_base;
};
absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& dir);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_CHECKPOINT_H_
