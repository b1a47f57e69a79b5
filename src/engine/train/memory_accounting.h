// Memory accounting on the engine side: what a card's tensors take, measured
// (not estimated), for the books of a CardMemoryManager
// (core/memory_manager.h).
//
//  * ParameterBytes / GradientBytes / OptimizerStateBytes / KvCacheBytes
//    sum the storage bytes of the tensors a PolicyModel, a Trainer's AdamW
//    state or a KvCache hold (a storage shared by several tensors counts
//    once). KvCacheBytesFor gives the same figure for a cache not made yet.
//  * ScopedAllocationCounter counts what the LibTorch allocators hand out on
//    this thread while it lives (activations, temporaries): current and
//    peak bytes of allocations made inside the scope.
//  * MoveOptimizerState moves the AdamW state to another device: the real
//    offload behind a kGrantedAfterOffload decision.
//
// Thread safety: the functions read their argument; the caller must keep it
// from changing meanwhile (the model and trainer are not thread-safe).
// ScopedAllocationCounter: see the class.
#ifndef FUSIONRL_ENGINE_TRAIN_MEMORY_ACCOUNTING_H_
#define FUSIONRL_ENGINE_TRAIN_MEMORY_ACCOUNTING_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "fusionrl/config.h"

namespace c10 {
class DebugInfoGuard;
}  // namespace c10

namespace fusionrl {

class PolicyModel;
class Trainer;
struct KvCache;

// Bytes of the model's parameters (its weights; with LoRA the adapters
// too), without the storages it shares with `shared_with` (a LoRA merged
// view shares the base's untargeted tensors).
int64_t ParameterBytes(const PolicyModel& model,
                       const PolicyModel* shared_with = nullptr);

// Bytes of the parameters' gradients; 0 for parameters without one (before
// the first backward pass).
int64_t GradientBytes(const PolicyModel& model);

// Bytes of the trainer's AdamW state (exp_avg, exp_avg_sq and, with
// amsgrad, max_exp_avg_sq), wherever it lives, and of the float32 master
// weights of a low-precision policy (engine/train/master_weights.h). AdamW
// creates its state at its first step: for a float32 policy 0 before, then 2 x
// ParameterBytes; a bf16 policy's masters (2 x ParameterBytes) exist from the
// start and its moments are float32 (4 x ParameterBytes).
int64_t OptimizerStateBytes(const Trainer& trainer);

// Bytes of a KV cache's key and value buffers (its whole capacity).
int64_t KvCacheBytes(const KvCache& cache);

// What PolicyModel::NewCache(batch, capacity) allocates for a model of
// `config`: 2 x n_layers x batch x capacity x kv heads x head_dim values of
// the model's dtype.
int64_t KvCacheBytesFor(const ModelConfig& config, int64_t batch,
                        int64_t capacity);

// Moves every tensor of the trainer's AdamW state to `device` (kCPU to
// offload it to host memory, the policy's device to bring it back). AdamW
// steps need the state on the parameters' device, so the trainer must bring
// it back before its next Step(). A no-op for tensors already there (on a
// CPU card offloading moves nothing). Internal if LibTorch fails (e.g. out
// of memory); the state may then be split between devices, and moving it
// again to one device repairs that.
absl::Status MoveOptimizerState(Trainer& trainer, c10::Device device);

// ScopedAllocationCounter: counts the bytes LibTorch's allocators hand out
// while it lives. It installs itself as this thread's memory reporter
// (c10::MemoryReportingInfoBase under c10::DebugInfoKind::PROFILER_STATE),
// to which the CPU allocator (and CUDA's caching allocator) reports every
// allocation and free while memoryProfilingEnabled() is true.
//
// Only allocations made inside the scope count: a free of a block allocated
// before the scope (which c10 reports with a negative size, or not at all)
// is ignored, so peak_bytes() is the peak of the scope's *new* allocations
// that were live at once, and current_bytes() what the scope allocated and
// still holds (e.g. gradients created by a first backward pass). The
// thread-local reporter also follows the work LibTorch hands to other
// threads with its thread-local state (autograd's device threads, at::launch);
// plain OpenMP intra-op threads do not carry it, but they rarely allocate.
//
// Counters nest: an inner counter forwards every report to the one it
// replaced (or to an active autograd profiler), so both see the same
// allocations. c10 logs one warning (then one per 1000) when it frees a
// block it never saw allocated while a counter is active: "Memory block of
// unknown size was allocated before the profiling started".
//
// Thread safety: construct and destroy on one thread, in nested order; the
// accessors may be called from any thread.
class ScopedAllocationCounter {
 public:
  // Counts allocations on `device` only (a device without an index matches
  // every index of its type); all devices if nullopt.
  explicit ScopedAllocationCounter(
      std::optional<c10::Device> device = std::nullopt);
  ~ScopedAllocationCounter();

  ScopedAllocationCounter(const ScopedAllocationCounter&) = delete;
  ScopedAllocationCounter& operator=(const ScopedAllocationCounter&) = delete;

  // Bytes allocated inside the scope and not yet freed.
  int64_t current_bytes() const;
  // The largest current_bytes() has been.
  int64_t peak_bytes() const;
  // Allocations counted so far.
  int64_t allocations() const;

 private:
  class Reporter;
  std::shared_ptr<Reporter> reporter_;
  std::unique_ptr<c10::DebugInfoGuard> guard_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_MEMORY_ACCOUNTING_H_
