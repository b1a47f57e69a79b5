#include "engine/train/memory_accounting.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model.h"
#include "engine/train/master_weights.h"
#include "engine/train/trainer.h"

namespace fusionrl {
namespace {

// Sums the storage bytes of tensors, each storage once.
class StorageBytes {
 public:
  void Add(const at::Tensor& t) {
    if (!t.defined()) return;
    if (!t.has_storage()) {  // e.g. sparse or opaque tensors
      bytes_ += t.numel() * static_cast<int64_t>(t.element_size());
      return;
    }
    if (seen_.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes_ += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  int64_t bytes() const { return bytes_; }
  // Counts `t`'s storage as seen without adding it.
  void Skip(const at::Tensor& t) {
    if (t.defined() && t.has_storage()) {
      seen_.insert(t.storage().unsafeGetStorageImpl());
    }
  }

 private:
  std::unordered_set<const void*> seen_;
  int64_t bytes_ = 0;
};

// Calls fn(tensor) for every tensor of every AdamW parameter state, with
// write access so that it can replace them.
template <class Fn>
void ForEachAdamWTensor(torch::optim::AdamW& adamw, Fn fn) {
  for (auto& entry : adamw.state()) {
    auto* state =
        dynamic_cast<torch::optim::AdamWParamState*>(entry.second.get());
    if (state == nullptr) continue;
    at::Tensor exp_avg = state->exp_avg();
    at::Tensor exp_avg_sq = state->exp_avg_sq();
    at::Tensor max_exp_avg_sq = state->max_exp_avg_sq();
    fn(exp_avg);
    fn(exp_avg_sq);
    fn(max_exp_avg_sq);
    state->exp_avg(exp_avg);
    state->exp_avg_sq(exp_avg_sq);
    state->max_exp_avg_sq(max_exp_avg_sq);
  }
}

}  // namespace

int64_t ParameterBytes(const PolicyModel& model,
                       const PolicyModel* shared_with) {
  StorageBytes sum;
  if (shared_with != nullptr) {
    for (const at::Tensor& p : shared_with->parameters()) sum.Skip(p);
  }
  for (const at::Tensor& p : model.parameters()) sum.Add(p);
  if (model.lora()) {  // the adapters, beside the base
    for (const at::Tensor& p : model.trainable_parameters()) sum.Add(p);
  }
  return sum.bytes();
}

int64_t GradientBytes(const PolicyModel& model) {
  StorageBytes sum;
  for (const at::Tensor& p : model.trainable_parameters()) sum.Add(p.grad());
  return sum.bytes();
}

int64_t OptimizerStateBytes(const Trainer& trainer) {
  StorageBytes sum;
  for (const auto& entry : trainer.optimizer().state()) {
    const auto* state =
        dynamic_cast<const torch::optim::AdamWParamState*>(entry.second.get());
    if (state == nullptr) continue;
    sum.Add(state->exp_avg());
    sum.Add(state->exp_avg_sq());
    sum.Add(state->max_exp_avg_sq());
  }
  return sum.bytes() + trainer.master_weights().MasterBytes();
}

int64_t KvCacheBytes(const KvCache& cache) {
  StorageBytes sum;
  for (const at::Tensor& t : cache.keys) sum.Add(t);
  for (const at::Tensor& t : cache.values) sum.Add(t);
  return sum.bytes();
}

int64_t KvCacheBytesFor(const ModelConfig& config, int64_t batch,
                        int64_t capacity) {
  const int64_t kv_heads =
      config.n_kv_heads > 0 ? config.n_kv_heads : config.n_heads;
  const int64_t head_dim =
      config.head_dim > 0 ? config.head_dim : config.d_model / config.n_heads;
  const int64_t elem = config.dtype == "bfloat16" ? 2 : 4;
  return 2 * static_cast<int64_t>(config.n_layers) * batch * capacity *
         kv_heads * head_dim * elem;
}

absl::Status MoveOptimizerState(Trainer& trainer, c10::Device device) {
  try {
    ForEachAdamWTensor(trainer.optimizer(), [&](at::Tensor& t) {
      if (t.defined() && t.device() != device) t = t.to(device);
    });
    trainer.master_weights().MoveMastersTo(device);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot move optimizer state to ",
                                            device.str(), ": ",
                                            e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

// The thread-local memory reporter of one counter.
class ScopedAllocationCounter::Reporter final
    : public c10::MemoryReportingInfoBase {
 public:
  Reporter(std::optional<c10::Device> device,
           c10::MemoryReportingInfoBase* parent)
      : device_(device), parent_(parent) {}

  void reportMemoryUsage(void* ptr, int64_t alloc_size, int64_t total_allocated,
                         int64_t total_reserved, c10::Device device) override {
    if (parent_ != nullptr && parent_->memoryProfilingEnabled()) {
      parent_->reportMemoryUsage(ptr, alloc_size, total_allocated,
                                 total_reserved, device);
    }
    if (!Counts(device) || alloc_size == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (alloc_size > 0) {
      live_[ptr] += alloc_size;
      current_ += alloc_size;
      peak_ = std::max(peak_, current_);
      ++allocations_;
      return;
    }
    // A free: only of a block this scope allocated (c10 also reports frees
    // of blocks it saw allocated in an earlier profiling scope).
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    current_ -= it->second;
    live_.erase(it);
  }

  void reportOutOfMemory(int64_t alloc_size, int64_t total_allocated,
                         int64_t total_reserved, c10::Device device) override {
    if (parent_ != nullptr && parent_->memoryProfilingEnabled()) {
      parent_->reportOutOfMemory(alloc_size, total_allocated, total_reserved,
                                 device);
    }
  }

  bool memoryProfilingEnabled() const override { return true; }

  int64_t current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  int64_t allocations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }

 private:
  bool Counts(c10::Device device) const {
    if (!device_) return true;
    return device.type() == device_->type() &&
           (!device_->has_index() || device.index() == device_->index());
  }

  const std::optional<c10::Device> device_;
  // The reporter this one replaced (kept alive by the guard's saved state).
  c10::MemoryReportingInfoBase* const parent_;
  mutable std::mutex mu_;
  std::unordered_map<void*, int64_t> live_;  // blocks allocated in scope
  int64_t current_ = 0;
  int64_t peak_ = 0;
  int64_t allocations_ = 0;
};

ScopedAllocationCounter::ScopedAllocationCounter(
    std::optional<c10::Device> device) {
  auto* parent = dynamic_cast<c10::MemoryReportingInfoBase*>(
      c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE));
  reporter_ = std::make_shared<Reporter>(device, parent);
  // The guard keeps the previous thread-local state (and so `parent`) alive
  // and restores it when destroyed.
  guard_ = std::make_unique<c10::DebugInfoGuard>(
      c10::DebugInfoKind::PROFILER_STATE, reporter_);
}

ScopedAllocationCounter::~ScopedAllocationCounter() = default;

int64_t ScopedAllocationCounter::current_bytes() const {
  return reporter_->current();
}

int64_t ScopedAllocationCounter::peak_bytes() const {
  return reporter_->peak();
}

int64_t ScopedAllocationCounter::allocations() const {
  return reporter_->allocations();
}

}  // namespace fusionrl
