#include "engine/model/activation_swap.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace fusionrl {

void ActivationHostPool::Add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  packed_.fetch_add(1);
}

void ActivationHostPool::Release(int64_t bytes) { current_.fetch_sub(bytes); }

namespace {

// One host copy of a saved tensor; gives its bytes back to the pool when the
// last hook using it goes (the graph is freed).
struct PooledCopy {
  PooledCopy(std::shared_ptr<ActivationHostPool> p, at::Tensor h)
      : pool(std::move(p)),
        host(std::move(h)),
        bytes(static_cast<int64_t>(host.storage().nbytes())) {
    pool->Add(bytes);
  }
  ~PooledCopy() { pool->Release(bytes); }
  PooledCopy(const PooledCopy&) = delete;
  PooledCopy& operator=(const PooledCopy&) = delete;

  std::shared_ptr<ActivationHostPool> pool;
  at::Tensor host;
  int64_t bytes;
};

}  // namespace

struct SwapScope::State {
  std::shared_ptr<ActivationHostPool> pool;
  const std::unordered_set<const void*>* exclude;
  // Copies made in this scope, so that a tensor saved by several ops (a
  // linear's input feeding q, k and v) is copied once. The weak storage
  // reference keeps the StorageImpl's address from being reused meanwhile.
  struct Seen {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t offset;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    int64_t version;
    std::weak_ptr<PooledCopy> copy;
  };
  std::vector<Seen> seen;

  std::shared_ptr<PooledCopy> CopyOf(const at::Tensor& t) {
    const auto* impl = t.storage().unsafeGetStorageImpl();
    for (const Seen& s : seen) {
      if (s.storage._unsafe_get_target() == impl &&
          s.offset == t.storage_offset() && s.sizes == t.sizes().vec() &&
          s.strides == t.strides().vec() && s.dtype == t.scalar_type() &&
          s.version == t._version()) {
        if (auto copy = s.copy.lock()) return copy;
      }
    }
    const bool accel = !t.is_cpu();
    // copy=true keeps sizes and (for dense tensors) strides.
    auto copy = std::make_shared<PooledCopy>(
        pool, t.to(t.options().device(at::kCPU).pinned_memory(accel),
                   /*non_blocking=*/accel, /*copy=*/true));
    seen.push_back(Seen{t.storage().getWeakStorageImpl(), t.storage_offset(),
                        t.sizes().vec(), t.strides().vec(), t.scalar_type(),
                        t._version(), copy});
    return copy;
  }
};

namespace {

thread_local SwapScope::State* g_swap_scope = nullptr;
std::atomic<bool> g_swap_engine_installed{false};

// Pack: copy into the pool (or keep an excluded tensor as is). Unpack: the
// pooled tensor, back on the original device. `scope` is used only by the
// pack call, which SavedVariable makes right after creating the hooks.
class SwapHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit SwapHooks(SwapScope::State* scope) : scope_(scope) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    device_ = tensor.device();
    if (!tensor.defined() || !tensor.has_storage() || tensor.numel() == 0 ||
        (scope_->exclude != nullptr &&
         scope_->exclude->count(tensor.storage().unsafeGetStorageImpl()) > 0)) {
      kept_ = tensor;
    } else {
      copy_ = scope_->CopyOf(tensor);
    }
    scope_ = nullptr;
  }

  at::Tensor call_unpack_hook() override {
    if (copy_ == nullptr) return kept_;
    if (device_.is_cpu()) return copy_->host;
    return copy_->host.to(device_, /*non_blocking=*/true);
  }

 private:
  SwapScope::State* scope_;
  c10::Device device_ = c10::Device(c10::kCPU);
  at::Tensor kept_;
  std::shared_ptr<PooledCopy> copy_;
};

struct SwapEngine final : public torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks>
  get_default_saved_variable_hooks() override {
    SwapScope::State* s = g_swap_scope;
    if (s == nullptr) return nullptr;
    return std::make_unique<SwapHooks>(s);
  }
};

torch::autograd::Engine& SwapEngineStub() {
  // Never destroyed: graph tasks and device threads may outlive statics.
  static SwapEngine* engine = new SwapEngine();
  return *engine;
}

}  // namespace

void InstallSwapEngine() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::autograd::set_default_engine_stub(&SwapEngineStub);
    g_swap_engine_installed.store(true);
  });
}

bool SwapEngineInstalled() { return g_swap_engine_installed.load(); }

SwapScope::SwapScope(std::shared_ptr<ActivationHostPool> pool,
                     const std::unordered_set<const void*>* exclude)
    : previous_(g_swap_scope),
      state_(std::make_unique<State>(State{std::move(pool), exclude, {}})) {
  InstallSwapEngine();
  g_swap_scope = state_.get();
}

SwapScope::~SwapScope() { g_swap_scope = previous_; }

}  // namespace fusionrl
