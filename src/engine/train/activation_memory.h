// Activation memory: what a training step really holds for backward,
// measured (the swap mechanism itself: engine/model/activation_swap.h).
//
// MeasureTrainStep runs one forward + backward and reports bytes held for
// backward at the end of the forward pass, measured with
// ScopedAllocationCounter (not estimated), and the host pool separately.
// The planner of model.activations.policy auto
// (engine/train/activation_planner.h) measures candidate plans the same way and
// counts swap as freeing nothing on a CPU device (SwapFreesDeviceMemory).
#ifndef FUSIONRL_ENGINE_TRAIN_ACTIVATION_MEMORY_H_
#define FUSIONRL_ENGINE_TRAIN_ACTIVATION_MEMORY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/activation_swap.h"

namespace fusionrl {

class PolicyModel;
struct CollatedBatch;

// One forward + backward of `model` (training mode, autograd on).
struct ActivationReport {
  // On the model's device: bytes allocated during the forward pass that are
  // still live when backward starts (saved activations, the logits and the
  // loss), host-pool copies excluded.
  int64_t device_held_bytes = 0;
  // Peak of the bytes allocated during the forward pass and live at once
  // (on a CPU device this includes the host pool: the same allocator).
  int64_t device_peak_bytes = 0;
  // Host pool of swapped activations at the end of forward, and its peak
  // over forward + backward.
  int64_t host_pool_bytes = 0;
  int64_t host_pool_peak_bytes = 0;
  // The headline: what the step really holds for backward. On a CPU device
  // the host pool is the same memory, so it counts: device + host there,
  // device only on an accelerator.
  int64_t held_bytes = 0;
  double loss = 0;  // the loss that was back-propagated
  absl::Duration forward_time;
  absl::Duration backward_time;
};

// The scalar loss of a step, given the forward's logits. The default (a null
// StepLoss): mean next-token negative log-likelihood over the valid tokens
// of `batch`, plus the model's MoE auxiliary loss when it has one.
using StepLoss = std::function<at::Tensor(PolicyModel&, const CollatedBatch&,
                                          const at::Tensor& logits)>;

// The default StepLoss.
at::Tensor DefaultStepLoss(PolicyModel& model, const CollatedBatch& batch,
                           const at::Tensor& logits);

// Runs one training forward + backward of `batch` (only input_ids, valid and
// positions are used by the default loss), accumulating into the
// parameters' .grad, and measures it. `loss` = nullptr for the default.
// Internal if LibTorch fails (e.g. out of memory).
// With run_backward false only the forward runs (the report's backward
// fields stay zero) and the graph is dropped: the gradients are untouched.
absl::StatusOr<ActivationReport> MeasureTrainStep(
    PolicyModel& model, const CollatedBatch& batch,
    const StepLoss& loss = nullptr, bool run_backward = true);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_ACTIVATION_MEMORY_H_
