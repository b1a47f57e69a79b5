// StepSnapshot and the card state codec.
//
// A card takes a StepSnapshot at the start of an attempt that another node
// can abort (a synchronous step shared with other super nodes) and restores
// it when the attempt is abandoned, so the replanned attempt starts from
// exactly the same weights, optimizer state and policy version.
//
// The state codec is what a weight sync between super nodes copies: 8 bytes
// of weight length (little-endian), the weights' raw bytes in parameter
// order, then the trainer's optimizer state (Trainer::OptimizerState).
#ifndef FUSIONRL_WORKER_STEP_STEP_SNAPSHOT_H_
#define FUSIONRL_WORKER_STEP_STEP_SNAPSHOT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusionrl {

class PolicyModel;
class Trainer;

struct StepSnapshot {
  std::vector<at::Tensor> params;
  std::string optimizer;
  int64_t version = 0;

  // `on_host`: the weights are copied to host memory (a snapshot kept
  // for long, e.g. at a StaleSync weight sync, need not hold card memory).
  static absl::StatusOr<StepSnapshot> Take(PolicyModel& policy,
                                           const Trainer& trainer,
                                           bool on_host = false);
  // Puts the snapshot's weights, optimizer state and version back.
  absl::Status Restore(PolicyModel& policy, Trainer& trainer) const;
};

// CRC-32C of the weights' raw bytes in parameter order (what a weight sync
// copies; super nodes compare it after a sync).
uint32_t WeightsCrc32c(PolicyModel& policy);

// The weight-sync blob of the card's state (format above).
absl::StatusOr<std::string> SerializeState(PolicyModel& policy,
                                           const Trainer& trainer);
// Adopts a blob made by SerializeState on a card of the same model.
// DataLoss naming what does not fit (header, weight sizes).
absl::Status AdoptState(const std::string& blob, PolicyModel& policy,
                        Trainer& trainer);

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_STEP_SNAPSHOT_H_
