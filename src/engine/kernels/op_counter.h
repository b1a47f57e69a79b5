// Counts the ATen operators dispatched (on every thread) while an
// OpCounter lives: the host-side cost of a step that its wall time alone
// hides (e.g. a MoE layer's dispatch, an operator or more per expert).
// One counter at a time per process (benchmarks and tests).
#ifndef FUSIONRL_ENGINE_KERNELS_OP_COUNTER_H_
#define FUSIONRL_ENGINE_KERNELS_OP_COUNTER_H_

#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace fusionrl {

class OpCounter {
 public:
  OpCounter() {
    Count() = 0;
    at::RecordFunctionCallback cb(
        [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
          Count().fetch_add(1, std::memory_order_relaxed);
          return nullptr;
        });
    cb.scopes({at::RecordScope::FUNCTION});
    handle_ = at::addGlobalCallback(cb);
  }
  ~OpCounter() { at::removeCallback(handle_); }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  int64_t count() const { return Count().load(); }

 private:
  static std::atomic<int64_t>& Count() {
    static std::atomic<int64_t> ops{0};
    return ops;
  }
  at::CallbackHandle handle_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_KERNELS_OP_COUNTER_H_
