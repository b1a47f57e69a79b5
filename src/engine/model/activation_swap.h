// Activation swap: the mechanism behind model.activations "swap".
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
//
// Thread safety: ActivationHostPool's counters are atomic. SwapScope is
// thread-local state: construct and destroy on one thread, nested. The
// model is not thread-safe (see model.h).
#ifndef FUSIONRL_ENGINE_MODEL_ACTIVATION_SWAP_H_
#define FUSIONRL_ENGINE_MODEL_ACTIVATION_SWAP_H_

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_set>

namespace fusionrl {

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

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_ACTIVATION_SWAP_H_
