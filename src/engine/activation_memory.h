// Activation memory: the swap mechanism behind model.activations "swap" and
// the measurement of what a training step really holds for backward.
//
//  * ActivationHostPool accounts the host copies of swapped activations
//    (current and peak bytes). A PolicyModel owns one.
//  * SwapScope: while one is alive on a thread, every tensor autograd saves
//    for backward on that thread (except the excluded storages: the model's
//    parameters and buffers, which stay where they are) is copied into the
//    pool when saved ("pack") and handed back to backward ("unpack"). On a
//    CPU device the copy is a separate host tensor (the same physical
//    memory: it frees nothing); on CUDA it is pinned host memory (copied
//    with non_blocking on the current stream; no side stream or prefetch in
//    this CPU-only build) and unpack copies it back to the device.
//    Mechanism: LibTorch 1.13 has no public C++ default saved-tensor hooks,
//    but SavedVariable asks Engine::get_default_engine() for
//    get_default_saved_variable_hooks(). InstallSwapEngine() replaces the
//    process's default engine (set_default_engine_stub) by a subclass that
//    returns swap hooks while a SwapScope is active on the calling thread,
//    and nullptr (plain saving) otherwise. Caveats: it is process-wide and
//    must run before any backward is in flight (graph tasks already running
//    on the old engine finish there; the old engine stays alive, so a CUDA
//    build would keep a second idle set of device threads); the new engine
//    is never destroyed.
//  * MeasureTrainStep runs one forward + backward and reports bytes held for
//    backward at the end of the forward pass, measured with
//    ScopedAllocationCounter (not estimated), and the host pool separately.
//    The planner of model.activations.policy auto
//    (engine/activation_planner.h) measures candidate plans the same way and
//    counts swap as freeing nothing on a CPU device (SwapFreesDeviceMemory).
//
// Thread safety: ActivationHostPool's counters are atomic. SwapScope is
// thread-local state: construct and destroy on one thread, nested. The
// model is not thread-safe (see model.h).
#ifndef FUSIONRL_ENGINE_ACTIVATION_MEMORY_H_
#define FUSIONRL_ENGINE_ACTIVATION_MEMORY_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_set>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fusionrl {

class PolicyModel;
struct CollatedBatch;

// Bytes of swapped activations held in host memory. Shared (shared_ptr) by
// the model and every packed tensor, so it outlives the graphs using it.
class ActivationHostPool {
 public:
  int64_t current_bytes() const { return current_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  // Tensors packed so far.
  int64_t packed() const { return packed_.load(); }
  void ResetPeak() { peak_.store(current_.load()); }

  // Used by the swap hooks.
  void Add(int64_t bytes);
  void Release(int64_t bytes);

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> packed_{0};
};

// Routes autograd's saved tensors on this thread into `pool` while alive.
// `exclude` holds storage pointers (StorageImpl*) that are saved as usual
// (parameters); both must outlive the scope. REQUIRES: InstallSwapEngine()
// has run (the constructor runs it).
class SwapScope {
 public:
  SwapScope(std::shared_ptr<ActivationHostPool> pool,
            const std::unordered_set<const void*>* exclude);
  ~SwapScope();
  SwapScope(const SwapScope&) = delete;
  SwapScope& operator=(const SwapScope&) = delete;

  struct State;  // defined in the .cc (read by the engine's hooks)

 private:
  State* previous_;
  std::unique_ptr<State> state_;
};

// For a planner's cost model: whether swapping an activation frees memory
// on `device`. False on a CPU device, where the host pool is the same
// memory; there only recompute frees anything.
inline bool SwapFreesDeviceMemory(c10::Device device) {
  return !device.is_cpu();
}

// Installs the swap-aware autograd engine once per process (idempotent).
void InstallSwapEngine();
// Whether the default engine in use is the swap-aware one.
bool SwapEngineInstalled();

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

#endif  // FUSIONRL_ENGINE_ACTIVATION_MEMORY_H_
