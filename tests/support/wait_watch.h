// CondVarWaitWatch (tests): a test waits until a thread it started is
// provably blocked inside a call before it does what should release it.
#ifndef FUSIONRL_TESTS_SUPPORT_WAIT_WATCH_H_
#define FUSIONRL_TESTS_SUPPORT_WAIT_WATCH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fusionrl {

namespace wait_watch_internal {

// What the one CondVarWaitWatch alive watches: the waits begun on condition
// variables in [lo, hi). Never destroyed: the tracer may run at any time.
struct WaitWatchState {
  absl::Mutex mu;
  uintptr_t lo ABSL_GUARDED_BY(mu) = 0;
  uintptr_t hi ABSL_GUARDED_BY(mu) = 0;
  int64_t waits ABSL_GUARDED_BY(mu) = 0;
};

inline WaitWatchState& WatchState() {
  static WaitWatchState* const state = new WaitWatchState();
  return *state;
}

// The process's CondVar tracer (one function, so that every test file that
// registers it registers the same one, as Abseil requires).
inline void TraceCondVar(const char* event, const void* cv) {
  if (std::strcmp(event, "Wait") != 0) return;
  WaitWatchState& s = WatchState();
  const uintptr_t p = reinterpret_cast<uintptr_t>(cv);
  absl::MutexLock lock(&s.mu);
  if (p >= s.lo && p < s.hi) ++s.waits;
}

}  // namespace wait_watch_internal

// Counts the waits that threads begin on the absl::CondVar members of one
// object (a gate, a manager), so that a test can wait until the thread it
// started is provably blocked inside a call of that object before it does
// what should release it; sleeping "long enough" instead lets a test pass
// when the interleaving it meant never happened.
//
// Why a count proves it: Abseil traces a CondVar "Wait" (see
// absl::RegisterCondVarTracer) while the waiter still holds the mutex its
// condition is guarded by, before it is queued; whatever releases it must
// take that mutex, so it runs after the waiter is queued. A count of n
// means the object's waits were entered n times (a WaitOnClock loop enters
// again at every poll of the clock, a condition loop after every wake-up).
// Only waits on condition variables that lie inside the object count, and
// absl::Mutex::Await / absl::Notification do not use one.
//
// Usage:
//   CondVarWaitWatch watch(gate);
//   std::thread waiter([&] { status = gate.WaitAdmit(RealClock(), deadline);
//   }); EXPECT_TRUE(watch.AwaitWaits(1, absl::Seconds(10)));  // blocked in it
//   gate.OnVersion(1);                                    // releases it
//   waiter.join();
//
// At most one watch may exist at a time in a process (gtest runs the tests
// of a binary one after another). The tracer stays registered afterwards and
// costs one uncontended mutex lock per CondVar wait in the process.
// Thread safety: every method may be called from any thread.
class CondVarWaitWatch {
 public:
  // Watches the condition variables inside `object` (borrowed; it must
  // outlive the watch).
  template <typename T>
  explicit CondVarWaitWatch(const T& object)
      : CondVarWaitWatch(&object, sizeof(T)) {}

  CondVarWaitWatch(const void* object, size_t size) {
    absl::RegisterCondVarTracer(&wait_watch_internal::TraceCondVar);
    wait_watch_internal::WaitWatchState& s = wait_watch_internal::WatchState();
    absl::MutexLock lock(&s.mu);
    s.lo = reinterpret_cast<uintptr_t>(object);
    s.hi = s.lo + size;
    s.waits = 0;
  }

  ~CondVarWaitWatch() {
    wait_watch_internal::WaitWatchState& s = wait_watch_internal::WatchState();
    absl::MutexLock lock(&s.mu);
    s.lo = s.hi = 0;
  }

  CondVarWaitWatch(const CondVarWaitWatch&) = delete;
  CondVarWaitWatch& operator=(const CondVarWaitWatch&) = delete;

  // Waits begun on the object's condition variables since construction.
  int64_t waits() const {
    wait_watch_internal::WaitWatchState& s = wait_watch_internal::WatchState();
    absl::MutexLock lock(&s.mu);
    return s.waits;
  }

  // Blocks until waits() >= n or `timeout` of real time passed; returns
  // whether waits() reached n.
  bool AwaitWaits(int64_t n, absl::Duration timeout) const {
    wait_watch_internal::WaitWatchState& s = wait_watch_internal::WatchState();
    absl::MutexLock lock(&s.mu);
    struct Reached {
      wait_watch_internal::WaitWatchState* s;
      int64_t n;
      bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return s->waits >= n;
      }
    } reached{&s, n};
    return s.mu.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
};

}  // namespace fusionrl

#endif  // FUSIONRL_TESTS_SUPPORT_WAIT_WATCH_H_
