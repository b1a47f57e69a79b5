// A hand-moved Clock for tests.
#ifndef FUSIONRL_CORE_FAKE_CLOCK_H_
#define FUSIONRL_CORE_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

// A Clock whose time moves only when told to: Advance() and Set(). Starts
// at kStart (Unix second 1'000'000, 1970-01-12T13:46:40Z), so tests never
// depend on the date they run.
//
// Thread safety: every method may be called from any thread; Now() seen from
// another thread reflects every Advance()/Set() that returned before it.
class FakeClock : public Clock {
 public:
  static constexpr absl::Time kStart = absl::FromUnixSeconds(1'000'000);

  FakeClock() = default;
  explicit FakeClock(absl::Time start) : now_(start) {}

  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  // Moves time by `d`. A negative `d` moves it back (to test clock jumps).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = kStart;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_FAKE_CLOCK_H_
